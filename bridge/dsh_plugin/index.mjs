// loopdock's DSH plugin: the host side of the loopdock bridge (protocol 1, see bridge/_messages.py).
//
// - connects to config.url with config.token (hello, role dsh-host) and reconnects with backoff
//   (250 ms doubling to 5 s);
// - streams every session event and the live agent events to the runtime, batched; after every
//   (re)connection it asks the runtime how far its mirror of each tracked session reaches
//   (`mirrored`) and sends each session's log from the next seq on (from 0 if the runtime
//   cannot say: an older runtime answers UNKNOWN_TYPE), holding its queue until then;
// - executes the runtime's commands (followup, wake, cancel) on the exact live agent and answers
//   only the requests the runtime made (an ack after the live items the command caused);
// - at agent/pre-step asks the runtime for a verdict on messages of the kinds it owns
//   (config.ownedKinds), with a deadline, failing closed; on enter it checks what the rest of
//   DSH's waterfall answers and passes on only a valid decision (else it rejects); other
//   messages are never delayed;
// - dock mode (config.dock): takes DSH's agent-factory slot, re-hosts the official AgentLoop as
//   named drivers (config.drivers) and asks the runtime which loop/driver every create and resume uses;
//   a resume's `select` carries the binding stored in the session's own DSH log (the durable record:
//   a `plugin:loopdock/binding` record, see BINDING_RECORD);
// - registers DSH's `/loopx-init` command (config.loopxInit, default on): the runtime runs the
//   LoopX initialisation for the exact agent (`command` request, answered by `commandDone`) and
//   queues its start and result messages into that agent; a cancelled command gets no result
//   message;
// - registers the offline `ping` adapter (config.ping) for tests without an API key: it answers
//   `pong: <last user text>`; test hooks: HOLD holds the call until the runtime wakes the agent,
//   WAIT holds it (after streaming `pong: `) until a steer or inject reaches the agent's next step,
//   FOLLOWUP until a followup is queued for its next turn; all end when the turn is cancelled;
//   a line `call: <tool> <json>` makes it call that tool once (then it answers as usual);
//   config.runCommands runs DSH commands in created agents once
//   the runtime welcomed the plugin (as DSH's web UI does when a person types one).
import { randomUUID } from 'node:crypto'
import { isDeepStrictEqual } from 'node:util'
import { AgentLoop } from '/snapshot/node/node_modules/@deepseek-ai/dsh-agent-loop/lib/index.js'
import { appendPluginRecord } from '/snapshot/node/node_modules/@deepseek-ai/dsh-session/lib/index.js'

export const name = 'loopdock-bridge'
export const inject = ['llm', 'agents', 'sessions', 'tools', 'systemPrompt', 'sessionProjections', 'commands']

const PROTOCOL = 1
const BACKOFF_MIN_MS = 250
const BACKOFF_MAX_MS = 5000
const BATCH_ITEMS = 200
const BATCH_CHARS = 256 * 1024
const MAX_ITEM_CHARS = 900 * 1024 // the runtime accepts frames up to 1 MiB
const MAX_QUEUED = 50000
const FLUSH_MS = 10
// The binding lives in DSH's log as a plugin record (`appendPluginRecord`): an event marked
// `ignorable` that DSH's session reader keeps and skips, outside the model's view, so the session
// stays adoptable (verified: `dsh headless --session-id` and the SDK's resume). DSH reserves that
// function for its experimental packages and keeps such records across a future log-format
// migration only "best effort"; losing one would resume the session on its route or default loop.
// (On `agent-preset/selected`, where the dock first kept it, the headless runner refuses the
// session: it wants a non-empty agentPreset there and no preset at all. `loopdock dsh-migrate`
// moves such bindings; they are still read here.)
const BINDING_RECORD = 'plugin:loopdock/binding'
const BINDING_EVENT = 'agent-preset/selected'
const BINDING_KEY = 'agentLoopDock'
const INIT_COMMAND = 'loopx-init'
// the runtime's /loopx-init messages (actors/loopx/_init.py INIT_SOURCE_KIND)
const INIT_SOURCE_KIND = 'dsh-loopx-plugin/init-command'
// a private CLI install may take pip minutes: the runtime bounds it (600 s) and answers then
const INIT_TIMEOUT_MS = 15 * 60 * 1000
// DSH's own context messages, not input a person or a plugin wrote: the runtime context, the
// skill catalog, the project's agent instructions, the model-switch notice
const CONTEXT_KINDS = new Set(['runtime-context', 'skill-catalog', 'agent-instructions', 'model-selection'])

const log = (...args) => console.error('[loopdock]', ...args)

// The index of the last message a person or a producer (not DSH's context) put in, -1 if none.
function lastUserIndex(messages) {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]
    if (m?.role !== 'user' || CONTEXT_KINDS.has(m.source?.kind)) continue
    const t = (m.content || []).filter(b => b.type === 'text').map(b => b.text).join('')
    if (t && !t.startsWith('Current runtime context')) return i
  }
  return -1
}

function lastUserText(messages) {
  const i = lastUserIndex(messages)
  return i < 0 ? '' : (messages[i].content || []).filter(b => b.type === 'text').map(b => b.text).join('')
}

// The ping adapter's tool hook: `call: <tool> <json>` in the last user text, not yet answered.
function pendingToolCall(messages) {
  const i = lastUserIndex(messages)
  if (i < 0 || messages.slice(i + 1).some(m => m?.role === 'tool')) return undefined
  const match = /^call: (\S+) (.*)$/m.exec(lastUserText(messages))
  return match ? { name: match[1], arguments: match[2] } : undefined
}

// A JSON copy of a DSH value (messages and events are frozen plain data; this drops anything else).
function plain(value) {
  try { return JSON.parse(JSON.stringify(value ?? null)) } catch { return null }
}

// A session's whole log (DSH 0.2.1: `snapshotEvents(from, to)`; `log` as a fallback).
function sessionEvents(session, from = 0, to = session?.seq) {
  try {
    if (typeof session?.snapshotEvents === 'function') return session.snapshotEvents(from, to)
    if (Array.isArray(session?.log)) return session.log.filter(e => e.seq >= from && e.seq < (to ?? Infinity))
  } catch (e) { log('cannot read the session log back', e?.message ?? e) }
  return []
}

// Whether a user message in the agent's session log says `word`: true, false, or undefined
// while its log has no user message yet (DSH's runtime-context snapshots do not count).
function asked(agent, word) {
  let any
  for (const e of sessionEvents(agent?.session)) {
    if (e.type !== 'user/message') continue
    const m = e.data?.message ?? e.data
    if (m?.source?.kind === 'runtime-context') continue
    any = false
    if ((m?.content || []).some(b => b?.type === 'text' && typeof b.text === 'string' && b.text.includes(word))) return true
  }
  return any
}

