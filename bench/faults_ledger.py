"""The fault run's accounting: what the senders saw acknowledged against the inbox, every routed
input against its consumption, every reply and effect where it arrived, and what the senders
were answered while PostgreSQL or Temporal was down. Each line says whether it adds up and,
when it does not, names the events.

Replies and effects are counted where they arrive (each audience's event stream as the client
read it, the Telegram fake, the loopback server), never from the outbox's own status; the
database is read for what a sender cannot see (inbox rows, deliveries, turns, transcripts).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from faults_book import CHANNELS, TAG, Attempt, Book
from faults_instance import POSTGRES, TEMPORAL
from faults_schedule import KILL, LOSE, Done
from psycopg.rows import dict_row

from eventos import names

SHOWN = 8  # events named per line that does not add up
OPEN_DELIVERY = ("pending", "held", "delivered")
NOT_DONE_TURN = ("failed", "cancelled", "interrupted")


@dataclass
class Line:
    """One line of the ledger."""

    label: str
    figures: str
    wrong: list[str] = field(default_factory=list)  # the events that do not add up
    checked: bool = True  # False: figures only

    @property
    def ok(self) -> bool:
        return not self.wrong

    def render(self) -> str:
        mark = "  " if not self.checked else ("OK" if self.ok else "!!")
        text = f"{mark} {self.label:<44} {self.figures}"
        if self.wrong:
            more = f" (+{len(self.wrong) - SHOWN} more)" if len(self.wrong) > SHOWN else ""
            text += "\n      " + "\n      ".join(self.wrong[:SHOWN]) + more
        return text


@dataclass
class Receivers:
    """What arrived where it goes, read once the run drained."""

    telegram_sent: list[dict[str, Any]]  # the Bot API fake's sent messages
    effects: dict[str, int]  # tool tag → requests that reached the loopback server


@dataclass
class Ledger:
    seed: int
    lines: list[Line] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines)

    def render(self) -> str:
        verdict = "every line adds up" if self.ok else "LINES THAT DO NOT ADD UP (!!)"
        body = "\n".join(line.render() for line in self.lines)
        return f"ledger of seed {self.seed}: {verdict}\n{body}"

    def line(self, label: str) -> Line:
        return next(line for line in self.lines if line.label == label)


def rows(conn: psycopg.Connection[Any], query: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


def tags_of(value: Any) -> set[str]:
    return set(TAG.findall(str(value)))


def account(seed: int, url: str, book: Book, receivers: Receivers, faults: list[Done]) -> Ledger:
    """The ledger of one run, from the database, the book and the receivers."""
    ledger = Ledger(seed)
    attempts, acked = book.snapshot()
    with psycopg.connect(url, autocommit=True) as conn:
        ledger.lines += [faults_line(faults)]
        ledger.lines += inbox_lines(conn, acked)
        ledger.lines += consumption_lines(conn)
        ledger.lines += turns_lines(conn, book)
        ledger.lines += chat_reply_lines(conn, book)
        ledger.lines += [telegram_line(conn, receivers), tools_line(conn, book, receivers)]
        ledger.lines += outage_lines(conn, attempts, faults)
    return ledger


def faults_line(faults: list[Done]) -> Line:
    kills = collections.Counter(d.fault.target for d in faults if d.fault.kind == KILL)
    losses = collections.Counter(d.fault.target for d in faults if d.fault.kind == LOSE)
    figures = ", ".join(f"{t} {n}x" for t, n in sorted(kills.items()))
    figures += "; lost: " + ", ".join(f"{t} {n}x" for t, n in sorted(losses.items()))
    never = [f"{d.label} at {_clock(d.began)}: the instance never became whole again"
             for d in faults if not d.back]  # fmt: skip
    return Line("faults (killed / lost)", figures, never)


def inbox_lines(conn: psycopg.Connection[Any], acked: dict[str, Any]) -> list[Line]:
    """Every acknowledged event in the inbox exactly once."""
    stored = collections.Counter(
        (r["source_key"], r["dedupe_key"])
        for r in rows(conn, "SELECT source_key, dedupe_key FROM bus_ingress")
    )
    per_channel = collections.Counter(a.channel for a in acked.values())
    lost, doubled = [], []
    for a in acked.values():
        n = stored[(a.source_key, a.dedupe_key)]
        if n == 0:
            lost.append(f"{a.tag} ({a.source_key} {a.dedupe_key}) acknowledged at "
                        f"{_clock(a.at)}, not in the inbox")  # fmt: skip
        elif n > 1:
            doubled.append(f"{a.tag} ({a.source_key} {a.dedupe_key}) in the inbox {n} times")
    shown = ", ".join(f"{c} {per_channel[c]}" for c in CHANNELS)
    return [
        Line("acknowledged events", f"{len(acked)} ({shown})", checked=False),
        Line("acknowledged, not in the inbox (lost)", str(len(lost)), lost),
        Line("in the inbox more than once (doubled)", str(len(doubled)), doubled),
    ]


def consumption_lines(conn: psycopg.Connection[Any]) -> list[Line]:
    """Every inbox row routed, every delivery done or dead with a reason."""
    unrouted = rows(conn, "SELECT id, source_key, dedupe_key, envelope FROM bus_ingress "
                          "WHERE status = 'accepted' ORDER BY id")  # fmt: skip
    deliveries = rows(conn, "SELECT stream_key, seq, status, reason, payload, class "
                            "FROM bus_deliveries ORDER BY id")  # fmt: skip
    by_status = collections.Counter(d["status"] for d in deliveries)
    dead = collections.Counter(d["reason"] or "(no reason)" for d in deliveries
                               if d["status"] in ("dead", "failed"))  # fmt: skip
    stranded = [f"{_tag(d['payload'])} {d['stream_key']}#{d['seq']} left {d['status']}"
                for d in deliveries if d["status"] in OPEN_DELIVERY]  # fmt: skip
    no_reason = [f"{_tag(d['payload'])} {d['stream_key']}#{d['seq']} {d['status']} without a "
                 "reason" for d in deliveries
                 if d["status"] in ("dead", "failed") and not d["reason"]]  # fmt: skip
    return [
        Line("inbox rows never routed", str(len(unrouted)),
             [f"{_tag(r['envelope'])} ({r['source_key']} {r['dedupe_key']}) still accepted"
              for r in unrouted]),
        Line("deliveries", ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
             + (f"; dead by reason: {dict(dead)}" if dead else ""), checked=False),
        Line("deliveries stranded after the drain", str(len(stranded)), stranded),
        Line("deliveries dead without a reason", str(len(no_reason)), no_reason),
    ]  # fmt: skip


def transcripts(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], set[str]]:
    """(employee, tag) → the turns whose saved transcript holds the tag in a user message."""
    consumed: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for r in rows(conn, "SELECT employee, turn_id, message FROM transcript_messages "
                        "WHERE message->>'role' = 'user'"):  # fmt: skip
        for tag in tags_of(r["message"].get("content")):
            consumed[(r["employee"], tag)].add(r["turn_id"])
    return consumed


def turns_lines(conn: psycopg.Connection[Any], book: Book) -> list[Line]:
    """Every input consumed by a turn, and by one only unless every one but the last was
    recorded as not done: from the transcripts (what a done turn saved) and the chat streams
    (what a turn took)."""
    status = {r["id"]: r["status"] for r in rows(conn, "SELECT id, status FROM turns")}
    consumed = transcripts(conn)
    wrong = [f"{tag} consumed by {len(t)} done turns of {emp}: {sorted(t)}"
             for (emp, tag), t in consumed.items() if len(t) > 1]  # fmt: skip
    for message_id, turns in taken_by(book).items():
        done = [t for t in turns if status.get(t) not in NOT_DONE_TURN]
        if len(done) > 1:
            wrong.append(f"chat message {message_id} taken by {len(done)} turns not recorded "
                         f"as failed: {[(t, status.get(t)) for t in done]}")  # fmt: skip
    unseen = unconsumed(conn, consumed)
    # The run restarts Temporal on its own state and never empties it: a turn a re-arm found
    # lost was never started as a workflow, and held its slot until then.
    ended = rows(conn, "SELECT id, extract(epoch FROM ended_at - started_at)::float8 AS held_s "
                       "FROM turns WHERE error = 'lost by Temporal'")  # fmt: skip
    lost = [f"{r['id']} ended by a re-arm after {r['held_s']:.0f} s: Temporal never ran it"
            for r in ended]  # fmt: skip
    by_status = collections.Counter(status.values())
    figures = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
    return [
        Line("turns", figures, checked=False),
        Line("an input taken by two live turns", str(len(wrong)), wrong),
        Line("an input done, consumed by no turn (lost)", str(len(unseen)), unseen),
        Line("turns Temporal never ran (a slot held)", str(len(lost)), lost),
    ]


def unconsumed(conn: psycopg.Connection[Any], consumed: dict[tuple[str, str], set[str]]
               ) -> list[str]:  # fmt: skip
    """Deliveries marked done whose input no done turn's transcript holds."""
    # A transcript past its stored bound lost its oldest rows: its inputs are not looked for.
    trimmed = {(r["employee"], r["thread"]) for r in rows(
        conn, "SELECT employee, thread FROM transcript_messages GROUP BY employee, "
              "generation, agent, thread HAVING min(n) > 1")}  # fmt: skip
    done = rows(conn, "SELECT d.stream_key, d.seq, d.payload, d.thread, s.employee FROM "
                      "bus_deliveries d JOIN bus_streams s USING (stream_key) "
                      "WHERE d.status = 'done' ORDER BY d.id")  # fmt: skip
    unseen = []
    for d in done:
        tags = tags_of(d["payload"])
        if not tags or (d["employee"], d["thread"]) in trimmed:
            continue
        if not any((d["employee"], t) in consumed for t in tags):
            unseen.append(f"{_tag(tags)} {d['stream_key']}#{d['seq']} done, in no turn's "
                          "transcript")  # fmt: skip
    return unseen


