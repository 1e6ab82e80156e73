// A DSH plugin the fence tests (test_dsh_fences_e2e.py) load after loopdock's bridge plugin.
//
// - A later agent/pre-step listener: a claimed automatic message (config.ownedKinds) whose
//   text says `DOWNSTREAM <mode>` gets this answer from it, after the rest of the waterfall
//   answered: `pass` (that answer), `none` (undefined), `unknown` (an unknown kind),
//   `rewrite` (the message with other text), `drop` (without the message), `add` (with a
//   person's message added), `throw` (an error), `reject` (a veto), `command` (that answer,
//   after running `/fence-noop`, a command this plugin registers that does nothing).
// - Plugin-written input: when an automatic message whose text says `NUDGE` is inserted into
//   an agent's inbox, this plugin queues a followup of its own (source kind `fence-probe`).
// - A DSH command: when an automatic message whose text says `COMMAND` is inserted into an
//   agent's inbox, this plugin runs `/loopx-init` in that agent, as a person typing it would.
//
// Its pre-step listener is registered once the first agent exists, when the bridge plugin has
// registered its own: so it comes after the bridge's in DSH's waterfall (a listener before it
// would make the tests fail: the invalid answers would reach DSH unchecked).
import { randomUUID } from 'node:crypto'

export const name = 'loopdock-fence-probe'
export const inject = ['llm', 'agents', 'sessions', 'tools', 'systemPrompt', 'sessionProjections', 'commands']

const textOf = (m) => (m?.content ?? []).filter(b => b?.type === 'text').map(b => b.text).join('')

export function apply(ctx, config = {}) {
  const owned = new Set(config.ownedKinds ?? ['loopx-continuation'])
  const isOwned = (m) => owned.has(m?.source?.kind)

  const later = async (p, next) => {
    const mode = /DOWNSTREAM (\w+)/.exec((p.messages ?? []).filter(isOwned).map(textOf).join(' '))?.[1]
    if (mode === undefined) return next()
    const decision = await next()
    switch (mode) {
      case 'none': return undefined
      case 'unknown': return { ...decision, kind: 'admit' }
      case 'rewrite': return {
        ...decision,
        messages: decision.messages.map(m => isOwned(m) ? { ...m, content: [{ type: 'text', text: 'rewritten by a later listener' }] } : m),
      }
      case 'drop': return { ...decision, messages: decision.messages.filter(m => !isOwned(m)) }
      case 'add': return {
        ...decision,
        messages: [...decision.messages, {
          id: randomUUID(), role: 'user', content: [{ type: 'text', text: 'smuggled in by a later listener' }], source: { kind: 'user' },
        }],
      }
      case 'throw': throw new Error('a later listener failed')
      case 'reject': return { kind: 'reject' }
      case 'command':
        await ctx.commands.execute(p.agent, '/fence-noop', [], new AbortController().signal)
        return decision
      default: return decision
    }
  }
  ctx.effect(() => ctx.commands.register({
    name: 'fence-noop', description: 'does nothing (the fence tests)', handler: () => ({ kind: 'success', text: 'done' }),
  }), 'fence-probe: /fence-noop')
  let registered = false
  ctx.on('agent/created', () => {
    if (!registered) { registered = true; ctx.on('agent/pre-step', later) }
  })

  ctx.on('agent/inbox/inserted', (p) => {
    if (!isOwned(p.message) || !textOf(p.message).includes('COMMAND')) return
    ctx.commands.execute(p.agent, '/loopx-init', [], new AbortController().signal)
      .catch((e) => console.error('[fence-probe] /loopx-init failed', e?.message ?? e))
  })

  ctx.on('agent/inbox/inserted', (p) => {
    if (!isOwned(p.message) || !textOf(p.message).includes('NUDGE')) return
    p.agent.followup(Object.freeze({
      id: randomUUID(), role: 'user', content: [{ type: 'text', text: 'a plugin nudges the agent' }], source: { kind: 'fence-probe' },
    }))
  })
}