// The loop dock's id grammar (loops and drivers alike).
const DOCK_ID = /^[a-z0-9][a-z0-9._-]*$/

// A binding as stored ({loop, driver?}), or undefined if it is malformed.
function parseBinding(value) {
  if (!value || typeof value !== 'object' || Array.isArray(value)) return undefined
  const { loop, driver } = value
  if (typeof loop !== 'string' || !DOCK_ID.test(loop)) return undefined
  if (driver !== undefined && driver !== null && (typeof driver !== 'string' || !DOCK_ID.test(driver))) return undefined
  return { loop, ...(typeof driver === 'string' ? { driver } : {}) }
}

// The newest valid binding among `events` (malformed ones are skipped), or undefined.
function newestBinding(events) {
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i]
    const binding = e?.type === BINDING_RECORD ? parseBinding(e.data)
      : e?.type === BINDING_EVENT ? parseBinding(e.data?.[BINDING_KEY]) : undefined
    if (binding) return binding
  }
  return undefined
}

function hasBinding(session) {
  return newestBinding(sessionEvents(session)) !== undefined
}

// A session's effective agent preset: the newest `agent-preset/selected` that names one, else
// the header's (DSH's own `agentPreset` projection follows every such event).
function effectivePreset(events, header) {
  for (let i = events.length - 1; i >= 0; i--) {
    const preset = events[i]?.type === BINDING_EVENT ? events[i].data?.agentPreset : undefined
    if (typeof preset === 'string' && preset) return preset
  }
  return typeof header?.agentPreset === 'string' && header.agentPreset ? header.agentPreset : undefined
}

// What a stored session says before a resume, read from DSH's own persistence (the factory's
// resume gets only the id: the driver loads the log later): its binding and its effective
// preset. A read handle takes no ownership; {} when the session or the service is not there.
async function storedSession(ctx, sessionId) {
  const persistence = ctx.get('sessionPersistence')
  if (!persistence || typeof sessionId !== 'string') return {}
  let handle
  try {
    handle = await persistence.open(sessionId, 'read')
    const events = (await handle.read(0)).events ?? []
    return { binding: newestBinding(events), agentPreset: effectivePreset(events, handle.header) }
  } catch (e) {
    log(`cannot read the stored session ${sessionId}:`, e?.message ?? e)
    return {}
  } finally {
    try { await handle?.close() } catch { /* a read handle owns nothing */ }
  }
}

// Why a pre-step `decision` from the rest of DSH's waterfall may not pass, or undefined if
// it may. DSH 0.2.1 ends the turn blocked on `kind: 'reject'` (passed on as it is) and
// otherwise enters `decision.messages` (no list fails the turn; an empty one at step 1 ends
// it without a model step). A valid enter is `{kind: 'enter', messages}` that carries every
// owned message of the claimed batch once and unchanged, the batch's other messages
// unchanged (or not at all), and nothing else but DSH's own context: an automatic message
// enters exactly as the runtime judged it, and with no input it did not see.
function invalidDecision(decision, claimed, ownedKinds) {
  if (decision === null || typeof decision !== 'object') {
    return `a later pre-step listener answered ${decision === null ? 'null' : typeof decision}`
  }
  if (decision.kind !== 'enter' || !Array.isArray(decision.messages)) {
    return `a later pre-step listener answered neither enter with messages nor reject (${String(decision.kind).slice(0, 40)})`
  }
  const batch = new Map(claimed.map(m => [m?.id, m]))
  const entered = new Set()
  for (const m of decision.messages) {
    const kind = m?.source?.kind
    if (CONTEXT_KINDS.has(kind)) continue
    const original = batch.get(m?.id)
    if (original === undefined) return `a later pre-step listener added a message (${String(kind).slice(0, 60)})`
    if (entered.has(m.id)) return `a later pre-step listener entered message ${m.id} twice`
    if (m !== original && !isDeepStrictEqual(m, original)) return `a later pre-step listener changed message ${m.id}`
    entered.add(m.id)
  }
  const dropped = claimed.find(m => ownedKinds.has(m?.source?.kind) && !entered.has(m.id))
  return dropped ? `a later pre-step listener dropped message ${dropped.id}` : undefined
}

class BridgeError extends Error {
  constructor(code, message) { super(`${code}: ${message}`); this.code = code }
}

