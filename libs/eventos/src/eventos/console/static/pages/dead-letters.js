// Dead letters, and replay in two steps: the server first answers what a selector would replay
// (count and sample) with a confirmation token; only confirming replays.
import { get, post } from '../api.js';
import { h, replace, redraw, when, field, button, table } from '../dom.js';
import { about } from '../links.js';

const COLUMNS = ['Letter', 'Reason', 'Source', 'Employee', 'What', 'Died', 'Replayed', ''];

export async function render(main, { me, signal, say, failed, live }) {
  const reason = h('input', { name: 'reason', autocomplete: 'off' });
  const source = h('input', { name: 'source', autocomplete: 'off' });
  const employee = h('input', { name: 'employee', autocomplete: 'off' });
  const since = h('input', { name: 'since', type: 'datetime-local' });
  const holder = h('div');
  const confirmBox = h('div', { class: 'confirm', role: 'region', 'aria-label': 'Replay', tabindex: '-1' });
  const rows = [];
  const more = button('More', () => load(next));
  let next = null;

  const filters = () => ({
    reason: reason.value.trim(), source: source.value.trim(), employee: employee.value.trim(),
    since: since.value ? new Date(since.value).toISOString() : '',
  });
  function selectorOf(values) {
    return Object.fromEntries(Object.entries(values).filter(([, v]) => v !== '' && v !== undefined));
  }

  async function ask(selector) {
    try {
      const plan = await post('/v1/replay', { selector });
      replace(confirmBox,
        h('h2', null, 'Replay?'),
        h('p', null, `${plan.count} dead letter${plan.count === 1 ? '' : 's'} would be routed once more`,
          plan.already_replayed ? ` (${plan.already_replayed} replayed before: never twice)` : '', '.'),
        plan.sample && plan.sample.length ? table('A sample', ['Letter', 'Reason', 'Source', 'What'], plan.sample,
          (d) => [d.id, d.reason, d.source, d.preview]) : '',
        h('p', { class: 'actions' },
          button(`Replay ${plan.count}`, () => confirm(selector, plan.confirmation), { class: 'primary', disabled: plan.count === 0 }),
          button('Cancel', () => replace(confirmBox))));
      confirmBox.focus();
    } catch (err) { failed(err); }
  }
  async function confirm(selector, confirmation) {
    try {
      const done = await post('/v1/replay', { selector, confirmation });
      replace(confirmBox);
      say(`Replayed ${done.replayed}` + (done.already_replayed ? `; ${done.already_replayed} had been replayed before.` : '.'), 'ok');
      await load(null);
    } catch (err) { failed(err); }
  }

  const cells = (d) => [d.id, [h('code', null, d.reason),
    d.detail && d.detail !== d.reason ? h('span', { class: 'muted' }, ` ${d.detail}`) : ''],
    d.source, about(me, d.employee, d.turn_id), d.preview, when(d.at),
    d.replayed_at ? [when(d.replayed_at), d.replayed_as ? ` as ${d.replayed_as}` : ''] : '',
    d.replayed_at ? '' : button('Replay…', () => ask({ ids: [d.id] }), { 'aria-label': `Replay dead letter ${d.id}` })];
  async function load(cursor) {
    try {
      const doc = await get('/v1/dead-letters', { ...filters(), cursor }, signal);
      if (!cursor) rows.length = 0;
      rows.push(...doc.dead_letters);
      next = doc.next_cursor;
      more.hidden = !next;
      redraw(holder, rows.length ? table('Newest first', COLUMNS, rows, cells) : h('p', null, 'No dead letter.'));
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  const form = h('form', { class: 'filters' }, field('Reason', reason), field('Source', source),
    field('Employee', employee), field('Since', since), h('button', { type: 'submit' }, 'Filter'),
    button('Replay all these…', () => ask(selectorOf(filters()))));
  form.addEventListener('submit', (e) => { e.preventDefault(); load(null); });
  more.hidden = true;
  replace(main, h('h1', null, 'Dead letters'), form, confirmBox, holder, more);
  live(['dead_letter'], () => load(null));
  await load(null);
}
