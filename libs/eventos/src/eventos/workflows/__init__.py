"""The Temporal workflow definitions (SPEC §7): the conversation entity, the turn, the employee
supervisor, approvals, polls and schedule fires. Sandboxed: they import only side-effect-free
modules (names, contracts, their own policies)."""
