"""The employee timeline and why its inputs wait (SPEC §12, §17; docs/timeline.md).

The timeline is a table written by triggers in the transactions that record what happened
(the migration 0022_timeline.sql holds what each writes); a turn's start, which knows its
inputs only in the turn, is written here. `entries` pages it, `words` says each entry in
words, `waiting` and `gates` tell why an input is not consumed yet.
"""

from eventos.timeline.writes import turn_started

__all__ = ["turn_started"]
