-- name: poll_cursor_create
-- A poll trigger's row, at its first attempt: no cursor yet, the trigger's base interval.
INSERT INTO poll_cursors (employee, generation, trigger_name, interval_s)
VALUES (%(employee)s, %(generation)s, %(trigger)s, %(interval_s)s)
ON CONFLICT (employee, generation, trigger_name) DO NOTHING;

-- name: poll_cursor_get
-- A poll trigger's cursor, failures, next interval and revision (the fence of its next write).
SELECT cursor, failures, interval_s, revision, appended, skipped, last_polled_at, last_error
FROM poll_cursors
WHERE employee = %(employee)s AND generation = %(generation)s AND trigger_name = %(trigger)s;

-- name: poll_cursor_lock
-- Lock the row for the transaction that appends a page; the caller compares the revision with
-- the one its fetch started from (a stale attempt writes nothing).
SELECT revision FROM poll_cursors
WHERE employee = %(employee)s AND generation = %(generation)s AND trigger_name = %(trigger)s
FOR UPDATE;

-- name: poll_dedupe_known
-- The dedupe keys among these that the source already holds within the dedupe window.
SELECT dedupe_key FROM bus_dedupe
WHERE source_key = %(source_key)s AND dedupe_key = ANY(%(keys)s) AND expires_at > now();

-- name: poll_cursor_advance
-- A successful cycle: the next cursor (the same one while the page is not all appended),
-- failures cleared, the base interval again.
UPDATE poll_cursors
SET cursor = %(cursor)s, failures = 0, interval_s = %(interval_s)s, revision = revision + 1,
    appended = appended + %(appended)s, last_polled_at = now(), last_error = NULL,
    updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND trigger_name = %(trigger)s;

-- name: poll_cursor_fail
-- A failed cycle: one more consecutive failure, the doubled interval, the error; the cursor
-- stays. Only from the revision the attempt read (no row: a stale attempt, nothing written).
UPDATE poll_cursors
SET failures = failures + 1, interval_s = %(interval_s)s, revision = revision + 1,
    last_polled_at = now(), last_error = %(error)s, updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND trigger_name = %(trigger)s
  AND revision = %(revision)s
RETURNING failures;

-- name: poll_cursor_skip
-- A skipped cycle (too many of the source's rows unrouted): counted; the cursor stays.
UPDATE poll_cursors SET skipped = skipped + 1, updated_at = now()
WHERE employee = %(employee)s AND generation = %(generation)s AND trigger_name = %(trigger)s;

-- name: poll_hold
-- Why an employee's background work is held now (SPEC §9, §12): its budget past normal, or the
-- employee degraded; NULL when nothing holds it. A held poll fetches nothing.
SELECT CASE WHEN coalesce(b.state, 'normal') <> 'normal' THEN 'budget'
            WHEN h.degraded_since IS NOT NULL THEN 'degraded' END AS hold
FROM (SELECT %(employee)s::text AS employee) e
LEFT JOIN employee_budgets b ON b.employee = e.employee
LEFT JOIN employee_health h ON h.employee = e.employee;
