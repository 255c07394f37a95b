"""Agent tools (SPEC §10, §11, §17): what an employee can do besides talking.

`base` holds what a tool is (schema, effect class, handler); `registry` is the one table of
every tool; `runner` runs one call under the `unknown` rule; `activity` is its Temporal side.
Each family of tools has its module (`alarms`, `messaging`, `data`, `http`).
"""
