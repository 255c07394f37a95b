// Employees: state, generation, budget gauge, pending inputs by class, open attention items.
import { get } from '../api.js';
import { h, replace, redraw, link, table, usd, button } from '../dom.js';

const COLUMNS = ['Employee', 'State', 'Generation', 'Budget today', 'Pending inputs', 'Attention'];

function state(row) {
  return [h('span', { class: `state state-${row.state}` }, row.state),
    row.pause_reason ? h('span', { class: 'muted' }, ` (${row.pause_reason})`) : ''];
}

export function gauge(budget) {
  const spent = budget.spent_usd + budget.reserved_usd;
  if (budget.daily_usd === null) return h('span', null, usd(spent), h('span', { class: 'muted' }, ' (no limit)'));
  const text = `${usd(spent)} of ${usd(budget.daily_usd)}`;
  return h('span', { class: 'gauge' },
    h('meter', { min: 0, max: budget.daily_usd, low: budget.daily_usd * 0.7,
      high: budget.daily_usd * 0.9, optimum: 0, value: Math.min(spent, budget.daily_usd),
      'aria-label': `budget: ${text}` }),
    ' ', text, budget.state !== 'normal' ? h('strong', null, ` ${budget.state}`) : '');
}

function pending(row) {
  const classes = Object.entries(row.pending);
  if (!classes.length) return h('span', { class: 'muted' }, 'none');
  return [classes.map(([c, n]) => h('span', { class: 'tag' }, `${c}: ${n}`)),
    row.pending_capped ? h('span', { class: 'muted' }, ' (at least)') : ''];
}

function cells(row) {
  return [
    link(['employee', row.name], row.name),
    state(row),
    row.generation === null ? '—' : String(row.generation),
    gauge(row.budget),
    pending(row),
    row.attention_open ? link(['attention', row.name], `${row.attention_open} open`)
      : h('span', { class: 'muted' }, '0'),
  ];
}

export async function render(main, { signal, failed, live }) {
  const rows = [];
  const holder = h('div');
  const more = button('More', () => load(next));
  let next = null;
  async function load(cursor, limit) {
    try {
      const page = await get('/v1/employee-summaries', { cursor, limit }, signal);
      if (!cursor) rows.length = 0;
      rows.push(...page.employee_summaries);
      next = page.next_cursor;
      redraw(holder, rows.length ? table('Employees by name', COLUMNS, rows, cells)
        : h('p', null, 'No employee is applied yet.'));
      more.hidden = !next;
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  replace(main, h('h1', null, 'Employees'), holder, more);
  // Live: read again (as many rows as shown) when an employee, a turn, an item or a letter changes.
  live(['employee', 'turn', 'attention', 'dead_letter'], () => load(null, Math.min(200, Math.max(50, rows.length))));
  await load(null);
}
