// The console's shell: sign-in, the pages a token may see, and hash routing (`#/page/name`).
import { get, session, ApiError } from './api.js';
import { h, replace, link } from './dom.js';
import * as signin from './pages/signin.js';
import * as employees from './pages/employees.js';
import * as employee from './pages/employee.js';
import * as turn from './pages/turn.js';
import * as chat from './pages/chat.js';
import * as approvals from './pages/approvals.js';
import * as attention from './pages/attention.js';
import * as outbox from './pages/outbox.js';
import * as deadLetters from './pages/dead-letters.js';
import * as users from './pages/users.js';

// Route → [page, nav label (none: not in the nav), admin only]
const PAGES = {
  employees: [employees, 'Employees', true],
  employee: [employee, null, true],
  turn: [turn, null, true],
  chat: [chat, 'Chat', false],
  approvals: [approvals, 'Approvals', false],
  attention: [attention, 'Attention', false],
  outbox: [outbox, 'Outbox', true],
  'dead-letters': [deadLetters, 'Dead letters', true],
  users: [users, 'Users', true],
};

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const status = document.getElementById('status');
let me = null;
let current = null; // the shown page's AbortController: its requests and streams end with it

export function say(text, kind) {
  replace(status, text ? h('p', { class: kind || 'info' }, text) : '');
}

export function failed(err) {
  say(err instanceof ApiError ? err.message : 'The request failed; try again.', 'error');
}

function allowed(route) {
  const entry = PAGES[route];
  return entry && (me.admin || !entry[2]);
}

function drawNav(route) {
  const items = Object.entries(PAGES).filter(([r, [, label]]) => label && allowed(r));
  replace(nav, h('ul', null, items.map(([r, [, label]]) => {
    const a = link([r], label);
    if (r === route || ((route === 'employee' || route === 'turn') && r === 'employees')) a.setAttribute('aria-current', 'page');
    return h('li', null, a);
  })));
  replace(who, me.admin ? 'admin' : me.name, ' ',
    h('button', { type: 'button', class: 'link', onclick: () => session.signOut() }, 'Sign out'));
}

async function show(reason) {
  if (current) current.abort();
  current = new AbortController();
  say('');
  if (!session.token() || !me) {
    replace(nav); replace(who);
    signin.render(main, { reason, onToken: (token) => { session.signIn(token); start(); } });
    return;
  }
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : '';
  const [route, ...args] = hash.split('/').filter(Boolean).map(decodeURIComponent);
  const target = route && allowed(route) ? route : (me.admin ? 'employees' : 'chat');
  if (route && !allowed(route)) say('That page is not open to this token.', 'error');
  drawNav(target);
  const [page] = PAGES[target];
  replace(main, h('p', { class: 'muted' }, 'Loading…'));
  try {
    await page.render(main, { me, args, signal: current.signal, say, failed });
  } catch (err) {
    if (!current.signal.aborted) failed(err);
  }
  if (document.activeElement === document.body) main.focus({ preventScroll: true });
}

async function start() {
  try {
    me = await get('/v1/me');
  } catch (err) {
    me = null;
    if (session.token()) show(err instanceof ApiError ? err.message : 'The API did not answer; try again.');
    return;
  }
  show();
}

session.onSignedOut((reason) => { me = null; show(reason); });
window.addEventListener('hashchange', () => {
  if (me && (!location.hash || location.hash.startsWith('#/'))) show();
});
if (session.token()) start(); else show();
