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

// A link to a console page: hash routes carry only employee names and ids.
export function link(route, text) {
  return h('a', { href: '#/' + route.map(encodeURIComponent).join('/') }, text);
}

export function when(iso) {
  if (!iso) return '';
  const t = new Date(iso);
  return h('time', { datetime: iso, title: iso }, t.toLocaleString());
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