def taken_by(book: Book) -> dict[int, list[str]]:
    """Chat message id → the turns its audience's stream said took it, in order."""
    taken: dict[int, list[str]] = collections.defaultdict(list)
    for events in book.streams.values():
        for _, e in sorted(events.items()):
            for m in e.get("message_ids") or []:
                if e["turn_id"] not in taken[int(m)]:
                    taken[int(m)].append(e["turn_id"])
    return taken


def chat_reply_lines(conn: psycopg.Connection[Any], book: Book) -> list[Line]:
    """Each owner-chat message answered at most once, as its audience's stream showed it."""
    replies: dict[str, list[int]] = collections.defaultdict(list)  # turn → reply event ids
    for events in book.streams.values():
        for event_id, e in events.items():
            if e["event"] == "reply":
                replies[e["turn_id"]].append(event_id)
    doubled, unanswered = [], []
    taken = taken_by(book)
    messages = rows(conn, "SELECT id, status FROM chat_messages")
    for m in messages:
        seen = sorted({r for t in taken.get(m["id"], []) for r in replies.get(t, [])})
        if len(seen) > 1:
            doubled.append(f"chat message {m['id']} answered {len(seen)} times: events {seen}")
        if m["status"] == "answered" and not seen:
            unanswered.append(f"chat message {m['id']} answered, no reply in its stream")
    stored = rows(conn, "SELECT audience, id FROM chat_events ORDER BY id")
    behind = [f"{r['audience']}'s stream never showed chat event {r['id']}" for r in stored
              if r["id"] not in book.streams.get(r["audience"], {})]  # fmt: skip
    statuses = collections.Counter(m["status"] for m in messages)
    figures = (f"{len(messages)} messages ({dict(statuses)}), "
               f"{sum(len(v) for v in replies.values())} replies read")  # fmt: skip
    repeats = dict(book.stream_repeats)
    return [
        Line("owner chat: replies at the reader", figures + (f"; repeats {repeats}"
                                                             if repeats else ""), behind),
        Line("owner chat: a message answered twice", str(len(doubled)), doubled),
        Line("owner chat: answered, reply never read", str(len(unanswered)), unanswered),
    ]  # fmt: skip


