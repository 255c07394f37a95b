// The owner API as the console calls it: the token from sessionStorage as a bearer token on
// every request, problem+json turned into errors, SSE read through fetch streaming (an
// EventSource cannot send the Authorization header).

const KEY = 'eventos.token';
let onSignedOut = () => {};

export const session = {
  token: () => sessionStorage.getItem(KEY),
  signIn: (token) => sessionStorage.setItem(KEY, token),
  signOut: (reason) => { sessionStorage.removeItem(KEY); onSignedOut(reason); },
  onSignedOut: (fn) => { onSignedOut = fn; },
};

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function headers(extra) {
  return { Authorization: `Bearer ${session.token()}`, Accept: 'application/json', ...extra };
}

export function path(base, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') params.set(k, v);
  }
  const q = params.toString();
  return q ? `${base}?${q}` : base;
}

export async function call(method, url, body, signal) {
  const init = { method, headers: headers(), cache: 'no-store', credentials: 'omit', signal };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(url, init);
  if (r.status === 204) return null;
  const doc = await r.json().catch(() => null);
  if (r.status === 401) session.signOut('The token was refused: sign in again.');
  if (!r.ok) throw new ApiError(r.status, doc);
  return doc;
}

export const get = (base, query, signal) => call('GET', path(base, query), undefined, signal);
export const post = (url, body) => call('POST', url, body === undefined ? {} : body);
export const del = (url) => call('DELETE', url);

// Follow a server-sent event stream until `signal` aborts: `onEvent(kind, data, id)` for each
// event; on a dropped connection it reconnects with Last-Event-ID, so nothing is missed or
// seen twice. `onState('live' | 'reconnecting')` tells the page.
export async function follow(url, { after, onEvent, onState, signal }) {
  let last = after;
  let wait = 1000;
  while (!signal.aborted) {
    try {
      const extra = { Accept: 'text/event-stream' };
      if (last !== undefined && last !== null) extra['Last-Event-ID'] = String(last);
      const r = await fetch(url, { headers: headers(extra), cache: 'no-store', signal });
      if (r.status === 401) { session.signOut('The token was refused: sign in again.'); return; }
      if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
      onState('live');
      wait = 1000;
      for await (const ev of events(r.body, signal)) {
        if (ev.retry) wait = ev.retry;
        if (ev.id !== undefined) last = ev.id;
        if (ev.data !== undefined) onEvent(ev.event || 'message', JSON.parse(ev.data), ev.id);
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status < 500) throw err;
    }
    if (signal.aborted) return;
    onState('reconnecting');
    await pause(wait, signal);
    wait = Math.min(wait * 2, 30000);
  }
}

async function* events(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  signal.addEventListener('abort', () => reader.cancel().catch(() => {}), { once: true });
  let buffer = '';
  let ev = {};
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let nl;
    while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer.startsWith('\r\n', nl) ? 2 : 1));
      if (line === '') { if (Object.keys(ev).length) yield ev; ev = {}; continue; }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const key = colon < 0 ? line : line.slice(0, colon);
      const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
      if (key === 'data') ev.data = ev.data === undefined ? val : `${ev.data}\n${val}`;
      else if (key === 'event') ev.event = val;
      else if (key === 'id') ev.id = val;
      else if (key === 'retry' && /^\d+$/.test(val)) ev.retry = Number(val);
    }
  }
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}
