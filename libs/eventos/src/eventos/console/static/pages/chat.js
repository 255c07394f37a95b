// Chat with an employee as this token's audience: the last messages with their replies, then
// replies arriving live over the chat's event stream.
import { get, post, follow } from '../api.js';
import { h, replace, link, when, field } from '../dom.js';

function clientId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

// What became of a reply not there to read (the message's `reply_status`), in the chat's words.
const REPLY_STATES = {
  held_for_review: 'held for review', declined: 'declined', expired: 'expired', failed: 'failed',
};

function pick(main, me) {
  replace(main, h('h1', null, 'Chat'), me.chat.length
    ? [h('p', null, 'Choose an employee to chat with:'),
      h('ul', { class: 'picks' }, me.chat.map((n) => h('li', null, link(['chat', n], n))))]
    : h('p', null, 'No employee takes chat now.'));
}

export async function render(main, { me, args, signal, failed, notFound }) {
  const name = args[0];
  if (!name) { pick(main, me); return; }
  const base = `/v1/employees/${encodeURIComponent(name)}/chat`;
  const log = h('ol', { class: 'chat', 'aria-live': 'polite', 'aria-label': `Conversation with ${name}` });
  const live = h('span', { class: 'live muted' }, 'connecting…');
  const sent = new Map(); // message id → its status element
  const turns = new Map(); // turn id → the message ids it took
  const mark = (ids, word) => ids.forEach((id) => { const el = sent.get(Number(id)); if (el) replace(el, word); });

  function mine(m) {
    const state = h('span', { class: 'muted msg-state' }, REPLY_STATES[m.reply_status] || m.status);
    sent.set(Number(m.message_id), state);
    return h('li', { class: 'msg mine' }, h('p', null, m.text), h('small', null, 'you · ', state,
      m.created_at ? [' · ', when(m.created_at)] : ''));
  }
  function reply(text) {
    return h('li', { class: 'msg theirs' }, h('p', null, text), h('small', null, name));
  }
  function notice(text) {
    return h('li', { class: 'msg notice muted', role: 'status' }, h('p', null, text));
  }

  let history;
  try {
    history = await get(base, { limit: 20 }, signal);
  } catch (err) {
    if (err.status === 404) { notFound(`No employee is named “${name}”.`); return; }
    throw err;
  }
  for (const m of history.messages.slice().reverse()) {
    log.append(mine(m));
    if (m.reply !== null) log.append(reply(m.reply));
  }

  const text = h('textarea', { name: 'text', rows: 3, required: true, maxlength: 32768 });
  const send = h('button', { type: 'submit' }, 'Send');
  const form = h('form', { class: 'compose' }, field('Message', text), send,
    h('p', { class: 'muted' }, 'Ctrl+Enter sends.'));
  async function submit(event) {
    event.preventDefault();
    const body = text.value;
    if (!body.trim()) return;
    send.disabled = true;
    try {
      const q = await post(base, { client_message_id: clientId(), text: body });
      text.value = '';
      log.append(mine({ message_id: q.message_id, text: body, status: q.status }));
      log.lastChild.scrollIntoView({ block: 'end' });
    } catch (err) {
      failed(err);
    } finally {
      send.disabled = false;
      text.focus();
    }
  }
  form.addEventListener('submit', submit);
  text.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });

  replace(main, h('h1', null, `Chat with ${name}`), h('p', null, live), log, form);
  log.lastChild?.scrollIntoView({ block: 'end' });

  follow(`${base}/events`, {
    after: history.last_event_id,
    signal,
    onState: (s) => replace(live, s === 'live' ? 'live' : 'reconnecting…'),
    onEvent: (kind, data) => {
      if (kind === 'reply') {
        mark(turns.get(data.turn_id) || [], 'answered');
        log.append(reply(data.text));
        log.lastChild.scrollIntoView({ block: 'end' });
        return;
      }
      if (kind === 'notice') { // the reply is held for review (or the turn waits): said as such
        mark(turns.get(data.turn_id) || [], data.text);
        log.append(notice(data.text));
        log.lastChild.scrollIntoView({ block: 'end' });
        return;
      }
      const ids = data.message_ids || [];
      turns.set(data.turn_id, [...(turns.get(data.turn_id) || []), ...ids]);
      mark(ids, 'working');
    },
  }).catch((err) => { if (!signal.aborted) failed(err); });
}