def telegram_line(conn: psycopg.Connection[Any], receivers: Receivers) -> Line:
    """Each reply reached the customer at most once, or is `unknown` with an attention item;
    counted at the fake against the outbox rows of the same text."""
    outbox = rows(conn, "SELECT o.id, o.body, o.status, a.id AS item FROM outbound_messages o "
                        "LEFT JOIN attention_items a ON a.ref = 'outbox#' || o.id "
                        "AND a.kind = 'send_unknown' AND a.state = 'open' "
                        "WHERE o.kind <> 'chat'")  # fmt: skip
    arrived = collections.Counter(m["text"] for m in receivers.telegram_sent)
    by_body: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for o in outbox:
        by_body[o["body"]].append(o)
    wrong = []
    for body, group in by_body.items():
        sent = sum(o["status"] == "sent" for o in group)
        maybe = sum(o["status"] == "unknown" for o in group)
        if arrived[body] > sent + maybe:
            wrong.append(f"{_tag(body)} reached the customer {arrived[body]} times, "
                         f"{len(group)} outbox rows")  # fmt: skip
        elif arrived[body] < sent:
            wrong.append(f"{_tag(body)} sent {sent} times, reached the customer {arrived[body]}")
        wrong += [f"outbox row {o['id']} ({_tag(body)}) {o['status']} after the drain"
                  for o in group if o["status"] in ("queued", "sending")]  # fmt: skip
        wrong += [f"outbox row {o['id']} ({_tag(body)}) unknown without an attention item"
                  for o in group if o["status"] == "unknown" and o["item"] is None]  # fmt: skip
    wrong += [f"{_tag(b)} reached the customer {n} times with no outbox row"
              for b, n in arrived.items() if b not in by_body]  # fmt: skip
    statuses = collections.Counter(o["status"] for o in outbox)
    figures = f"{sum(arrived.values())} at the fake; outbox {dict(statuses)}"
    return Line("telegram replies at the customer", figures, wrong)


