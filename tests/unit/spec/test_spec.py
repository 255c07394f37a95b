"""Employee spec parsing: the SPEC §3 example is valid; every error names its field path."""

from __future__ import annotations

import pytest

from eventos import names
from eventos.employees.lifecycle import compile_subscriptions
from eventos.errors import SpecInvalid
from eventos.spec.model import load_specs, parse_spec, yaml_documents

EXAMPLE = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: support}
spec:
  timezone: Europe/Berlin
  budget: {daily_usd: 20}
  agents:
    - name: front
      model: {provider: openai, name: gpt-4.1-mini, credential: openai-main}
      system: You answer customers of ACME.
      tools: [set_alarm, send_to_employee, delegate_to_employee, http_request]
      http_hosts: [api.acme.example]
  triggers:
    - {kind: chat}
    - {kind: webhook, path: stripe, verify: {scheme: stripe, secret: stripe-whsec}, class: C3}
    - {kind: telegram, account: tg-main}
    - {kind: cron, schedule: "0 8 * * *", on_busy: skip, text: Morning report}
    - {kind: webhook, path: deploys, verify: {scheme: hmac-sha256, secret: deploy-hook, header: X-Signature}}
"""


def errors_of(text: str) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        load_specs(text)
    return dict(info.value.errors)


def test_the_spec_example_parses_with_default_classes_and_lanes() -> None:
    (spec,) = load_specs(EXAMPLE)
    assert spec.name == "support"
    assert spec.trigger_names() == [
        "chat",
        "webhook-stripe",
        "telegram-2",
        "cron-3",
        "webhook-deploys",
    ]
    assert [t.klass for t in spec.spec.triggers] == [1, 3, 2, 4, 4]
    assert [t.lane for t in spec.spec.triggers] == [
        "talk",
        "worker",
        "customer",
        "worker",
        "worker",
    ]
    rows = compile_subscriptions(spec, 1)
    assert [r["source_key"] for r in rows] == [
        "chat:support", "webhook:stripe", "telegram:tg-main", "cron:support/cron-3", "webhook:deploys",
        "alarm:support", "ipc:support", "tool:support",  # the implicit subscriptions (SPEC §3)
    ]  # fmt: skip
    assert [r["thread_by"] for r in rows[-3:]] == [names.THREAD_BY_EXPLICIT] * 3
    assert rows[2]["thread_by"] == "subject"  # one conversation per customer
    assert {r["agent"] for r in rows} == {"front"}


@pytest.mark.parametrize(
    "schedule",
    ["0 8 * * *", "*/5 * * * *", "0 9 * * mon-fri", "0 9 * JAN-MAR/2 *", "0 9 * * 0-7",
     "@daily", "@hourly", "@weekly", "@monthly", "@yearly", "@annually", "@midnight",
     "@every 10m", "@every 1h30m", "@every 1d"],
)  # fmt: skip
def test_cron_forms_both_cronsim_and_temporal_take_are_accepted(schedule: str) -> None:
    (spec,) = load_specs(EXAMPLE.replace('"0 8 * * *"', f'"{schedule}"'))
    assert spec.spec.triggers[3].schedule == schedule


def test_a_stored_spec_is_read_as_it_was_accepted() -> None:
    """A generation's snapshot stored before a check was added is still read (run time reports
    what Temporal refuses), while apply refuses it."""
    (doc,) = yaml_documents(EXAMPLE.replace('"0 8 * * *"', '"61 * * * *"'))
    assert parse_spec(doc, stored=True).spec.triggers[3].schedule == "61 * * * *"
    with pytest.raises(SpecInvalid):
        parse_spec(doc)


def test_yaml_is_strict_and_names_its_source_line_and_column() -> None:
    twice = EXAMPLE.replace("  budget: {daily_usd: 20}\n",
                            "  budget: {daily_usd: 20}\n  budget: {daily_usd: 5}\n")  # fmt: skip
    assert errors_of(twice) == {
        "(yaml)": "request body:8:3: duplicate key 'budget' (first at line 7)"
    }
    with pytest.raises(SpecInvalid) as info:
        load_specs("a: [1\n", source="team/support.yaml")
    ((path, message),) = info.value.errors
    assert path == "(yaml)" and message.startswith("team/support.yaml:2:1: ")
    # A `<<` merge's key may be overridden: YAML says the written key wins.
    assert yaml_documents("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n") == [
        {"a": {"b": 1}, "c": {"b": 2}}
    ]


@pytest.mark.parametrize(
    ("change", "path", "fragment"),
    [
        (("name: support", "name: Support!"), "metadata.name", "pattern"),
        (("Europe/Berlin", "Mars/Olympus"), "spec.timezone", "unknown time zone"),
        (("daily_usd: 20", "daily_usd: -5"), "spec.budget.daily_usd", "greater than 0"),
        (
            ("secret: stripe-whsec", "secret: whsec_abcdef"),
            "spec.triggers[1].verify.secret",
            "not a secret value",
        ),
        (
            ("credential: openai-main", "credential: sk-live-123"),
            "spec.agents[0].model.credential",
            "not a secret value",
        ),
        (("class: C3", "class: C9"), "spec.triggers[1].class", "C1, C2, C3, C4"),
        (("account: tg-main", "acount: tg-main"), "spec.triggers[2].acount", "Extra inputs"),
        (
            ("{kind: telegram, account: tg-main}", "{kind: telegram}"),
            "spec.triggers[2]",
            "needs 'account'",
        ),
        (('"0 8 * * *"', '"every morning"'), "spec.triggers[3].schedule", "must have 5 fields"),
        (('"0 8 * * *"', '"61 * * * *"'), "spec.triggers[3].schedule", "Bad minute"),
        (('"0 8 * * *"', '"0 8 31 2 *"'), "spec.triggers[3].schedule", "Bad day-of-month"),
        (('"0 8 * * *"', '"0 8 L * *"'), "spec.triggers[3].schedule", "no L, W, ? or #"),
        (('"0 8 * * *"', '"0 8 * * 1#2"'), "spec.triggers[3].schedule", "no L, W, ? or #"),
        (('"0 8 * * *"', '"0 0 8 * * *"'), "spec.triggers[3].schedule", "must have 5 fields"),
        (('"0 8 * * *"', '"TZ=UTC 0 8 * * *"'), "spec.triggers[3].schedule", "5 fields"),
        (('"0 8 * * *"', '"@reboot"'), "spec.triggers[3].schedule", "unknown macro"),
        (('"0 8 * * *"', '"@every 10s"'), "spec.triggers[3].schedule", "at least a minute"),
        (('"0 8 * * *"', '"@every soon"'), "spec.triggers[3].schedule", "takes a duration"),
        (('"0 8 * * *"', '"*/90 * * * *"'), "spec.triggers[3].schedule", "step 90"),
        (("Europe/Berlin", "localtime"), "spec.timezone", "unknown time zone"),
        (("Europe/Berlin", "Local"), "spec.timezone", "unknown time zone"),
        (("kind: chat}", "kind: chat, interval_s: 60}"), "spec.triggers[0]", "poll trigger only"),
        (("kind: chat}", "kind: chat, text: hi}"), "spec.triggers[0]", "cron or start trigger"),
        (("kind: chat}", "kind: chat, account: tg-x}"), "spec.triggers[0]", "telegram or"),
        (("kind: chat}", "kind: chat, driver: d1}"), "spec.triggers[0]", "grpc trigger only"),
        (
            ("kind: chat}", "kind: chat, schedule: '0 8 * * *'}"),
            "spec.triggers[0]",
            "by a cron trigger only",
        ),
        (
            ("account: tg-main}", "account: tg-main, thread_by: data..x}"),
            "spec.triggers[2].thread_by",
            "dotted path",
        ),
        (
            ("account: tg-main}", "account: tg-main, thread_by: explicit}"),
            "spec.triggers[2].thread_by",
            "dotted path",
        ),
        (
            ("account: tg-main}", "account: tg-main, filter: {data..kind: x}}"),
            "spec.triggers[2].filter",
            "dotted path",
        ),
        (
            ("account: tg-main}", "account: tg-main, filter: {data.kind: {a: 1}}}"),
            "spec.triggers[2].filter",
            "a list of values",
        ),
        ((", header: X-Signature", ""), "spec.triggers[4].verify", "needs the header"),
        (("kind: chat}", "kind: pigeon}"), "spec.triggers[0].kind", "Input should be"),
        (("path: stripe", "path: deploys"), "spec.triggers[4].path", "declared twice"),
    ],
)
def test_errors_name_the_field_path(change: tuple[str, str], path: str, fragment: str) -> None:
    errors = errors_of(EXAMPLE.replace(*change))
    matching = {p: m for p, m in errors.items() if p.startswith(path)}
    assert matching, errors
    assert any(fragment in m for m in matching.values()), errors


def test_none_scheme_needs_a_dedupe_header() -> None:
    text = EXAMPLE.replace(
        "{scheme: hmac-sha256, secret: deploy-hook, header: X-Signature}", "{scheme: none}"
    )
    assert any("dedupe_header" in m for m in errors_of(text).values())


def test_unknown_fields_and_agents_are_refused() -> None:
    assert "spec.agents[0].model.api_key" in errors_of(
        EXAMPLE.replace("credential: openai-main", "credential: openai-main, api_key: x")
    )
    text = EXAMPLE.replace("{kind: chat}", "{kind: chat, agent: ghost}")
    assert "no agent named 'ghost'" in errors_of(text)["spec.triggers[0].agent"]


def test_not_a_mapping_and_broken_yaml() -> None:
    assert "(root)" in errors_of("- just\n- a list\n")
    assert "(yaml)" in errors_of("kind: [unclosed")
    assert "(root)" in errors_of("")


def test_several_documents() -> None:
    two = EXAMPLE + "---\n" + EXAMPLE.replace("name: support", "name: sales")
    assert [s.name for s in load_specs(two)] == ["support", "sales"]


def test_default_classes_follow_the_scheduler_table() -> None:
    (spec,) = load_specs(EXAMPLE.replace(", class: C3", ""))
    webhook = spec.spec.triggers[1]
    assert webhook.klass == names.C3_INTERNAL  # signed provider webhooks are internal work
    assert spec.spec.triggers[4].klass == names.C4_BACKGROUND  # generic webhooks are background


def test_llm_class_setting() -> None:
    from eventos.errors import ConfigError
    from eventos.settings import llm_classes

    assert llm_classes({}) == (1, 2, 3, 4)
    assert llm_classes({"LLM_CLASS": "c2"}) == (2,)
    assert llm_classes({"LLM_CLASS": "llm-c3, 1"}) == (1, 3)
    with pytest.raises(ConfigError):
        llm_classes({"LLM_CLASS": "c5"})


DRIVERS = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: courier}
spec:
  agents: [{name: main, model: {provider: local, name: scripted}}]
  triggers:
    - {kind: grpc, driver: drv-1}
    - {kind: grpc, driver: drv-2, token: courier-driver}
"""