export function apply(ctx, config = {}) {
  const ownedKinds = new Set(config.ownedKinds ?? ['loopx-continuation'])
  const verdictTimeoutMs = config.verdictTimeoutMs ?? 2000
  const selectTimeoutMs = config.selectTimeoutMs ?? 10000
  const mirroredTimeoutMs = config.mirroredTimeoutMs ?? 5000
  const dock = !!config.dock
  const answersApprovals = config.approvals !== false
  const capabilities = ['events', 'live', 'commands', 'pre-step', ...(dock ? ['dock'] : []), ...(answersApprovals ? ['approvals'] : [])]

  let ws = null
  let open = false // welcome received
  let disposed = false
  let backoff = BACKOFF_MIN_MS
  let reconnectTimer = null
  let flushTimer = null
  let nextId = 1
  let syncing = false // after a welcome, until the runtime said how far its mirror reaches
  let welcomes = 0 // counts welcomes: a sync goes on only on its own connection
  let runtimeAnswers = false // the runtime's welcome named `approvals`: it shows DSH's questions
  const deferredPongs = [] // pings that came while syncing: answered once the queue is sent
  const deferredAcks = [] // commands carried out while syncing: acknowledged once the queue is sent
  const deferredReplies = [] // other replies due while syncing: sent once the queue is sent
  let welcomed = null // resolves once, on the first welcome
  const firstWelcome = new Promise((resolve) => { welcomed = resolve })
  const pending = new Map() // our request id -> {resolve, reject, timer}
  const queue = [] // [kind, text, sessionId?] items waiting for a frame
  let droppedWarned = false

  // ---- the connection ------------------------------------------------------------------------
  const sendFrame = (obj) => {
    if (!ws || ws.readyState !== 1) return false
    try { ws.send(JSON.stringify({ v: PROTOCOL, ...obj })); return true } catch (e) { log('send failed', e?.message ?? e); return false }
  }

  const failPending = (why) => {
    for (const [id, p] of pending) { clearTimeout(p.timer); p.reject(new BridgeError('BRIDGE_CLOSED', why)) }
    pending.clear()
  }

  const request = (type, data, timeoutMs) => new Promise((resolve, reject) => {
    if (!open) { reject(new BridgeError('BRIDGE_CLOSED', 'not connected to the loopdock runtime')); return }
    const id = `h${nextId++}`
    const timer = setTimeout(() => { pending.delete(id); reject(new BridgeError('REQUEST_TIMEOUT', `no reply to ${type} within ${timeoutMs} ms`)) }, timeoutMs)
    pending.set(id, { resolve, reject, timer })
    if (!sendFrame({ type, id, data })) {
      clearTimeout(timer); pending.delete(id); reject(new BridgeError('BRIDGE_CLOSED', 'the connection is closing'))
    }
  })

  // resolves once connected (welcomed), or rejects after timeoutMs: a select made while DSH boots
  // (the headless agent is created before the first welcome) waits for the runtime
  const openWaiters = new Set()
  const whenOpen = (timeoutMs) => open ? Promise.resolve() : new Promise((resolve, reject) => {
    const waiter = () => { clearTimeout(timer); openWaiters.delete(waiter); resolve() }
    const timer = setTimeout(() => { openWaiters.delete(waiter); reject(new BridgeError('BRIDGE_CLOSED', `not connected to the loopdock runtime within ${timeoutMs} ms`)) }, timeoutMs)
    openWaiters.add(waiter)
  })

  const connect = () => {
    reconnectTimer = null
    if (disposed) return
    let sock
    try { sock = new WebSocket(config.url) } catch (e) { log('cannot connect', e?.message ?? e); scheduleReconnect(); return }
    ws = sock
    sock.onopen = () => {
      sendFrame({ type: 'hello', data: { token: config.token, role: 'dsh-host', protocol: PROTOCOL, capabilities } })
    }
    sock.onmessage = (ev) => {
      if (sock !== ws) return
      let frame
      try { frame = JSON.parse(typeof ev.data === 'string' ? ev.data : String(ev.data)) } catch { log('a frame that is not JSON from the runtime'); return }
      onFrame(frame)
    }
    sock.onerror = () => {} // onclose follows and says what matters
    sock.onclose = (ev) => {
      if (sock !== ws) return
      const wasOpen = open
      open = false
      ws = null
      syncing = false
      deferredPongs.length = 0
      deferredAcks.length = 0
      deferredReplies.length = 0
      failPending(`connection closed (${ev.code})`)
      if (disposed) return
      if (wasOpen || ev.code !== 1006) log(`bridge closed (${ev.code}${ev.reason ? ' ' + ev.reason : ''}); reconnecting`)
      scheduleReconnect()
    }
  }

  const scheduleReconnect = () => {
    if (disposed || reconnectTimer) return
    const delay = backoff
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS)
    reconnectTimer = setTimeout(connect, delay)
  }

  ctx.effect(() => () => {
    disposed = true
    clearTimeout(reconnectTimer); reconnectTimer = null
    clearTimeout(flushTimer); flushTimer = null
    for (const h of holds.splice(0)) h()
    for (const key of [...waits.keys()]) releaseWaits(key)
    // unloading mid-sync: what the runtime lacks is unknown, so every log goes from seq 0
    if (syncing) { syncing = false; resend(new Map(tracked), {}) }
    failPending('DSH is unloading the bridge plugin')
    openWaiters.clear() // their timers reject them
    open = false
    const sock = ws
    ws = null
    if (sock) { try { if (sock.readyState === 1) flush(sock); sock.close(1000, 'dsh unloading') } catch (e) { log('close failed', e?.message ?? e) } }
  }, 'loopdock bridge websocket')

  // ---- incoming frames ----------------------------------------------------------------------
  const reply = (re, type, data) => sendFrame({ type, re, data })
  const replyError = (re, code, message) => sendFrame({ type: 'error', ...(re ? { re } : {}), data: { code, message: String(message).slice(0, 1000) } })

  function onFrame(frame) {
    if (!frame || typeof frame !== 'object' || frame.v !== PROTOCOL) { log('a frame of another protocol from the runtime', JSON.stringify(frame)?.slice(0, 200)); return }
    const { type, id, re, data } = frame
    if (typeof re === 'string') { // a reply to one of our requests
      const p = pending.get(re)
      if (!p) return
      pending.delete(re); clearTimeout(p.timer)
      if (type === 'error') p.reject(new BridgeError(data?.code ?? 'ERROR', data?.message ?? ''))
      else p.resolve({ type, data })
      return
    }
    switch (type) {
      case 'welcome':
        open = true
        runtimeAnswers = answersApprovals && (data?.capabilities ?? []).includes('approvals')
        backoff = BACKOFF_MIN_MS
        welcomed()
        for (const w of [...openWaiters]) w()
        sync().catch((e) => { log('resending after a reconnection failed', e?.message ?? e); syncing = false; release() })
        return
      case 'error':
        log(`runtime error ${data?.code}: ${data?.message}`)
        return
      case 'ping':
        // a barrier: everything queued before the ping goes out before its pong (while
        // syncing, the pong waits for the queue)
        if (syncing) { if (id) deferredPongs.push(id); return }
        if (ws) flush(ws)
        if (id) reply(id, 'pong', {})
        return
      case 'approval':
        if (!id) { replyError(undefined, 'BAD_ENVELOPE', 'approval is a request: it needs an id'); return }
        answerApproval(id, data ?? {})
        return
      case 'followup': case 'wake': case 'cancel':
        if (!id) { replyError(undefined, 'BAD_ENVELOPE', `${type} is a request: it needs an id`); return }
        try { command(type, data ?? {}) } catch (e) {
          if (e instanceof BridgeError && e.code === 'BAD_DATA') replyError(id, 'BAD_DATA', e.message)
          else reply(id, 'ack', { ok: false, error: { code: e?.code ?? 'COMMAND_FAILED', message: String(e?.message ?? e).slice(0, 1000) } })
          return
        }
        acknowledge(id)
        return
      default:
        if (id) replyError(id, 'UNKNOWN_TYPE', `the DSH host does not serve ${String(type).slice(0, 100)}`)
        else log('an unexpected frame from the runtime:', String(type).slice(0, 100))
    }
  }

  function liveAgent(agentId) {
    if (typeof agentId !== 'string') throw new BridgeError('BAD_DATA', 'agentId must be a string')
    const agent = ctx.agents.get(agentId)
    if (!agent) throw new BridgeError('NOT_LIVE', `no live agent ${agentId}`)
    return agent
  }

  function command(type, data) {
    if (type === 'followup') {
      const m = data.message
      if (!m || typeof m !== 'object' || typeof m.source?.kind !== 'string') throw new BridgeError('BAD_DATA', 'followup needs a message with a source kind')
      if (m.source.kind === INIT_SOURCE_KIND && m.source.phase === 'result' && cancelledInits.delete(data.agentId)) {
        throw new BridgeError('CANCELLED', 'the /loopx-init it reports on was cancelled')
      }
      const placement = data.placement ?? 'followup'
      if (!['followup', 'steer', 'inject'].includes(placement)) throw new BridgeError('BAD_DATA', `unknown placement ${placement}`)
      const agent = liveAgent(data.agentId)
      if (ownedKinds.has(m.source.kind)) {
        const why = fenced(agent)
        if (why) throw new BridgeError('FENCED', why)
      }
      agent[placement](Object.freeze({ ...m, id: m.id ?? randomUUID(), role: m.role ?? 'user' }))
    } else if (type === 'wake') {
      const agent = liveAgent(data.agentId)
      // the ping test adapter: a wake is the runtime saying "go on", unless the woken agent
      // is known not to hold (the runtime woke another agent); without it nothing holds, so
      // the session log is not scanned
      if (config.ping && asked(agent, 'HOLD') !== false) releaseHolds()
      agent.wakeDriver()
    } else {
      // DSH's cancel causes are user | parent | hook | disposed: the runtime's cancel is a
      // plugin's (a hook's), and only a hook cause keeps its reason in the turn/end DSH logs
      liveAgent(data.agentId).cancel({ kind: 'hook', reason: String(data.cause ?? 'loopdock') }, { keepInbox: data.keepInbox !== false })
    }
  }

  // ---- outgoing event traffic (batched) --------------------------------------------------------
  const sent = new Map() // session id -> highest seq queued
  const tracked = new Map() // session id -> its session (for a resend after a reconnection)

  function enqueue(kind, item, sessionId) {
    let text
    try { text = JSON.stringify(item) } catch (e) { log(`a ${kind} item is not JSON`, e?.message ?? e); return }
    if (text.length > MAX_ITEM_CHARS) { log(`a ${kind} item of ${text.length} characters is too large for a frame; dropped`); return }
    if (queue.length >= MAX_QUEUED) {
      queue.shift()
      if (!droppedWarned) { droppedWarned = true; log('the event queue is full while disconnected: dropping the oldest items') }
    }
    queue.push([kind, text, sessionId])
    schedule(FLUSH_MS)
  }

  function schedule(ms) {
    if (!open || syncing || flushTimer || disposed) return
    flushTimer = setTimeout(() => { flushTimer = null; if (ws && open && !syncing) flush(ws) }, ms)
  }

  function flush(sock) {
    while (queue.length > 0 && sock.readyState === 1) {
      const kind = queue[0][0]
      const items = []
      let size = 0
      while (queue.length > 0 && queue[0][0] === kind && items.length < BATCH_ITEMS && (items.length === 0 || size + queue[0][1].length < BATCH_CHARS)) {
        const [, text] = queue.shift()
        items.push(text); size += text.length + 1
      }
      sock.send(`{"v":${PROTOCOL},"type":"${kind}","data":{"items":[${items.join(',')}]}}`)
    }
  }

  function sendOne(sessionId, event) {
    enqueue('events', { sessionId, event: { type: event.type, seq: event.seq, time: event.time, data: plain(event.data) ?? {} } }, sessionId)
  }
  // In seq order, each event once: events appended before publication (e.g. the binding a setup
  // records) never reach session/event, so a gap is filled from the session's own log first.
  function sendEvent(session, event) {
    const sessionId = session.id
    if (typeof event?.seq !== 'number') { sendOne(sessionId, event); return }
    tracked.set(sessionId, session)
    const last = sent.get(sessionId) ?? -1
    if (event.seq <= last) return
    if (event.seq > last + 1) for (const earlier of sessionEvents(session, last + 1, event.seq)) sendOne(sessionId, earlier)
    sent.set(sessionId, event.seq)
    sendOne(sessionId, event)
  }
  // Every (re)connection gets each tracked session's log from the seq after the last one the
  // runtime mirrors (`seqs`, session id -> last seq; from 0 for a session it does not name), in
  // place of what is queued for it: what was in flight when a connection broke, or queued for a
  // runtime that restarted, is not lost, and what the runtime has is not sent again. A log that
  // cannot be read back keeps what is queued instead. `sessions`: id -> session, those asked about.
  function resend(sessions, seqs) {
    const resent = new Map() // session id -> first seq to send
    for (const [sessionId, session] of sessions) {
      if (tracked.get(sessionId) !== session || typeof session.seq !== 'number') continue // disposed meanwhile
      const last = Object.hasOwn(seqs, sessionId) ? seqs[sessionId] : undefined
      const from = Math.min(Number.isInteger(last) && last >= 0 ? last + 1 : 0, session.seq)
      if (sessionEvents(session, from, session.seq).length === session.seq - from) resent.set(sessionId, from)
    }
    if (resent.size === 0) return
    let kept = 0
    for (const item of queue) if (!(item[0] === 'events' && resent.has(item[2]))) queue[kept++] = item
    queue.length = kept
    for (const [sessionId, from] of resent) {
      const session = tracked.get(sessionId)
      sent.set(sessionId, from - 1)
      for (const e of sessionEvents(session, from, session.seq)) sendEvent(session, e)
    }
  }
  // After a welcome: ask how far the runtime's mirror reaches, hold the queue (events and live
  // items alike, so nothing overtakes what is resent) until the answer, resend, then flush.
  async function sync() {
    const welcome = ++welcomes
    const sessions = new Map(tracked)
    let seqs = {}
    const sessionIds = [...sessions.keys()]
    if (sessions.size > 0) {
      syncing = true
      try {
        // (a question too large for a frame is not asked: every log goes from seq 0)
        if (JSON.stringify(sessionIds).length > MAX_ITEM_CHARS) throw new BridgeError('TOO_LARGE', `${sessionIds.length} sessions`)
        const r = await request('mirrored', { sessionIds }, mirroredTimeoutMs)
        const answer = r.type === 'mirroredSeqs' ? r.data?.seqs : undefined
        if (answer && typeof answer === 'object' && !Array.isArray(answer)) seqs = answer
        else log(`unexpected answer to mirrored: ${r.type}; sending every session from seq 0`)
      } catch (e) {
        if (welcome === welcomes && open) log(`the runtime cannot say what it mirrors (${e?.message ?? e}); sending every session from seq 0`)
      }
      if (welcome !== welcomes || !open || !syncing) return // closed (or unloaded) meanwhile: the next welcome syncs
      syncing = false
      resend(sessions, seqs)
    }
    release()
  }
  // the end of a sync: send what is queued, then the pongs and acks that waited for it
  function release() {
    if (!open) return
    if (ws) flush(ws)
    for (const id of deferredPongs.splice(0)) reply(id, 'pong', {})
    for (const id of deferredAcks.splice(0)) reply(id, 'ack', { ok: true })
    for (const send of deferredReplies.splice(0)) send()
    schedule(0)
  }
  // a command's ack goes out after the live items its effect queued (the message it put into
  // an inbox, ...), as a pong does: once the runtime reads the ack, its mirror shows the effect
  function acknowledge(id) {
    if (syncing) { deferredAcks.push(id); return }
    if (ws) flush(ws)
    reply(id, 'ack', { ok: true })
  }
  function backfill(session) {
    if (!session || typeof session.seq !== 'number' || session.seq === 0) return
    const events = sessionEvents(session, session.seq - 1, session.seq)
    if (events.length > 0) sendEvent(session, events[0])
  }
  const sendLive = (type, agent, data) => {
    if (!agent?.id) return
    enqueue('live', { type, agentId: agent.id, data: plain(data) ?? {} })
  }

  ctx.on('session/event', (session, event) => sendEvent(session, event))
  ctx.on('agent/created', (p) => {
    backfill(p.agent?.session)
    // the header's cwd (the session's project) and how many events a seeded session copied
    const s = p.agent?.session
    sendLive('agent/created', p.agent, {
      source: p.source, sessionId: s?.id,
      ...(typeof s?.header?.cwd === 'string' ? { cwd: s.header.cwd } : {}),
      ...(Number.isInteger(s?.inheritedEventCount) ? { inheritedEvents: s.inheritedEventCount } : {}),
    })
  })
  ctx.on('agent/status', (p) => sendLive('agent/status', p.agent, { status: p.status }))
  for (const n of ['inserted', 'claimed', 'discarded']) {
    ctx.on(`agent/inbox/${n}`, (p) => {
      // A listener that took the message out again while DSH was still announcing it (a
      // nested splice: e.g. competing input a plugin queued in reply withdraws it) had its
      // discard sent already: announcing it now would leave the runtime's mirror of the
      // inbox holding a message DSH no longer has.
      if (n === 'inserted' && !queued(p.agent).some(m => m?.id === p.message?.id)) return
      sendLive(`agent/inbox/${n}`, p.agent, { message: p.message, ...(p.turn !== undefined ? { turn: p.turn } : {}) })
    })
  }
  ctx.on('agent/disposed', (p) => { sendLive('agent/disposed', p.agent, {}); if (p.agent?.id) { rewake.delete(p.agent.id); sent.delete(p.agent.session?.id ?? p.agent.id); tracked.delete(p.agent.session?.id ?? p.agent.id) } })

  // ---- fences: what an automatic message must not get past -----------------------------------
  // Input a person or a plugin writes into an agent's inbox (anything but an owned kind and
  // DSH's own context) competes with an automatic message and wins, as a person's input does
  // on the runtime's own agents: an automatic message still queued is withdrawn when it
  // arrives (DSH logs the discard, and the runtime retires the reservation), the runtime's
  // followup of one is refused while such input waits, and a pre-step that finds it in its
  // batch, waiting, or arriving while the step is judged is rejected.
  // A DSH command (a person's `/name`, `/loopx-init`, ...) is a fence too: DSH logs its
  // `command/run` before its handler runs and its `command/done` after. No automatic message
  // is admitted across one: one still queued when it starts is withdrawn, the runtime's
  // followup of one is refused while it runs, and a pre-step it runs during, or that one
  // starts in while the step is judged, is rejected.
  const competing = (m) => !ownedKinds.has(m?.source?.kind) && !CONTEXT_KINDS.has(m?.source?.kind)
  const queued = (agent) => [...(agent?.inbox?.nextStep ?? []), ...(agent?.inbox?.nextTurn ?? [])]
  const arrivals = new WeakMap() // session -> how often competing input arrived in its agent's inbox
  const arrivalsOf = (session) => arrivals.get(session) ?? 0
  const commands = new WeakMap() // session -> {started: how many commands started in it, running: their ids}
  const commandsOf = (session) => commands.get(session) ?? { started: 0, running: new Set() }
  const agentOf = new WeakMap() // session -> the agent it was last seen with (a replaced session keeps its agent's id)
  for (const type of ['agent/created', 'agent/status']) ctx.on(type, (p) => { if (p.agent?.session) agentOf.set(p.agent.session, p.agent) })
  function withdrawQueued(agent) {
    for (const m of queued(agent)) {
      if (!ownedKinds.has(m?.source?.kind)) continue
      try { agent.inbox.remove(m.id) } catch (e) { log('could not withdraw a queued automatic message', e?.message ?? e) }
    }
  }
  // why an automatic message may not go on in `agent` now, or undefined
  function fenced(agent) {
    if (ctx.agents.get(agent?.id) !== agent) return 'the agent is not live'
    if (queued(agent).some(competing)) return 'input a person or a plugin wrote is waiting'
    if (commandsOf(agent.session).running.size > 0) return 'a command is running in the agent'
    return undefined
  }
  ctx.on('agent/inbox/inserted', (p) => {
    const session = p.agent?.session
    if (!session || !competing(p.message)) return
    arrivals.set(session, arrivalsOf(session) + 1)
    withdrawQueued(p.agent)
  })
  ctx.on('session/event', (session, event) => {
    if (event?.type !== 'command/run' && event?.type !== 'command/done') return
    const state = commandsOf(session)
    commands.set(session, state)
    if (event.type === 'command/done') { state.running.delete(event.data?.commandId); return }
    state.started += 1
    state.running.add(event.data?.commandId)
    // (not while DSH publishes the append: a session refuses to append meanwhile)
    const agent = agentOf.get(session) ?? ctx.agents.get(session.id)
    if (agent?.session === session) queueMicrotask(() => withdrawQueued(agent))
  })

  // ---- pre-step verdicts ----------------------------------------------------------------------
  const rewake = new Set() // agents whose put-back input must run once they are idle
  ctx.on('agent/status', (p) => {
    if (p.status !== 'idle' || !rewake.has(p.agent?.id)) return
    rewake.delete(p.agent.id)
    queueMicrotask(() => { try { if (p.agent.inbox?.hasPending !== false) p.agent.wakeDriver() } catch (e) { log('re-wake failed', e?.message ?? e) } })
  })

  // The runtime's verdict comes first, then the rest of DSH's waterfall (the listeners after
  // this one, and DSH's own innermost step): what they answer is checked before it is passed
  // on (invalidDecision), and anything else fails closed.
  ctx.on('agent/pre-step', async (p, next) => {
    const messages = p.messages ?? []
    const owned = messages.filter(m => ownedKinds.has(m?.source?.kind))
    if (owned.length === 0) return next() // never delayed
    const agent = p.agent
    const session = agent.session
    const arrived = arrivalsOf(session)
    const started = commandsOf(session).started
    // the fences on DSH's live state (the runtime may not have seen it yet): before the runtime
    // is asked, and again after every wait
    const moved = () => fenced(agent)
      ?? (agent.session !== session ? 'the agent has another session' : undefined)
      ?? (arrivalsOf(session) !== arrived ? 'input a person or a plugin wrote arrived meanwhile' : undefined)
      ?? (commandsOf(session).started !== started ? 'a command ran in the agent meanwhile' : undefined)
    let why = (messages.some(competing) ? 'input a person or a plugin wrote is in this step' : undefined)
      ?? moved() ?? await askRuntime(p, messages) ?? moved()
    if (why === undefined) {
      let decision
      try {
        decision = await next()
      } catch (e) {
        if (p.signal?.aborted) throw e // the turn was cancelled: DSH ends it aborted
        why = `a later pre-step listener failed: ${e?.message ?? e}`
      }
      if (why === undefined) {
        if (decision?.kind === 'reject') return decision // a later veto: DSH ends the turn blocked
        why = invalidDecision(decision, messages, ownedKinds) ?? moved()
        if (why === undefined) return decision
      }
      log(`pre-step of ${p.agent.id}: ${why}; rejected`)
    }
    // a reject consumes the whole claimed batch: put back what the runtime does not own
    const others = messages.filter(m => !ownedKinds.has(m?.source?.kind))
    if (others.length > 0) {
      try {
        for (let i = others.length - 1; i >= 0; i--) p.agent.inbox.prepend('next-step', others[i])
        rewake.add(p.agent.id)
      } catch (e) { log('could not put back input after a reject', e?.message ?? e) }
    }
    return { kind: 'reject' }
  })
  // The runtime's verdict on a claimed batch: undefined to enter, else why not (failing closed).
  async function askRuntime(p, messages) {
    // what the claim changed in the inbox reaches the runtime before the question
    if (ws && open && !syncing) flush(ws)
    try {
      const r = await request('preStep', {
        agentId: p.agent.id, sessionId: p.agent.session?.id ?? p.agent.id, turn: p.turn, step: p.step,
        messages: messages.map(plain),
      }, verdictTimeoutMs)
      if (r.type !== 'verdict') return `unexpected ${r.type}`
      return r.data?.kind === 'enter' ? undefined : String(r.data?.reason ?? 'rejected')
    } catch (e) {
      return String(e?.message ?? e)
    }
  }

  // ---- approvals: DSH's own questions, answered from the runtime's surfaces too ------------------
  // DSH asks a person through its approval service (`ctx.approval.request`, package
  // @deepseek-ai/dsh-user-approval): it logs `approval/asked {id, toolName, callId?, reason?}`,
  // runs the `approval/request` waterfall (DSH's answerers: the web UI's panel, an ACP client's
  // session/request_permission; none in headless or sdk: `unavailable`, fail closed), then logs
  // `approval/decided {id, outcome}`. This listener goes first in that waterfall: for an agent of
  // this host, while the runtime is connected and shows DSH's questions (its welcome named
  // `approvals`), it holds the question open for the runtime's `approval` request and passes it on
  // to the rest of DSH's answerers at the same time. The first real outcome wins (a runtime
  // answer, or another answerer's outcome other than `unavailable`); the runtime's answer that
  // comes second gets APPROVAL_CLOSED. DSH's outcomes carry no reason, and DSH cannot take back a
  // question it passed on (an ACP client's request, the web panel): its late answer is ignored.
  const questions = new Map() // DSH approval id -> {agentId, settle(outcome), replies: [fn]}
  function askedId(session, req) {
    const events = sessionEvents(session, Math.max(0, (session?.seq ?? 0) - 200))
    const decided = new Set(events.filter(e => e.type === 'approval/decided').map(e => e.data?.id))
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i]
      if (e.type !== 'approval/asked' || decided.has(e.data?.id) || questions.has(e.data?.id)) continue
      if (e.data?.toolName === req.toolName && e.data?.callId === req.callId) return e.data.id
    }
    return undefined
  }
  if (answersApprovals) {
    ctx.on('approval/request', (req, next) => {
      const agent = req?.agent
      if (disposed || !open || !runtimeAnswers || !agent || ctx.agents.get(agent.id) !== agent) return next()
      const approvalId = askedId(agent.session, req)
      if (typeof approvalId !== 'string') return next()
      return new Promise((resolve) => {
        const question = { agentId: agent.id, replies: [] }
        const onAbort = () => question.settle('cancelled')
        question.settle = (outcome) => {
          if (questions.get(approvalId) !== question) return false
          questions.delete(approvalId)
          req.signal?.removeEventListener('abort', onAbort)
          resolve(outcome)
          // DSH logs `approval/decided` as soon as the waterfall returns (microtasks): the
          // runtime's answer is acknowledged after it, so that its mirror shows the decision
          setTimeout(() => { for (const send of question.replies) send() }, 0)
          return true
        }
        questions.set(approvalId, question)
        if (req.signal?.aborted) { onAbort(); return }
        req.signal?.addEventListener('abort', onAbort, { once: true })
        Promise.resolve().then(next).then((outcome) => {
          if (outcome !== 'unavailable') question.settle(outcome)
        }, (e) => log(`an approval answerer after loopdock's failed: ${e?.message ?? e}`))
      })
    }, true) // prepended: the first listener, so the question is held whoever else answers
    ctx.effect(() => () => {
      for (const question of [...questions.values()]) question.settle('unavailable')
    }, 'loopdock: open approval questions')
  }
  // The runtime answers a question: `approvalDone` once DSH logged the decision, else
  // APPROVAL_CLOSED (answered already on any surface, cancelled, or not held here).
  function answerApproval(re, data) {
    const { agentId, approvalId, decision } = data
    if (typeof agentId !== 'string' || typeof approvalId !== 'string' || !['approve', 'refuse'].includes(decision)) {
      replyError(re, 'BAD_DATA', 'approval needs an agentId, an approvalId and a decision (approve or refuse)')
      return
    }
    const question = questions.get(approvalId)
    if (!question || question.agentId !== agentId) {
      replyError(re, 'APPROVAL_CLOSED', `approval ${approvalId.slice(0, 64)} of agent ${agentId.slice(0, 128)} is not open on this DSH host: answered already (on any surface), cancelled, or not held here`)
      return
    }
    question.replies.push(() => {
      const send = () => { if (ws) flush(ws); reply(re, 'approvalDone', { agentId, approvalId, decision }) }
      if (syncing) deferredReplies.push(send)
      else send()
    })
    question.settle(decision === 'approve' ? 'allowed-once' : 'rejected')
  }

  // ---- /loopx-init: run by the runtime for the exact agent ----------------------------------------
  const cancelledInits = new Set() // agents whose /loopx-init was cancelled: no result message
  // `promise`, or a rejection as soon as `signal` aborts
  const abortable = (promise, signal) => new Promise((resolve, reject) => {
    const abort = () => reject(new BridgeError('CANCELLED', 'cancelled'))
    if (signal?.aborted) { abort(); return }
    signal?.addEventListener('abort', abort, { once: true })
    promise.then((v) => { signal?.removeEventListener('abort', abort); resolve(v) },
      (e) => { signal?.removeEventListener('abort', abort); reject(e) })
  })
  async function runInit(invocation) {
    const agentId = invocation.agent?.id
    if (typeof agentId !== 'string') return { kind: 'error', text: '/loopx-init needs an agent' }
    cancelledInits.delete(agentId)
    if (ws) flush(ws) // the runtime must know the agent (its agent/created) before the request
    let r
    try {
      r = await abortable(request('command', { agentId, name: INIT_COMMAND, args: invocation.rawInput ?? '' },
        config.initTimeoutMs ?? INIT_TIMEOUT_MS), invocation.signal)
    } catch (e) {
      if (invocation.signal?.aborted) { cancelledInits.add(agentId); return { kind: 'error', text: '/loopx-init was cancelled' } }
      const why = e?.code === 'BRIDGE_CLOSED' ? 'the loopdock runtime is not connected' : `${e?.code ?? 'ERROR'}`
      return { kind: 'error', text: `/loopx-init could not run: ${why}` }
    }
    const done = r.type === 'commandDone' ? r.data ?? {} : { ok: false, message: `unexpected ${r.type}` }
    const text = String(done.message ?? '').slice(0, 2000)
    return done.ok === true ? { kind: 'success', text } : { kind: 'error', text: text || '/loopx-init failed' }
  }
  if (config.loopxInit !== false) {
    ctx.effect(() => ctx.commands.register({
      name: INIT_COMMAND,
      description: 'Check or install the LoopX CLI and the DSH workflow skills (takes no arguments)',
      handler: (invocation) => runInit(invocation),
    }), 'loopdock: /loopx-init')
  }

  // ---- the offline ping adapter -----------------------------------------------------------------
  const holds = []
  let holdsReleased = false
  function releaseHolds() { holdsReleased = true; for (const h of holds.splice(0)) h() }
  // WAIT and FOLLOWUP steps, per agent and inbox lane: released by input for the agent's next
  // step (a steer or an inject: `nextStep`) or its next turn (a followup: `nextTurn`)
  const waits = new Map() // `${lane} ${agent id}` -> Set of release functions
  function releaseWaits(key) {
    const set = waits.get(key)
    waits.delete(key)
    for (const release of set ?? []) release()
  }
  ctx.on('agent/inbox/inserted', (p) => {
    for (const lane of ['nextStep', 'nextTurn']) {
      const key = `${lane} ${p.agent?.id}`
      if (p.agent?.id && waits.has(key) && (p.agent.inbox?.[lane]?.length ?? 0) > 0) releaseWaits(key)
    }
  })
  // `promise`, or a rejection as soon as `signal` aborts (a cancelled turn must not wait on the
  // test hooks: DSH checks its signal only between stream chunks); `forget` undoes the waiting
  const released = (promise, signal, forget) => new Promise((resolve, reject) => {
    const abort = () => { forget?.(); reject(Object.assign(new Error('the turn was cancelled'), { name: 'AbortError' })) }
    if (signal?.aborted) { abort(); return }
    signal?.addEventListener('abort', abort, { once: true })
    promise.then((value) => { signal?.removeEventListener('abort', abort); resolve(value) })
  })
  if (config.ping) {
    const pingAdapter = {
      providerInfo: (p) => ({ id: p, name: p }),
      providerRetryPolicy: () => undefined,
      imageRequestPricing: () => undefined,
      imageRequestTarget: (_p, _m, image) => ({ width: image.width, height: image.height, maxBytes: image.bytes }),
      listModels: async () => [{ provider: 'ping', id: 'ping-1', name: 'ping-1' }],
      resolveModel: async (provider, model) => ({ provider, id: model, name: model }),
      async prepareCall(provider, model, signal) {
        return { model: await this.resolveModel(provider, model, signal), stream: (o) => this.stream(o) }
      },
      async *stream(options) {
        const last = lastUserText(options.messages || [])
        // the test hooks hold the agents' own model calls only (not, e.g., DSH's session-title
        // calls, which carry a `purpose`), and a cancelled turn ends them
        const hooked = options.purpose === undefined
        // test hook: a task holding HOLD keeps `dsh headless` alive until the runtime wakes
        // that agent (waking other agents meanwhile does not release it)
        if (hooked && last.includes('HOLD') && !holdsReleased && !disposed) {
          let hold
          await released(new Promise((resolve) => { hold = resolve; holds.push(resolve) }), options.signal,
            () => { const i = holds.indexOf(hold); if (i >= 0) holds.splice(i, 1) })
        }
        const call = hooked ? pendingToolCall(options.messages || []) : undefined
        if (call) {
          const id = `ping-call-${randomUUID()}`
          yield { type: 'block-start', index: 0, blockType: 'tool-call' }
          yield { type: 'tool-call-delta', index: 0, id, name: call.name, argumentsDelta: call.arguments }
          yield { type: 'block-end', index: 0, block: { type: 'tool-call', id, name: call.name, arguments: call.arguments } }
          yield { type: 'usage', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } }
          yield { type: 'finish', reason: { kind: 'tool-calls' } }
          return
        }
        const text = 'pong: ' + last
        yield { type: 'block-start', index: 0, blockType: 'text' }
        // test hooks: a step whose user text says WAIT streams `pong: ` and then waits for input
        // to its agent's next step (a steer or an inject); FOLLOWUP, for a message queued for its
        // next turn (a followup); either ends when the turn is cancelled
        const agentId = options.sessionId
        const lane = last.includes('WAIT') ? 'nextStep' : last.includes('FOLLOWUP') ? 'nextTurn' : undefined
        const queued = () => ctx.agents.get(agentId)?.inbox?.[lane]?.length ?? 0
        if (hooked && lane && typeof agentId === 'string' && !disposed && queued() === 0) {
          yield { type: 'text-delta', index: 0, text: 'pong: ' }
          let release
          const key = `${lane} ${agentId}`
          const set = waits.get(key) ?? new Set()
          waits.set(key, set)
          await released(new Promise((resolve) => { release = resolve; set.add(resolve) }), options.signal,
            () => { set.delete(release); if (set.size === 0 && waits.get(key) === set) waits.delete(key) })
          yield { type: 'text-delta', index: 0, text: last }
        } else {
          yield { type: 'text-delta', index: 0, text }
        }
        yield { type: 'block-end', index: 0, block: { type: 'text', text } }
        yield { type: 'usage', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } }
        yield { type: 'finish', reason: { kind: 'stop' } }
      },
    }
    ctx.llm.registerAdapter(['ping'], pingAdapter)
  }

  // ---- dock mode: the factory slot --------------------------------------------------------------
  if (dock) {
    const names = config.drivers?.length ? config.drivers : ['default']
    const drivers = {}
    const shadow = (service, overrides) => new Proxy(service, {
      get(target, key) {
        if (Object.hasOwn(overrides, key)) return overrides[key]
        const v = Reflect.get(target, key, target)
        return typeof v === 'function' ? v.bind(target) : v
      },
    })
    names.forEach((driverName, index) => {
      let captured
      const props = { agents: shadow(ctx.agents, { setFactory: (factory) => { captured = factory; return () => { captured = undefined } } }) }
      if (index > 0) {
        // the first AgentLoop made the shared registrations; re-registering them throws
        props.systemPrompt = shadow(ctx.systemPrompt, { variable: () => () => {} })
        props.sessionProjections = shadow(ctx.sessionProjections, { register: () => () => {} })
      }
      const base = index === 0 ? ctx : ctx.isolate('agentLoop', `loopdock-${driverName}`)
      new AgentLoop(base.extend(props), { agents: [], maxParallelToolCalls: { get: () => 10 } })
      if (!captured) throw new Error(`loopdock: AgentLoop for driver ${driverName} did not register a factory`)
      drivers[driverName] = captured
    })

    const select = async (op, sessionId, agentOptions, agentPreset) => {
      let r
      try {
        const started = Date.now()
        // a resume carries the binding DSH's log holds (the runtime may not remember it) and
        // the session's effective preset (the dock's preset routes)
        const stored = op === 'resume' ? await storedSession(ctx, sessionId) : {}
        const binding = stored.binding
        agentPreset = agentPreset ?? stored.agentPreset
        await whenOpen(Math.max(1, selectTimeoutMs - (Date.now() - started)))
        r = await request('select', {
          op, sessionId, agentOptions: plain(agentOptions) ?? {}, ...(agentPreset ? { agentPreset } : {}),
          ...(binding ? { binding } : {}),
        }, Math.max(1, selectTimeoutMs - (Date.now() - started)))
      } catch (e) {
        throw new Error(`loopdock refused to ${op} ${sessionId}: ${e?.message ?? e}`)
      }
      const choice = r.data ?? {}
      const driver = choice.driver ?? names[0]
      if (r.type !== 'selection' || typeof choice.loop !== 'string') throw new Error(`loopdock: bad answer to select: ${r.type}`)
      if (!drivers[driver]) throw new Error(`loopdock: the runtime chose driver ${driver}, which this host does not run (${names.join(', ')})`)
      return { loop: choice.loop, driver, parts: choice.parts ?? {} }
    }
    const pinned = (agentOptions, parts) => {
      if (!parts.provider && !parts.model) return agentOptions
      const out = { ...(agentOptions ?? {}) }
      if (parts.provider) out.provider = parts.provider
      if (parts.model) out.model = parts.model
      delete out.reasoningEffort
      return out
    }
    const withBinding = (choice, setup) => async (agentCtx, agent, ...rest) => {
      const result = await setup?.(agentCtx, agent, ...rest)
      const session = agent?.session ?? agentCtx?.session
      if (session && !hasBinding(session)) {
        appendPluginRecord(session, BINDING_RECORD, { loop: choice.loop, driver: choice.driver })
      }
      return result
    }
    ctx.agents.setFactory({
      async createAgent(ownerCtx, options) {
        // DSH 0.2.1 passes a new session's preset in its header meta
        const choice = await select('create', options.sessionId, options.agentOptions, options.agentPreset ?? options.meta?.agentPreset)
        return drivers[choice.driver].createAgent(ownerCtx, {
          ...options, agentOptions: pinned(options.agentOptions, choice.parts), setup: withBinding(choice, options.setup),
        })
      },
      async resume(ownerCtx, options) {
        const choice = await select('resume', options.resumeSessionId, options.agentOptions, options.agentPreset)
        return drivers[choice.driver].resume(ownerCtx, {
          ...options, agentOptions: pinned(options.agentOptions, choice.parts), setup: withBinding(choice, options.setup),
        })
      },
    })
  }

  // ---- agents the config asks for (tests: no wire type for create/resume) -------------------------
  const agentOptions = config.agentOptions ?? (config.ping ? { provider: 'ping', model: 'ping-1' } : undefined)
  if ((config.createAgents?.length ?? 0) + (config.resumeAgents?.length ?? 0) + (config.runCommands?.length ?? 0) > 0) {
    firstWelcome.then(async () => {
      for (const { sessionId, agentPreset } of config.createAgents ?? []) {
        try {
          const meta = { cwd: process.cwd(), ...(agentPreset ? { agentPreset } : {}) }
          await ctx.agents.create({ sessionId, meta, ...(agentOptions ? { agentOptions } : {}) })
        } catch (e) { log(`create ${sessionId} failed: ${e?.message ?? e}`) }
      }
      for (const { sessionId } of config.resumeAgents ?? []) {
        try {
          await ctx.agents.resume({ resumeSessionId: sessionId, ...(agentOptions ? { agentOptions } : {}) })
        } catch (e) { log(`resume ${sessionId} failed: ${e?.message ?? e}`) }
      }
      for (const { sessionId, line } of config.runCommands ?? []) {
        try {
          const agent = ctx.agents.get(sessionId)
          if (!agent) throw new Error('no such agent')
          const result = await ctx.commands.execute(agent, line, [], new AbortController().signal)
          log(`command ${String(line).slice(0, 64)} in ${sessionId}: ${JSON.stringify(result)?.slice(0, 300)}`)
        } catch (e) { log(`command in ${sessionId} failed: ${e?.message ?? e}`) }
      }
    })
  }

  connect()
}
