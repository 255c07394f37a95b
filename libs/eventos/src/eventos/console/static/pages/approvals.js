// Approvals: each held send or tool call with its draft, approved or declined here.
import { get, post } from '../api.js';
import { h, replace, redraw, when, field, select, button } from '../dom.js';
import { about } from '../links.js';

const STATES = [['pending', 'Pending'], ['approved', 'Approved'], ['declined', 'Declined'],
  ['expired', 'Expired'], ['', 'Every state']];

function card(me, a, decide) {
  const what = a.kind === 'tool' ? 'Tool call' : `Send${a.channel ? ` on ${a.channel}` : ''}`;
  return h('article', { class: 'card', 'aria-label': `Approval ${a.id}` },
    h('h2', null, `${what} · `, about(me, a.employee, a.turn_id)),
    h('p', { class: 'muted' }, a.id, ' · asked ', when(a.created_at), ' · expires ', when(a.expires_at)),
    a.rule ? h('p', null, a.state === 'pending' ? 'Held by the rule ' : 'Held by ', h('code', null, a.rule)) : '',
    h('pre', { class: 'draft' }, a.draft ?? '(the draft is stored by reference and not shown)'),
    a.state === 'pending'
      ? h('p', { class: 'actions' },
        button('Approve', () => decide(a, 'approve'), { class: 'primary' }),
        button('Decline', () => decide(a, 'decline')))
      : h('p', null, h('strong', null, a.state),
        a.decided_by ? ` by ${a.decided_by}` : '', a.decided_at ? [' ', when(a.decided_at)] : '',
        a.send_status ? ` · send ${a.send_status}` : ''));
}

export async function render(main, { me, args, signal, say, failed, live }) {
  const employee = args[0] || '';
  const state = select('state', STATES, 'pending');
  const list = h('div', { class: 'cards' });
  async function load() {
    try {
      const doc = await get('/v1/approvals', { state: state.value, employee }, signal);
      redraw(list, doc.approvals.length ? doc.approvals.map((a) => card(me, a, decide))
        : h('p', null, 'Nothing here.'));
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  async function decide(a, verb) {
    try {
      const done = await post(`/v1/approvals/${encodeURIComponent(a.id)}:${verb}`);
      say(`${a.id} ${done.state}.`, 'ok');
      await load();
    } catch (err) { failed(err); }
  }
  state.addEventListener('change', load);
  replace(main, h('h1', null, employee ? `Approvals of ${employee}` : 'Approvals'),
    h('div', { class: 'filters' }, field('State', state)), list);
  live(['approval'], load, employee || undefined);
  await load();
}
