// A DSH plugin the approval tests (test_dsh_approvals_e2e.py) load after loopdock's bridge plugin.
//
// - A tool policy: DSH's `tools/pre-execute` answers `ask` for a call of a tool named in
//   config.askTools, so DSH's own approval service asks a person (`ctx.approval.request`: it
//   logs `approval/asked`, runs the `approval/request` waterfall, logs `approval/decided`).
// - Another DSH answerer, after the bridge's in the `approval/request` waterfall (as DSH's web
//   panel or an ACP client is): a call whose arguments name `dsh-allows` it answers
//   `allowed-once` itself, `dsh-refuses` `rejected`; any other it passes on (headless DSH has no
//   answerer of its own: `unavailable`).
export const name = 'loopdock-approval-probe'
export const inject = ['agents', 'tools']

export function apply(ctx, config = {}) {
  const ask = new Set(config.askTools ?? [])
  ctx.on('tools/pre-execute', (exec, next) => {
    if (!ask.has(exec?.name)) return next()
    return { kind: 'ask', reason: `the probe asks before ${exec.name}` }
  })
  ctx.on('approval/request', (req, next) => {
    const call = JSON.stringify(lastCall(req) ?? '')
    if (call.includes('dsh-allows')) return Promise.resolve('allowed-once')
    if (call.includes('dsh-refuses')) return Promise.resolve('rejected')
    return next()
  })

  // the arguments of the tool call the request is about, from the agent's log
  function lastCall(req) {
    const session = req?.agent?.session
    let events = []
    try { events = session.snapshotEvents(0, session.seq) } catch { return undefined }
    for (let i = events.length - 1; i >= 0; i--) {
      const m = events[i].type === 'assistant/message' ? events[i].data?.message : undefined
      for (const b of m?.content ?? []) if (b?.type === 'tool-call' && b.id === req.callId) return b.arguments
    }
    return undefined
  }
}
