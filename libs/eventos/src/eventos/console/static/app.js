// The console's shell: sign-in, the pages a token may see, hash routing (`#/page/name`), and
// the operator event stream that keeps the shown page and the navigation's counts live.
import { get, follow, session, ApiError } from './api.js';
import { h, replace, link, tick } from './dom.js';
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

// The navigation's counts (`GET /v1/counts`): route → [field, what the number counts]
const COUNTS = {
  approvals: ['approvals_pending', 'pending'],
  attention: ['attention_open', 'open'],
  outbox: ['outbox_unknown', 'unknown'],
};
const COUNTED = new Set(['attention', 'approval', 'outbox']); // event families that change them
const GAP_MS = 1000; // a burst of events reads a page again at most once a second

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const status = document.getElementById('status');
let me = null;
let current = null; // the shown page's AbortController: its requests and streams end with it
let stream = null; // the operator event stream's AbortController, while signed in
let pageLive = null; // the shown page's interest: { families, employee, run }
let counts = null; // the last `GET /v1/counts`
const liveState = h('span', { class: 'live muted' });

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
    a.dataset.route = r;
    if (r === route || ((route === 'employee' || route === 'turn') && r === 'employees')) a.setAttribute('aria-current', 'page');
    return h('li', null, a);
  })));
  replace(who, liveState, ' · ', me.admin ? 'admin' : me.name, ' ',
    h('button', { type: 'button', class: 'link', onclick: () => session.signOut() }, 'Sign out'));
  drawCounts();
}

// Each counted page's link carries its number (none at zero), said in its name too.
function drawCounts() {
  for (const a of nav.querySelectorAll('a[data-route]')) {
    const [field, word] = COUNTS[a.dataset.route] || [];
    const n = field && counts ? counts[field] : null;
    a.querySelector('.count')?.remove();
    a.removeAttribute('aria-label');
    if (!n) continue;
    const shown = n >= counts.cap ? `${counts.cap}+` : String(n);
    a.append(' ', h('span', { class: 'count' }, shown));
    a.setAttribute('aria-label', `${PAGES[a.dataset.route][1]}: ${shown} ${word}`);
  }
}

// `fn` run at once, and again (once, at least GAP_MS later) if asked while it ran or waited.
function coalesced(fn) {
  let busy = false;
  let again = false;
  const run = async () => {
    if (busy) { again = true; return; }
    busy = true;
    try { await fn(); } catch { /* a part that failed says so itself */ }
    await new Promise((resolve) => setTimeout(resolve, GAP_MS));
    busy = false;
    if (again) { again = false; run(); }
  };
  return run;
}

const readCounts = coalesced(async () => {
  if (!me) return;
  counts = await get('/v1/counts');
  drawCounts();
});

function changed(kind, data) {
  const family = kind.split('.')[0];
  if (COUNTED.has(family)) readCounts();
  const want = pageLive;
  if (want && want.families.includes(family) && (!want.employee || want.employee === data.employee)) want.run();
}

// Follow `GET /v1/events` while signed in; on (re)connecting read the counts and the page
// again, so nothing that changed before the stream was open is missed.
function watch() {
  if (stream) stream.abort();
  stream = new AbortController();
  const { signal } = stream;
  (async () => {
    while (!signal.aborted) {
      try {
        await follow('/v1/events', {
          signal,
          onEvent: changed,
          onState: (s) => {
            replace(liveState, s === 'live' ? 'updates live' : 'reconnecting…');
            if (s === 'live') { readCounts(); pageLive?.run(); }
          },
        });
      } catch (err) {
        if (signal.aborted) return;
        if (!(err instanceof ApiError && err.status === 410)) { replace(liveState, 'not live: reload'); return; }
        // 410: the stream's place is past its retention: follow again from now.
      }
    }
  })();
}

// One not-found state: the page is replaced by what was not found, and the way back.
function notFound(text) {
  pageLive = null;
  const back = me.admin ? link(['employees'], 'Back to the employees') : link(['chat'], 'Back to chat');
  replace(main, h('section', { class: 'not-found', 'aria-labelledby': 'not-found' },
    h('h1', { id: 'not-found' }, 'Not found'), h('p', null, text), h('p', null, back)));
}

async function show(reason) {
  if (current) current.abort();
  current = new AbortController();
  pageLive = null;
  say('');
  if (!session.token() || !me) {
    if (stream) { stream.abort(); stream = null; }
    counts = null;
    replace(nav); replace(who);
    signin.render(main, { reason, onToken: (token) => { session.signIn(token); start(); } });
    return;
  }
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : '';
  const [route, ...args] = hash.split('/').filter(Boolean).map(decodeURIComponent);
  const target = route && allowed(route) ? route : (me.admin ? 'employees' : 'chat');
  drawNav(route && !PAGES[route] ? null : target);
  if (route && !PAGES[route]) { notFound(`The console has no page “${route}”.`); return; }
  if (route && !allowed(route)) say('That page is not open to this token.', 'error');
  const [page] = PAGES[target];
  replace(main, h('p', { class: 'muted' }, 'Loading…'));
  const { signal } = current;
  // A page that shows what the stream tells of asks to be read again on those families'
  // events (of one employee, if it names one).
  const live = (families, refresh, employee) => {
    if (!signal.aborted) pageLive = { families, employee, run: coalesced(refresh) };
  };
  try {
    await page.render(main, { me, args, signal, say, failed, live, notFound });
  } catch (err) {
    if (signal.aborted) return;
    if (err instanceof ApiError && err.status === 404) notFound(err.message);
    else failed(err);
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
  watch();
  show();
}

session.onSignedOut((reason) => { me = null; show(reason); });
window.addEventListener('hashchange', () => {
  if (me && (!location.hash || location.hash.startsWith('#/'))) show();
});
setInterval(() => tick(main), 5000); // "12s ago" stays true
if (session.token()) start(); else show();
