// One employee: why its inputs wait, its conversations, its turns (steps and cost) and its
// timeline. Each part loads on its own: one that fails says so and the others still show; an
// employee that is not there is one not-found state. Every part is read again, live, when the
// operator event stream tells of a change of this employee.
import { get } from '../api.js';
import { h, replace, redraw, table, section, when, usd, button, field, select, link } from '../dom.js';
import { duration } from './turn.js';

function seconds(a, b) {
  if (!a || !b) return '';
  const s = (new Date(b) - new Date(a)) / 1000;
  return s < 60 ? `${s.toFixed(1)} s` : `${(s / 60).toFixed(1)} min`;
}

let notFound = () => {}; // the shown page's not-found state (set by render)

function pager(holder, load, signal, size) {
  // A list with a "More" button: `load(cursor, limit)` answers [rows, next cursor];
  // `holder.draw` shows the rows; a failure is said in the holder. `refresh` reads again as
  // many rows as are shown (up to 200).
  const rows = [];
  let next = null;
  const more = button('More', () => run(next));
  more.hidden = true;
  async function run(cursor, limit) {
    try {
      const [got, after] = await load(cursor, limit);
      if (cursor === null) rows.length = 0;
      rows.push(...got);
      next = after;
      more.hidden = !next;
      holder.draw(rows);
    } catch (err) {
      if (!signal.aborted) failure(holder, err);
    }
  }
  return { more, reload: () => run(null), refresh: () => run(null, Math.min(200, Math.max(size, rows.length))) };
}

function failure(box, err) {
  if (err.status === 404) notFound(err.message);
  else replace(box, h('p', { class: 'error' }, err.message || 'This part did not load.'));
}

function waitingPart(name, signal) {
  const box = h('div', null, h('p', { class: 'muted' }, 'Loading…'));
  const cols = ['Input', 'Class', 'Waiting since', 'Held by', 'Until'];
  const load = () => get(`/v1/employees/${encodeURIComponent(name)}/waiting`, null, signal).then((doc) => {
    const rows = doc.waiting;
    replace(box, rows.length ? table('Inputs not yet consumed, and the gate holding each', cols, rows, (w) => [
      [w.input || '', w.thread ? h('span', { class: 'muted' }, ` ${w.lane}/${w.thread} #${w.seq}`) : ''],
      w.class ? `C${w.class}` : '—', when(w.since),
      [h('code', null, w.gate.code), ' ', w.gate.text], when(w.gate.until),
    ]) : h('p', null, 'Nothing waits: every input was consumed.'),
    doc.more ? h('p', { class: 'muted' }, `… and ${doc.more} more.`) : '');
  }).catch((err) => { if (!signal.aborted) failure(box, err); });
  return { part: section('Why waiting', box), load };
}

function turnView(name, t) {
  const took = (s) => ` · ${duration(s.duration_s)}${s.attempts > 1 ? ` · ${s.attempts} attempts` : ''}`;
  const steps = t.steps.map((s) => h('li', null, s.kind === 'llm'
    ? [h('strong', null, 'model '), s.model, ` · ${s.input_tokens ?? '?'} → ${s.output_tokens ?? '?'} tokens · ${usd(s.usd)} · ${s.state}`, took(s)]
    : [h('strong', null, 'tool '), s.name, ` (${s.effect}) · ${s.status}`, s.outcome ? ` · ${s.outcome}` : '', took(s)]));
  return h('details', { class: 'turn', 'data-turn': t.id },
    h('summary', null, h('span', { class: `state state-${t.status}` }, t.status), ` turn ${t.n} · ${t.agent}/${t.thread} · `,
      usd(t.cost_usd), ` · ${t.input_tokens}→${t.output_tokens} tokens · `, when(t.started_at),
      t.ended_at ? ` · ${seconds(t.started_at, t.ended_at)}` : ''),
    t.error ? h('p', { class: 'error' }, t.error) : '',
    steps.length ? h('ol', { class: 'steps' }, steps) : h('p', { class: 'muted' }, 'No step.'),
    t.steps_capped ? h('p', { class: 'muted' }, 'Only the first steps are shown.') : '',
    h('p', null, link(['turn', name, t.id], `Open turn ${t.n}`)));
}