def test_a_grpc_trigger_names_its_drivers_token_by_reference() -> None:
    (spec,) = load_specs(DRIVERS)
    rows = compile_subscriptions(spec, 1)
    grpc = [r for r in rows if r["trigger_kind"] == "grpc"]
    assert [(r["source_key"], r["params"].obj["token"]) for r in grpc] == [  # type: ignore[attr-defined]
        ("grpc:drv-1", "driver-drv-1"),
        ("grpc:drv-2", "courier-driver"),
    ]


@pytest.mark.parametrize(
    ("trigger", "fragment"),
    [
        ("{kind: grpc, driver: drv-1, token: sk-live-pasted}", "secret reference"),
        ("{kind: webhook, path: x, verify: {scheme: none}, dedupe_header: X, token: t}", "grpc"),
    ],
)
def test_a_driver_token_is_a_reference_on_grpc_triggers_only(trigger: str, fragment: str) -> None:
    text = DRIVERS.split("  triggers:")[0] + f"  triggers:\n    - {trigger}\n"
    errors = errors_of(text)
    assert any(path.startswith("spec.triggers[0]") and fragment in message
               for path, message in errors.items()), errors  # fmt: skip


def test_apply_refuses_an_unknown_tool_and_an_http_tool_without_hosts() -> None:
    approval = errors_of(
        EXAMPLE.replace("  triggers:", "  approvals: {tools: [teleport]}\n  triggers:")
    )
    assert approval["spec.approvals.tools[0]"] == "unknown tool 'teleport'"
    unknown = errors_of(EXAMPLE.replace("http_request]", "http_request, teleport]"))
    assert "unknown tool 'teleport'" in unknown["spec.agents[0].tools[4]"]
    assert "known tools:" in unknown["spec.agents[0].tools[4]"]
    hostless = errors_of(EXAMPLE.replace("      http_hosts: [api.acme.example]\n", ""))
    assert "needs the hosts" in hostless["spec.agents[0].http_hosts"]
    bad_host = errors_of(EXAMPLE.replace("[api.acme.example]", "['http://x/']"))
    assert "spec.agents[0].http_hosts[0].host" in bad_host


def test_every_channel_kind_is_accepted_with_its_account() -> None:
    for kind in ("telegram", "whatsapp_business", "discord", "email"):
        (spec,) = load_specs(EXAMPLE.replace("kind: telegram", f"kind: {kind}"))
        assert spec.spec.triggers[2].kind == kind and spec.spec.triggers[2].account == "tg-main"
