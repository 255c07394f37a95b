// Elements are built from text only: data never reaches innerHTML, so nothing it holds runs.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (typeof value === 'function') el.addEventListener(key.replace(/^on/, ''), value);
    else if (key === 'class') el.className = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

export function add(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

// `replace` for a list a live page reads again: the button or link that had the focus in it
// has it again after (found by its name), so a keyboard user keeps their place.
export function redraw(el, ...children) {
  const had = el.contains(document.activeElement) ? document.activeElement : null;
  const name = (e) => `${e.tagName}:${e.getAttribute('aria-label') || e.textContent}`;
  const key = had && name(had);
  replace(el, ...children);
  if (key) Array.from(el.querySelectorAll('a, button, summary')).find((e) => name(e) === key)?.focus();
  return el;
}

// A link to a console page: hash routes carry only employee names and ids.
export function link(route, text) {
  return h('a', { href: '#/' + route.map(encodeURIComponent).join('/') }, text);
}

// One time format, the CLI's too (eventos/cli/times.py; docs/console.md#times): a list says
// how long ago (`12s ago`, `5m ago`, `3h ago`, `2d ago`, `in 4h`, `now`), a detail says when,
// ISO 8601 to the second in this browser's zone with its offset.
const STEPS = [[60, 1, 's'], [3600, 60, 'm'], [86400, 3600, 'h']];

export function ago(iso, now = Date.now()) {
  const seconds = (now - Date.parse(iso)) / 1000;
  const span = Math.abs(seconds);
  if (span < 1) return 'now';
  const step = STEPS.find(([below]) => span < below);
  const word = step ? `${Math.floor(span / step[1])}${step[2]}` : `${Math.floor(span / 86400)}d`;
  return seconds < 0 ? `in ${word}` : `${word} ago`;
}

export function exact(iso) {
  const t = new Date(iso);
  const two = (n) => String(n).padStart(2, '0');
  const off = -t.getTimezoneOffset();
  return `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())}T${two(t.getHours())}:` +
    `${two(t.getMinutes())}:${two(t.getSeconds())}${off < 0 ? '-' : '+'}` +
    `${two(Math.floor(Math.abs(off) / 60))}:${two(Math.abs(off) % 60)}`;
}

// A time in a list: how long ago (kept current by `tick`), and when on hover.
export function when(iso) {
  if (!iso) return '';
  return h('time', { datetime: iso, title: exact(iso), class: 'ago' }, ago(iso));
}

// A time in a detail: when.
export function at(iso) {
  if (!iso) return '';
  return h('time', { datetime: iso }, exact(iso));
}

// Keep every list time on the page current.
export function tick(root) {
  const now = Date.now();
  for (const t of root.querySelectorAll('time.ago')) t.textContent = ago(t.dateTime, now);
}

export function usd(n) {
  return n === null || n === undefined ? '—' : '$' + Number(n).toFixed(n < 1 ? 4 : 2);
}

export function table(caption, columns, rows, cells) {
  const head = h('tr', null, columns.map((c) => h('th', { scope: 'col' }, c)));
  const body = rows.map((row) => {
    const tr = h('tr');
    cells(row).forEach((cell, i) => tr.append(h('td', { 'data-label': columns[i] }, cell)));
    return tr;
  });
  return h('table', { class: 'list' }, h('caption', null, caption), h('thead', null, head),
    h('tbody', null, body));
}

export function section(title, ...children) {
  return h('section', null, h('h2', null, title), children);
}

export function field(label, control) {
  const id = 'f-' + Math.random().toString(36).slice(2, 10);
  control.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, label), control);
}

export function select(name, options, value) {
  return h('select', { name }, options.map(([v, text]) =>
    h('option', { value: v, selected: v === value }, text)));
}

export function button(text, onclick, attrs) {
  return h('button', { type: 'button', ...(attrs || {}), onclick }, text);
}
