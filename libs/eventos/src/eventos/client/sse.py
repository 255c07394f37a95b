"""Server-sent events, read line by line (the WHATWG event stream format), for clients of the
owner API's streams (`eventosctl --watch`, tests)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Block:
    """One block of the stream: an event (`data` set), or only a new `id` (a keep-alive that
    moves the reader's place without an event)."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    retry_ms: int | None = None


@dataclass
class Parser:
    """Feed it lines (without their line ends); it answers a Block at each blank line that ends
    one with a field (comments alone are no block)."""

    _fields: dict[str, str] = field(default_factory=dict)
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Block | None:
        """The block this line ends, if it ends one."""
        if not line:
            return self._end()
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "data":
            self._data.append(value)
        elif key in ("id", "event", "retry") and "\0" not in value:
            self._fields[key] = value
        return None

    def _end(self) -> Block | None:
        if not self._fields and not self._data:
            return None
        retry = self._fields.get("retry", "")
        block = Block(self._fields.get("id"), self._fields.get("event"),
                      "\n".join(self._data) if self._data else None,
                      int(retry) if retry.isdigit() else None)  # fmt: skip
        self._fields, self._data = {}, []
        return block
