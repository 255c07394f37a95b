-- name: upgrade_run_generations
-- The generation each workflow id belongs to, where the database knows it: an approval by its
-- row, a supervisor (`emp-<employee>-g<gen>`), an entity, turn, poll or cron tick by id prefix
-- (`conv-`, `turn-`, `poll-`, `cron-` then `<employee>-g<gen>-`); the upgrade's "needs Reset".
SELECT w.id, coalesce(a.employee, g.employee) AS employee,
       coalesce(a.generation, g.generation) AS generation
FROM unnest(%(ids)s::text[]) AS w(id)
LEFT JOIN approvals a ON starts_with(w.id, 'approval-') AND a.id = substr(w.id, 10)
LEFT JOIN LATERAL (
    SELECT employee, generation FROM generations
    WHERE w.id = 'emp-' || employee || '-g' || generation
       OR starts_with(w.id, 'conv-' || employee || '-g' || generation || '-')
       OR starts_with(w.id, 'turn-' || employee || '-g' || generation || '-')
       OR starts_with(w.id, 'poll-' || employee || '-g' || generation || '-')
       OR starts_with(w.id, 'cron-' || employee || '-g' || generation || '-')
    ORDER BY length(employee) DESC LIMIT 1) g ON true;
