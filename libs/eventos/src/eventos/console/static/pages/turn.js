// One turn (`#/turn/EMPLOYEE/TURN_ID`): its state, cost, failure cause and steps (each model and
// tool call with its duration and attempts), and the admin's opt-in transcript view: what the
// model was asked and answered, fetched only on request (each view is on the timeline).
import { get, ApiError } from '../api.js';
import { h, replace, table, section, when, usd, link, button } from '../dom.js';

export function duration(s) {
  if (s === null || s === undefined) return 'running';
  return s < 60 ? `${Number(s).toFixed(s < 10 ? 2 : 1)} s` : `${(s / 60).toFixed(1)} min`;
}

function tokens(s) {
  return s.input_tokens === null && s.output_tokens === null ? '—'
    : `${s.input_tokens ?? '?'} → ${s.output_tokens ?? '?'}`;
}

// A model call's last attempt: its reservation's state in words.
const CALL_STATES = { settled: 'answered', released: 'failed (not billed)', reserved: 'running' };

const STEP_COLUMNS = ['Step', 'What', 'Started', 'Took', 'Attempts', 'Tokens', 'Cost', 'Outcome'];

function stepCells(s) {
  const llm = s.kind === 'llm';
  return [
    llm ? `model call ${s.step === null || s.step === undefined ? '' : s.step + 1}`.trim() : 'tool call',
    llm ? h('code', null, s.model) : [h('code', null, s.name), ` (${s.effect})`],
    when(s.at), duration(s.duration_s), String(s.attempts ?? 1),
    llm ? tokens(s) : '—', llm ? usd(s.usd) : '—',
    llm ? h('span', { class: `state state-${s.state}` }, CALL_STATES[s.state] || s.state)
      : [h('span', { class: `state state-${s.status}` }, s.status), s.outcome ? ` · ${s.outcome}` : ''],
  ];
}

function facts(t) {
  const took = t.ended_at ? (new Date(t.ended_at) - new Date(t.started_at)) / 1000 : null;
  const rows = [
    ['Status', h('span', { class: `state state-${t.status}` }, t.status)],
    ['Conversation', `${t.agent}/${t.thread} · generation ${t.generation} · class C${t.class}`],
    ['Started', when(t.started_at)],
    ['Took', t.ended_at ? duration(took) : 'running'],
    ['Waited for a slot', t.admission_wait_s === null || t.admission_wait_s === undefined ? '—' : duration(t.admission_wait_s)],
    ['Tokens', `${t.input_tokens} → ${t.output_tokens}`],
    ['Cost', usd(t.cost_usd)],
  ];
  return h('dl', { class: 'facts' }, rows.map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
}

function messageView(m) {
  const who = { user: 'Asked', tool: 'Tool result', assistant: 'Answered', system: 'System' }[m.role] || m.role;
  return h('li', { class: `said said-${m.role}` },
    h('p', { class: 'said-who' }, h('strong', null, who), m.name ? ` · ${m.name}` : '',
      m.tool_call_id ? h('span', { class: 'muted' }, ` · for call ${m.tool_call_id}`) : ''),
    m.content ? h('pre', { class: 'draft' }, m.content) : '',
    (m.tool_calls || []).map((c) => h('p', null, 'Calls ', h('code', null, c.name), ' with ',
      h('pre', { class: 'draft' }, c.arguments))),
    m.truncated ? h('p', { class: 'muted' }, 'Cut at 20,000 characters.') : '');
}

function transcriptPart(base, me, signal) {
  const box = h('div');
  if (!me.admin) return section('Transcript', h('p', { class: 'muted' }, 'Only the admin may read a transcript.'));
  async function load() {
    replace(box, h('p', { class: 'muted' }, 'Loading…'));
    try {
      const doc = await get(`${base}/transcript`, null, signal);
      replace(box,
        h('p', { class: 'muted' }, 'This view is recorded on the employee\'s timeline.'),
        doc.messages.length ? h('ol', { class: 'transcript', 'aria-label': 'What the model was asked and answered' },
          doc.messages.map(messageView))
          : h('p', null, 'No message of this turn is stored: a failed turn saves none, and a conversation keeps only its newest 1 MB.'),
        doc.messages_capped ? h('p', { class: 'muted' }, 'Only the first 200 messages are shown.') : '');
    } catch (err) {
      if (signal.aborted) return;
      const off = err instanceof ApiError && err.status === 403;
      replace(box, h('p', { class: off ? 'notice' : 'error' }, off ? ['Transcripts are off. ', err.message] : err.message),
        off ? '' : button('Try again', load));
    }
  }
  replace(box, h('p', null, 'What the model was asked and answered in this turn. Opening it is recorded on the employee\'s timeline.'),
    button('Show transcript', load, { class: 'primary' }));
  return section('Transcript', box);
}

export async function render(main, { me, args, signal, failed }) {
  const [name, id] = args;
  if (!name || !id) { location.hash = '#/employees'; return; }
  const base = `/v1/employees/${encodeURIComponent(name)}/turns/${encodeURIComponent(id)}`;
  let t;
  try {
    t = await get(base, null, signal);
  } catch (err) {
    if (!signal.aborted) failed(err);
    replace(main, h('h1', null, 'Turn'), h('p', null, link(['employee', name], `Back to ${name}`)));
    return;
  }
  replace(main,
    h('h1', null, `Turn ${t.n} of `, link(['employee', name], name)),
    h('p', { class: 'muted turn-id' }, h('code', null, t.id)),
    facts(t),
    t.error ? section('Why it failed', h('p', { class: 'error' }, t.error)) : '',
    section('Steps', t.steps.length ? table('Each model and tool call, in order', STEP_COLUMNS, t.steps, stepCells)
      : h('p', null, 'No step.'),
    t.steps_capped ? h('p', { class: 'muted' }, 'Only the first 50 model and 50 tool calls are shown.') : ''),
    transcriptPart(base, me, signal));
}
