// Attention items: what needs the owner, with each item's actions (Retry a send, Release a
// thread, …), acknowledged or resolved here.
import { get, post } from '../api.js';
import { h, replace, redraw, when, field, select, button } from '../dom.js';
import { about } from '../links.js';

const STATES = [['open,acked', 'Open or acknowledged'], ['open', 'Open'], ['acked', 'Acknowledged'],
  ['resolved', 'Resolved']];

function label(action) {
  return action.charAt(0).toUpperCase() + action.slice(1).replace(/_/g, ' ');
}

function card(me, item, act) {
  const live = item.state !== 'resolved';
  return h('article', { class: `card severity-${item.severity}`, 'aria-label': `Attention item ${item.id}` },
    h('h2', null, `${item.kind} · `, about(me, item.employee, item.turn_id)),
    h('p', { class: 'muted' }, `${item.severity} · ${item.ref} · seen ${item.count}× · first `,
      when(item.first_seen), ' · last ', when(item.last_seen), ` · ${item.state}`),
    item.detail ? h('p', null, item.detail) : '',
    live ? h('p', { class: 'actions' },
      (item.actions || []).map((a) => button(label(a), () => act(item, 'act', a), { class: 'primary', 'aria-label': `${label(a)}: ${item.kind} ${item.id}` })),
      item.state === 'open' ? button('Acknowledge', () => act(item, 'ack'), { 'aria-label': `Acknowledge ${item.kind} ${item.id}` }) : '',
      button('Resolve', () => act(item, 'resolve'), { 'aria-label': `Resolve ${item.kind} ${item.id}` })) : '');
}

export async function render(main, { me, args, signal, say, failed, live }) {
  const employee = args[0] || '';
  const state = select('state', STATES, 'open,acked');
  const list = h('div', { class: 'cards' });
  const more = button('More', () => load(next));
  let next = null;
  let shown = 0;
  async function load(cursor, limit) {
    try {
      const doc = await get('/v1/attention', { state: state.value, employee, cursor, limit }, signal);
      shown = (cursor ? shown : 0) + doc.attention.length;
      const cards = doc.attention.map((item) => card(me, item, act));
      if (cursor) list.append(...cards);
      else redraw(list, cards.length ? cards : h('p', null, 'Nothing needs attention.'));
      next = doc.next_cursor;
      more.hidden = !next;
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  async function act(item, verb, action) {
    try {
      await post(`/v1/attention/${item.id}:${verb}`, action ? { action } : {});
      say(`${item.kind} ${item.id}: ${action ? label(action) : verb} done.`, 'ok');
      await load(null);
    } catch (err) { failed(err); }
  }
  more.hidden = true;
  state.addEventListener('change', () => load(null));
  replace(main, h('h1', null, employee ? `Attention: ${employee}` : 'Attention'),
    h('div', { class: 'filters' }, field('State', state)), list, more);
  live(['attention'], () => load(null, Math.min(200, Math.max(50, shown))), employee || undefined);
  await load(null);
}
