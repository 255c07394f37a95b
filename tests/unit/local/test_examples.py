"""Which example specs `make run` may start: those whose secret references all resolve."""

from __future__ import annotations

from pathlib import Path

from eventos.local.examples import (
    EXAMPLE_OPERATOR_ENV,
    ExampleOutcome,
    missing_secrets,
    secret_refs,
)
from eventos.settings import SecretStore
from eventos.spec.model import EmployeeSpec, load_specs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SUPPORT_REFS = ["openai-main", "stripe-whsec", "deploy-hook"]


def example(name: str) -> EmployeeSpec:
    [spec] = load_specs((EXAMPLES / name).read_text())
    return spec


def test_hello_needs_no_secret() -> None:
    assert secret_refs(example("hello.yaml")) == []
    assert missing_secrets(example("hello.yaml"), SecretStore(env={})) == []


def test_support_needs_its_credential_webhook_secrets_and_channel_account() -> None:
    support = example("support.yaml")
    assert secret_refs(support) == SUPPORT_REFS
    assert missing_secrets(support, SecretStore(env={})) == SUPPORT_REFS


def test_secrets_resolve_from_the_environment_or_the_secrets_directory(tmp_path: Path) -> None:
    (tmp_path / "openai-main").write_text("sk-test\n")
    env = {**EXAMPLE_OPERATOR_ENV, "EVENTOS_SECRET_STRIPE_WHSEC": "whsec_x"}
    store = SecretStore(env=env, directory=tmp_path)
    assert missing_secrets(example("support.yaml"), store) == ["deploy-hook"]


def test_a_secret_declared_for_another_purpose_is_missing_for_this_one(tmp_path: Path) -> None:
    env = {"EVENTOS_SECRETS_PURPOSES": "openai-main=webhook stripe-whsec=webhook "
           "deploy-hook=webhook", "EVENTOS_SECRET_OPENAI_MAIN": "sk-test",
           "EVENTOS_SECRET_STRIPE_WHSEC": "whsec_x", "EVENTOS_SECRET_DEPLOY_HOOK": "d"}  # fmt: skip
    assert missing_secrets(example("support.yaml"), SecretStore(env=env)) == ["openai-main"]


def test_chat_is_offered_for_a_running_or_starting_employee_with_a_chat_trigger() -> None:
    # A slow first start leaves a generation `starting`: its streams hold the message until it runs.
    source = EXAMPLES / "hello.yaml"
    states = {"running": True, "starting": True, "stopped": False, "skipped": False}
    for state, offered in states.items():
        assert ExampleOutcome("hello", source, state, has_chat=True).takes_chat is offered, state
    assert not ExampleOutcome("hooks", source, "running", has_chat=False).takes_chat
