// Sign in: the token is typed here and kept in this tab's sessionStorage only; it is sent as a
// bearer token and never put in a URL.
import { h, replace } from '../dom.js';

export function render(main, { reason, onToken }) {
  const input = h('input', {
    type: 'password', name: 'token', autocomplete: 'off', spellcheck: 'false', required: true,
    'aria-describedby': 'token-help',
  });
  const form = h('form', { method: 'post', class: 'signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in'),
    reason ? h('p', { class: 'error', role: 'alert' }, reason) : '',
    h('div', { class: 'field' }, h('label', { for: 'token' }, 'Token'), input),
    h('p', { id: 'token-help', class: 'muted' },
      'The admin token or a user token (eos_u_…). It stays in this tab until you sign out or close it.'),
    h('button', { type: 'submit' }, 'Sign in'));
  input.id = 'token';
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const token = input.value.trim();
    input.value = '';
    if (token) onToken(token);
  });
  replace(main, form);
  input.focus();
}
