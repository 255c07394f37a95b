// Users: each has a token of its own (shown once, here) and sees only its own audience.
import { get, post, del } from '../api.js';
import { h, replace, when, field, button, table } from '../dom.js';

export async function render(main, { signal, say, failed }) {
  const holder = h('div');
  const shown = h('div', { role: 'region', 'aria-label': 'New token', tabindex: '-1' });
  const name = h('input', { name: 'name', autocomplete: 'off', required: true, pattern: '[a-z][a-z0-9_.\\-]{0,63}' });
  async function load() {
    try {
      const doc = await get('/v1/users', null, signal);
      replace(holder, doc.users.length ? table('Users', ['Name', 'Created', ''], doc.users, (u) => [
        u.name, when(u.created_at), button('Remove…', () => confirmRemove(u), { 'aria-label': `Remove ${u.name}` }),
      ]) : h('p', null, 'No user yet.'));
    } catch (err) { if (!signal.aborted) failed(err); }
  }
  function confirmRemove(u) {
    replace(shown, h('p', null, `Remove ${u.name}? Its token stops working at once.`),
      h('p', { class: 'actions' }, button(`Remove ${u.name}`, async () => {
        try { await del(`/v1/users/${encodeURIComponent(u.name)}`); replace(shown); say(`${u.name} removed.`, 'ok'); await load(); } catch (err) { failed(err); }
      }, { class: 'danger' }), button('Cancel', () => replace(shown))));
    shown.focus();
  }
  const form = h('form', { class: 'filters' }, field('New user', name), h('button', { type: 'submit' }, 'Add'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const made = await post('/v1/users', { name: name.value.trim() });
      name.value = '';
      const token = h('input', { readonly: true, value: made.token, 'aria-label': `Token of ${made.name}`, class: 'token' });
      replace(shown, h('p', null, `The token of ${made.name}, shown this once:`), token);
      token.select();
      await load();
    } catch (err) { failed(err); }
  });
  replace(main, h('h1', null, 'Users'), form, shown, holder);
  await load();
}
