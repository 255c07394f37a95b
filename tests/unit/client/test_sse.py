"""Reading server-sent events line by line: events, id-only blocks (a keep-alive that moves the
place), comments, multi-line data, retry."""

from __future__ import annotations

from eventos.client.sse import Block, Parser


def blocks(text: str) -> list[Block]:
    parser = Parser()
    found = [parser.feed(line) for line in text.split("\n")]
    return [b for b in found if b is not None]


def test_events_keep_alives_and_comments() -> None:
    stream = (": connected\nid: 7\n\n"
              "id: 8\nevent: turn.done\ndata: {\"a\": 1}\n\n"
              ": keep-alive\n\n"
              ": keep-alive\nid: 12\n\n"
              "data: one\ndata: two\n\n"
              "retry: 5000\n: database unavailable\n\n")  # fmt: skip
    assert blocks(stream) == [
        Block(id="7"),
        Block(id="8", event="turn.done", data='{"a": 1}'),
        Block(id="12"),
        Block(data="one\ntwo"),
        Block(retry_ms=5000),
    ]


def test_a_field_without_a_space_and_an_id_with_nul_are_read_as_the_format_says() -> None:
    assert blocks("id:9\nevent:x\ndata:y\n\n") == [Block(id="9", event="x", data="y")]
    assert blocks("id: 1\0\ndata: z\n\n") == [Block(data="z")]  # such an id is ignored
