"""EG13 with alarms (I10), every service a process: alarms are set through the owner's chat, the
dev server is stopped and its database file deleted (one alarm falls due meanwhile), the server
starts empty and a re-arm runs: the rebuilt supervisor reads the alarms from the database and
every alarm fires exactly once (one that fired before the loss does not fire again)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S
from stack import Owner, Stack, one, rows, until
from test_temporal_outage import all_done, answered, stack, temporal  # noqa: F401

from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import DatabaseSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "ops"
SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents:
    - {{name: front, model: {{provider: local, name: scripted}}, tools: [set_alarm, list_alarms]}}
  triggers:
    - {{kind: chat}}
"""
# Before the loss; due while Temporal is gone; two after the re-arm.
ALARMS = {"early": 1, "during": 8, "after-1": 30, "after-2": 35}


def alarm_status(url: str) -> dict[str, str]:
    return {r["text"]: r["status"] for r in rows(url, "SELECT text, status FROM alarms")}


def routed(url: str) -> bool:
    return one(url, "SELECT count(*) FROM bus_ingress WHERE status = 'accepted'") == 0


def test_alarms_fire_exactly_once_after_an_emptied_temporal_database_is_rearmed(
    stack: Stack,  # noqa: F811
    temporal: TemporalDevServer,  # noqa: F811
    db_settings: DatabaseSettings,
) -> None:
    url = db_settings.url
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(SPEC, NAME)
    calls = [f"call: set_alarm {json.dumps({'text': t, 'in_s': s})}" for t, s in ALARMS.items()]
    message = owner.chat(NAME, "set them\n" + "\n".join(calls))
    until(lambda: answered(owner, [message]), 60, "the alarms set", stack)
    assert set(alarm_status(url)) == set(ALARMS)
    until(lambda: alarm_status(url)["early"] == "fired", 30, "the early alarm fired", stack)

    temporal.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{temporal.db_path}{suffix}").unlink(missing_ok=True)
    during = one(url, "SELECT due_at FROM alarms WHERE text = 'during'")
    until(lambda: datetime.now(UTC) > during + timedelta(seconds=1), 30,
          "the `during` alarm due while Temporal is gone", stack)  # fmt: skip
    assert alarm_status(url)["during"] == "scheduled"
    temporal.start()  # same ports, an empty database
    answer = owner.call("POST", "/v1/rearm")
    assert answer.status_code == 202, answer.text
    rearm_id = answer.json()["id"]
    until(lambda: one(url, "SELECT state FROM intents WHERE id = %(i)s", {"i": rearm_id})
          == "applied", 60, "the re-arm applied", stack)  # fmt: skip
    until(lambda: set(alarm_status(url).values()) == {"fired"} and routed(url) and all_done(url),
          120, "every alarm fired and consumed after the re-arm", stack)  # fmt: skip

    inputs = rows(url, "SELECT dedupe_key, status, envelope FROM bus_ingress "
                       "WHERE source_key = %(s)s", {"s": f"alarm:{NAME}"})  # fmt: skip
    texts = sorted(i["envelope"]["data"]["text"] for i in inputs)
    assert texts == sorted(ALARMS)  # each alarm once
    assert {i["status"] for i in inputs} == {"routed"}
    deliveries = rows(url, "SELECT d.status FROM bus_deliveries d JOIN bus_ingress i "
                           "ON i.id = d.ingress_id WHERE i.source_key = %(s)s",
                      {"s": f"alarm:{NAME}"})  # fmt: skip
    assert len(deliveries) == len(ALARMS) and {d["status"] for d in deliveries} == {"done"}
    (late,) = [i for i in inputs if i["envelope"]["data"]["text"] == "during"]
    assert late["envelope"]["data"]["lateness_s"] > 1  # it fired after the re-arm, late
