"""The Temporal workflow definitions (SPEC §7): the conversation entity, the turn, the employee
supervisor, approvals, polls and schedule fires. Sandboxed: they import only side-effect-free
modules (names, contracts, their own policies), inside `imports_passed_through()` and each by
its full name (`import eventos.names as names`): the sandbox runs a workflow's module anew for
every workflow instance, and `from eventos import names` would load `names` anew with it (the
sandbox's `eventos` is its own package; tests/unit/workflows/test_sandbox_imports.py)."""