export async function render(main, { args, signal, live, notFound: gone }) {
  const name = args[0];
  if (!name) { location.hash = '#/employees'; return; }
  let missing = false;
  notFound = () => { if (!missing && !signal.aborted) { missing = true; gone(`No employee is named “${name}”.`); } };
  const base = `/v1/employees/${encodeURIComponent(name)}`;
  const filter = { thread: '', chain: '', kind: '' };
  const head = h('p', { class: 'muted' }, 'Loading…');

  const turnsBox = h('div');
  turnsBox.draw = (rows) => {
    // A turn opened stays open when the list is read again.
    const open = new Set(Array.from(turnsBox.querySelectorAll('details[open]'), (d) => d.dataset.turn));
    redraw(turnsBox, rows.length ? rows.map((t) => turnView(name, t)) : h('p', null, 'No turn yet.'));
    for (const d of turnsBox.querySelectorAll('details')) if (open.has(d.dataset.turn)) d.open = true;
  };
  const turns = pager(turnsBox, async (cursor, limit) => {
    const doc = await get(`${base}/turns`, { thread: filter.thread, cursor, limit: limit || 20 }, signal);
    return [doc.turns, doc.next_cursor];
  }, signal, 20);

  const timelineBox = h('div');
  const tlCols = ['At', 'Kind', 'Thread', 'Chain', 'What'];
  const tlTable = (rows) => {
    const t = table('Newest first', tlCols, rows, (e) => [
    when(e.at), e.kind, e.thread || '',
    e.chain_id ? button(e.chain_id.slice(0, 12), () => { filter.chain = e.chain_id; chainInput.value = e.chain_id; timeline.reload(); }, { class: 'link', title: `Only chain ${e.chain_id}` }) : '',
    /^(turn|transcript)\./.test(e.kind) && e.ref ? link(['turn', name, e.ref], e.summary || e.kind) : (e.summary || ''),
    ]);
    t.classList.add('timeline'); // compact on a phone: two lines an entry
    return t;
  };
  timelineBox.draw = (rows) => redraw(timelineBox, rows.length ? tlTable(rows)
    : h('p', null, 'Nothing on the timeline for this filter.'));
  const timeline = pager(timelineBox, async (cursor, limit) => {
    const doc = await get(`${base}/timeline`, { ...filter, cursor, limit }, signal);
    return [doc.timeline, doc.next_cursor];
  }, signal, 50);
  const chainInput = h('input', { name: 'chain', autocomplete: 'off' });
  const kindInput = h('input', { name: 'kind', autocomplete: 'off', placeholder: 'turn, input.dead' });
  const tlForm = h('form', { class: 'filters' },
    field('Chain', chainInput), field('Kind', kindInput),
    h('button', { type: 'submit' }, 'Filter'),
    button('Clear', () => { filter.chain = filter.kind = chainInput.value = kindInput.value = ''; timeline.reload(); }));
  tlForm.addEventListener('submit', (e) => {
    e.preventDefault();
    filter.chain = chainInput.value.trim();
    filter.kind = kindInput.value.trim();
    timeline.reload();
  });

  const threadNote = h('p', { class: 'muted' });
  function pickThread(thread) {
    filter.thread = thread;
    replace(threadNote, thread ? ['Turns and timeline of thread ', h('code', null, thread), ' only. ',
      button('Show every thread', () => pickThread(''), { class: 'link' })] : '');
    turns.reload();
    timeline.reload();
  }

  const convBox = h('div');
  const convCols = ['Conversation', 'Lane', 'Generation', 'Turns', 'Not yet consumed', 'Updated'];
  convBox.draw = (rows) => redraw(convBox, rows.length ? table('Newest generation first', convCols, rows, (c) => [
    button(`${c.agent}/${c.thread}`, () => pickThread(c.thread), { class: 'link', title: 'Only this thread' }),
    c.lane, String(c.generation), String(c.turns),
    [String(c.unconsumed), c.hold_reason ? h('span', { class: 'muted' }, ` (held: ${c.hold_reason})`) : ''],
    when(c.updated_at),
  ]) : h('p', null, 'No conversation yet.'));
  const convs = pager(convBox, async (cursor, limit) => {
    const doc = await get(`${base}/conversations`, { cursor, limit }, signal);
    return [doc.conversations, doc.next_cursor];
  }, signal, 50);

  const waiting = waitingPart(name, signal);
  replace(main, h('h1', null, name), head,
    waiting.part,
    section('Conversations', convBox, convs.more),
    section('Turns', threadNote, turnsBox, turns.more),
    section('Timeline', tlForm, timelineBox, timeline.more));

  const readHead = () => get(base, null, signal).then((e) => replace(head,
    h('span', { class: `state state-${e.state}` }, e.state),
    e.pause_reason ? ` (${e.pause_reason})` : '',
    e.generation ? ` · generation ${e.generation}` : ''))
    .catch((err) => { if (!signal.aborted) failure(head, err); });
  const families = ['employee', 'turn', 'outbox', 'dead_letter', 'attention', 'approval'];
  live(families, () => !missing && Promise.all([readHead(), waiting.load(), convs.refresh(),
    turns.refresh(), timeline.refresh()]), name);
  await Promise.all([readHead(), waiting.load(), convs.reload(), turns.reload(), timeline.reload()]);
}