def tools_line(conn: psycopg.Connection[Any], book: Book, receivers: Receivers) -> Line:
    """Each unsafe http_request reached the server at most once; a call that did not answer
    is `unknown` with an attention item; a call recorded done arrived."""
    calls = rows(conn, "SELECT c.id, c.status, c.arguments->>'url' AS url, a.id AS item "
                       "FROM tool_calls c LEFT JOIN attention_items a ON a.ref = c.id "
                       "AND a.kind = 'tool_unknown' AND a.state = 'open'")  # fmt: skip
    by_tag: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for c in calls:
        by_tag[_tag(c["url"])].append(c)
    wrong = []
    for tag in sorted(book.tools | set(receivers.effects) | set(by_tag)):
        n, group = receivers.effects.get(tag, 0), by_tag.get(tag, [])
        statuses = [c["status"] for c in group]
        if n > 1 or len(group) > 1:
            wrong.append(f"{tag}: reached the server {n} times, {len(group)} calls {statuses}")
        elif group and statuses[0] == "done" and n != 1:
            wrong.append(f"{tag}: call done, reached the server {n} times")
        elif not group and n:
            wrong.append(f"{tag}: reached the server {n} times with no call recorded")
        wrong += [f"{tag}: call {c['id']} unknown without an attention item"
                  for c in group if c["status"] == "unknown" and c["item"] is None]  # fmt: skip
        wrong += [f"{tag}: call {c['id']} still calling after the drain"
                  for c in group if c["status"] == "calling"]  # fmt: skip
    by_status = collections.Counter(c["status"] for c in calls)
    figures = (f"{len(book.tools)} asked, {sum(receivers.effects.values())} arrivals; "
               f"calls {dict(by_status)}")  # fmt: skip
    return Line("tool effects at the server", figures, wrong)


def outage_lines(conn: psycopg.Connection[Any], attempts: list[Attempt],
                 faults: list[Done]) -> list[Line]:  # fmt: skip
    """While PostgreSQL was down no sender was told yes; while Temporal was down every
    sender was; the backlog drained after each, the owner's class first after Temporal."""
    pg = [d for d in faults if d.fault.kind == LOSE and d.fault.target == POSTGRES]
    tp = [d for d in faults if d.fault.kind == LOSE and d.fault.target == TEMPORAL]
    yes = [
        f"{a.channel} {a.tag} answered {a.answer} at {_clock(a.ended)} (PostgreSQL down "
        f"{_clock(d.down)}-{_clock(d.up)})"
        for d in pg
        for a in during(attempts, d)
        if a.ok
    ]
    no = [f"{a.channel} {a.tag} answered {a.answer} at {_clock(a.ended)} (Temporal down "
          f"{_clock(d.down)}-{_clock(d.up)})" for d in tp for a in during(attempts, d)
          if not a.ok]  # fmt: skip
    drains, late = [], []
    for d in pg + tp:
        per_class = drain_times(conn, d)
        drains.append(f"{d.fault.target} at {_clock(d.down)}: " + ", ".join(
            f"C{k} {s:.0f} s" for k, s in sorted(per_class.items())) if per_class
            else f"{d.fault.target} at {_clock(d.down)}: no backlog")  # fmt: skip
        if d in tp and 1 in per_class:
            late += owner_behind(conn, d)
    counted = sum(1 for d in pg + tp for _ in during(attempts, d))
    answered_pg = sum(len(during(attempts, d)) for d in pg)
    return [
        Line("2xx while PostgreSQL was down", f"{len(yes)} of the {answered_pg} answers in "
             f"{len(pg)} outages", yes),
        Line("not 2xx while Temporal was down", f"{len(no)} ({counted} answers during all "
             "outages)", no),
        Line("owner's backlog taken first after Temporal", f"{len(late)}", late),
        Line("time to drain after each outage", "; ".join(drains) or "none", checked=False),
    ]  # fmt: skip


