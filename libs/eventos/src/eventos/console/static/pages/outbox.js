// The outbox: what left or waits to leave (never a recipient or a body); an `unknown` or
// `failed` send can be sent once more with Retry.
import { get, post } from '../api.js';
import { h, replace, redraw, when, field, select, button, table } from '../dom.js';

const STATUSES = [['', 'Every status'], ['unknown', 'Unknown'], ['failed', 'Failed'], ['held', 'Held'],
  ['queued', 'Queued'], ['sending', 'Sending'], ['sent', 'Sent'], ['expired', 'Expired']];
const COLUMNS = ['Id', 'Employee', 'Channel', 'Status', 'Why', 'Updated', ''];

export async function render(main, { args, signal, say, failed, live }) {
  const employee = args[0] || '';
  const status = select('status', STATUSES, '');
  const holder = h('div');
  const rows = [];
  const more = button('More', () => load(next));
  let next = null;
  async function retry(row) {
    try {
      await post(`/v1/outbox/${row.id}:retry`);
      say(`Send ${row.id} is queued once more.`, 'ok');
      await load(null);
    } catch (err) { failed(err); }
  }
  const cells = (r) => [String(r.id), r.employee, r.kind, h('span', { class: `state state-${r.status}` }, r.status),
    r.held_reason || r.error || '', when(r.updated_at),
    ['unknown', 'failed'].includes(r.status) ? button('Retry', () => retry(r), { 'aria-label': `Retry send ${r.id}` }) : ''];
  async function load(before) {
    try {
      const doc = await get('/v1/outbox', { status: status.value, employee, before }, signal);
      if (!before) rows.length = 0;
      rows.push(...doc.outbox);
      next = doc.next_before;
      more.hidden = !next;
      redraw(holder, rows.length ? table('Newest first', COLUMNS, rows, cells) : h('p', null, 'Nothing here.'));
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  more.hidden = true;
  status.addEventListener('change', () => load(null));
  replace(main, h('h1', null, 'Outbox'),
    h('p', { class: 'muted' }, 'Retry sends a row once more: check first that it did not arrive.'),
    h('div', { class: 'filters' }, field('Status', status)), holder, more);
  live(['outbox'], () => load(null), employee || undefined);
  await load(null);
}
