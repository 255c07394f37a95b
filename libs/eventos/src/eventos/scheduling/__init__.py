"""Scheduling and budgets (SPEC §9): who gets the next turn slot (`policy`, pure), its
database side (`admission`), and the daily spend ledger that moves a budget `normal` → `high` →
`max` (`ledger`)."""