OLDEST_INPUT = """
SELECT extract(epoch FROM d.created_at)::float8 AS arrived,
       (SELECT extract(epoch FROM max(e.at))::float8 FROM employee_timeline e
        WHERE e.employee = %(employee)s AND e.kind = 'input.delivered' AND e.ref = d.id::text
          AND e.at <= %(started)s) AS delivered
FROM bus_deliveries d WHERE d.stream_key = %(stream)s AND d.updated_at >= %(started)s
ORDER BY d.seq LIMIT 1"""


def owner_behind(conn: psycopg.Connection[Any], d: Done) -> list[str]:
    """Once Temporal is back every waiting entity asks for a slot at once: the owner's
    first turn must be in the first wave of its employee's turns (the employee's cap of
    lower-class turns may start beside it), not queued behind the lower-class backlog. An
    owner turn under way when Temporal went is finished first (a conversation runs one turn at
    a time, and a step lost with the server waits for its timeout): the wave is then counted
    from that turn's end; and the first owner turn's oldest input, when it reached its entity
    after that, counts from then: from its arrival (the turn under way took the backlog, or the
    message was sent after Temporal was back) or its delivery (written while Temporal was gone,
    it waits for the relay's breaker, which probes every 5 s, while the lower classes' inputs
    delivered before the loss start their turns). (Fault runs on a saturated machine failed
    here while the owner was granted at once: counted from the turn's end, the turn under way
    had taken the whole backlog and the next owner turn was for a message 5 s later; counted
    from Temporal's return, five customer turns delivered before the loss started in the 2.7 s
    before the relay's probe, which then delivered the owner's two messages first of all.)"""
    busy = {r["employee"]: r["ended"] for r in rows(
        conn, "SELECT employee, extract(epoch FROM max(coalesce(ended_at, now())))::float8 "
              "AS ended FROM turns WHERE class = 1 AND started_at < to_timestamp(%(down)s) "
              "AND (ended_at IS NULL OR ended_at > to_timestamp(%(down)s)) GROUP BY employee",
        {"down": d.down})}  # fmt: skip
    after = rows(conn, "SELECT employee, class, stream_key, started_at, "
                       "extract(epoch FROM started_at)::float8 AS t FROM turns "
                       "WHERE started_at > to_timestamp(%(up)s) AND employee IN "
                       "(SELECT employee FROM turns WHERE class = 1) ORDER BY started_at",
                 {"up": d.up})  # fmt: skip
    wrong = []
    for employee in sorted({r["employee"] for r in after}):
        since = max(d.up, busy.get(employee, 0.0))
        mine = [r for r in after if r["employee"] == employee and r["t"] > since]
        owner = next((r for r in mine if r["class"] == 1), None)
        if owner is None:
            continue
        # Its oldest input: the first delivery of its stream settled from its start on (FIFO;
        # those the turn under way took were settled before), and when the relay last
        # delivered it before the turn started.
        params = {"stream": owner["stream_key"], "started": owner["started_at"],
                  "employee": employee}  # fmt: skip
        for first in rows(conn, OLDEST_INPUT, params):
            since = max(since, first["arrived"], first["delivered"] or 0.0)
        order = [r["class"] for r in mine if r["t"] > since]
        if 1 in order and order.index(1) > names.EMPLOYEE_TURN_CAP:
            wrong.append(f"Temporal back at {_clock(d.up)}: {employee}'s first owner turn "
                         f"came after {order.index(1)} others"
                         + (f" (counted from {_clock(since)}: the end of its owner turn under "
                            "way or its first input's arrival or delivery)"
                            if since > d.up else "")
                         + f": {order[:12]}")  # fmt: skip
    return wrong


def during(attempts: Iterable[Attempt], d: Done) -> list[Attempt]:
    """Attempts that began after the server was gone and were answered before it started
    again (an attempt under way when it went down may have committed before)."""
    return [a for a in attempts if a.began > d.down and a.ended < d.up]


def drain_times(conn: psycopg.Connection[Any], d: Done) -> dict[int, float]:
    """Per class, seconds from the server's start to the last of the deliveries that waited
    for it (made before it started, settled after)."""
    found = rows(conn, "SELECT class, extract(epoch FROM max(updated_at) - to_timestamp(%(up)s))"
                       "::float8 AS s FROM bus_deliveries WHERE created_at < to_timestamp(%(up)s)"
                       " AND updated_at > to_timestamp(%(up)s) AND status IN ('done', 'dead')"
                       " GROUP BY class", {"up": d.up})  # fmt: skip
    return {int(r["class"]): float(r["s"]) for r in found}


def _tag(value: Any) -> str:
    found = sorted(tags_of(value))
    return found[0] if found else "(untagged)"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")
