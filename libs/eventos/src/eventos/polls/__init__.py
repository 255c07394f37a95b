"""Poll triggers (SPEC §7 PollWorkflow, §15): an HTTP JSON endpoint read page by page into the
bus, its cursor advanced in the transaction that appends the page."""
