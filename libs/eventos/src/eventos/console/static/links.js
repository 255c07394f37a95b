// The admin's links from an item to its employee's page and its turn's (pages a user token may
// not open: a user sees the employee's name only).
import { link } from './dom.js';

export function about(me, employee, turnId) {
  if (!me.admin || !employee) return employee || '';
  return [link(['employee', employee], employee),
    turnId ? [' · ', link(['turn', employee, turnId], `turn ${turnId.slice(turnId.lastIndexOf('-') + 1)}`)] : ''];
}
