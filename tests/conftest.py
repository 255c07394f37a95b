"""Fixtures shared by the tests: in-process services on real PostgreSQL, specs, signed requests."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from eventos_ingress.app import IngressConfig, build
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.employees import lifecycle
from eventos.llm.endpoints import LlmEndpoints
from eventos.runtime.service import Service
from eventos.secret_purposes import VAR as PURPOSES_VAR
from eventos.secret_purposes import SecretPurposes
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    GrpcIngressSettings,
    IngressBuffers,
    SecretStore,
    ServiceSettings,
    SupervisionSettings,
)
from eventos.spec.model import load_specs

if TYPE_CHECKING:
    from mail_servers import MailServers

# Test modules import each other's fixtures and helpers by module name (each name is unique in
# tests/): every folder of tests is on the path from the start, whichever pytest collects first.
TESTS = Path(__file__).resolve().parent
for _folder in sorted({p.parent for p in TESTS.rglob("*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
# The k8s suite's helper modules say what differed in their asserts too (the test modules import
# them before their `pytest_plugins` would load them).
pytest.register_assert_rewrite("k8s_cluster", "k8s_release", "k8s_backlog", "k8s_faults")

# The outside world of these tests (HTTP servers that tools call and polls read) is on
# loopback; services started in-process and as processes read this from the environment.
os.environ.setdefault("EVENTOS_OUTBOUND_ALLOW_PRIVATE", "true")

ADMIN_TOKEN = "test-admin-token-0123456789"
DRIVER_TOKEN = "test-driver-drv-1-token-0123"  # drv-1's token, by its default reference
INTERNAL_TOKEN = "test-internal-token-0123456789"
COURIER_DRIVER_TOKEN = "test-driver-drv-2-token-0123"  # drv-2's, by its `token:` reference
E2E_TIMEOUT_S = 900  # hang limit of an end-to-end test (pyproject's default is 300 s)
# The tests' operator declares what each of the suite's secrets is for (docs/security.md,
# "Secrets keep to their purpose"): channel accounts by their prefix, the rest by name.
PURPOSES = " ".join([
    "stripe-whsec=webhook", "github-hook=webhook", "std-hook=webhook", "meta-app=webhook",
    "deploy-hook=webhook", "plain-token=webhook", "courier-driver=driver",
    "not-configured=webhook", "tg*=channel", "wa-*=channel", "em-*=channel", "dc-*=channel",
    "fake-openai=llm", "openai-main=llm", "key-*=llm",
    "orders-api=http:127.0.0.1", "feed-token=poll:127.0.0.1", "not-there=poll:127.0.0.1",
])  # fmt: skip
TEST_PURPOSES = SecretPurposes.parse(PURPOSES)
SECRETS = {
    PURPOSES_VAR: PURPOSES,
    "EVENTOS_SECRET_STRIPE_WHSEC": "whsec_test_stripe",
    "EVENTOS_SECRET_GITHUB_HOOK": "github-secret",
    "EVENTOS_SECRET_STD_HOOK": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "EVENTOS_SECRET_META_APP": "meta-app-secret",
    "EVENTOS_SECRET_DEPLOY_HOOK": "deploy-secret",
    "EVENTOS_SECRET_PLAIN_TOKEN": "plain-token-value",
    "EVENTOS_SECRET_DRIVER_DRV_1": DRIVER_TOKEN,
    "EVENTOS_SECRET_COURIER_DRIVER": COURIER_DRIVER_TOKEN,
}

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: support}
spec:
  timezone: Europe/Berlin
  budget: {daily_usd: 20}
  agents:
    - name: front
      model: {provider: local, name: scripted}
      system: You answer customers of ACME.
  triggers:
    - {kind: chat}
    - {kind: webhook, path: stripe, verify: {scheme: stripe, secret: stripe-whsec}, class: C3}
    - {kind: webhook, path: github, verify: {scheme: github, secret: github-hook}}
    - {kind: webhook, path: std, verify: {scheme: standard-webhooks, secret: std-hook}}
    - {kind: webhook, path: meta, verify: {scheme: whatsapp-business, secret: meta-app}}
    - {kind: webhook, path: deploys, verify: {scheme: hmac-sha256, secret: deploy-hook, header: X-Signature}}
    - {kind: webhook, path: plain, verify: {scheme: header, secret: plain-token, header: X-Token},
       dedupe_header: X-Request-Id}
    - {kind: webhook, path: internal, verify: {scheme: none}, dedupe_header: X-Event-Id}
    - {kind: webhook, path: small, verify: {scheme: none}, dedupe_header: X-Event-Id, max_body: 1000}
    - {kind: webhook, path: big, verify: {scheme: none}, dedupe_header: X-Event-Id, max_body: 1048576}
    - {kind: webhook, path: huge, verify: {scheme: none}, dedupe_header: X-Event-Id, max_body: 10485760}
    - {kind: webhook, path: missing-secret, verify: {scheme: header, secret: not-configured, header: X-T}}
    - {kind: grpc, driver: drv-1, thread_by: subject}
"""


@pytest.fixture
def spec_text() -> str:
    return SPEC


async def apply_and_start(
    pool: AsyncConnectionPool[Conn],
    text: str,
    *,
    activate: bool = True,
    endpoints: LlmEndpoints | None = None,
    purposes: SecretPurposes = TEST_PURPOSES,
) -> None:
    """Apply every spec in `text` and start each (running unless activate=False)."""
    async with pool.connection() as conn:
        for spec in load_specs(text):
            await lifecycle.apply(conn, spec, endpoints or LlmEndpoints(), purposes)
            await lifecycle.start(conn, spec.name)
            if activate:
                await lifecycle.activate(conn, spec.name)


@pytest.fixture
async def started(pool: AsyncConnectionPool[Conn]) -> str:
    """The test employee `support`, applied and running."""
    await apply_and_start(pool, SPEC)
    return "support"


async def run_service(service: Service) -> asyncio.Task[None]:
    task = asyncio.create_task(service.run(install_signals=False))
    await asyncio.wait_for(service.started(), 10)
    return task


@pytest.fixture
def supervision_settings() -> SupervisionSettings:
    """Restart intensity and watchdog settings of the test's workers (the defaults); a module
    that needs shorter windows overrides this fixture."""
    return SupervisionSettings()


@pytest.fixture
def llm_endpoints() -> LlmEndpoints:
    """The LLM endpoints the test's services allow (EVENTOS_LLM_ENDPOINTS unset: the official
    OpenAI endpoint); a module calling a fake provider overrides it with the fake's address."""
    return LlmEndpoints()


def ingress_config(
    db_settings: DatabaseSettings, tmp_path: Path, **overrides: Any
) -> IngressConfig:
    """The test ingress's configuration (free ports, the test secrets), with `overrides`."""
    cfg = IngressConfig(
        database=db_settings,
        service=ServiceSettings("ingress", http_port=0, grpc_port=0),
        admin=AdminSettings(ADMIN_TOKEN),
        secrets=SecretStore(env=SECRETS),
        buffers=IngressBuffers(tmp_path / "spool"),
        grpc=GrpcIngressSettings(internal_token=INTERNAL_TOKEN),
    )
    return dataclasses.replace(cfg, **overrides)


@pytest.fixture
async def ingress(
    db_settings: DatabaseSettings, tmp_path: Path, llm_endpoints: LlmEndpoints
) -> AsyncIterator[Service]:
    """The ingress service in this process, on free ports, against the test database."""
    cfg = ingress_config(db_settings, tmp_path, llm_endpoints=llm_endpoints)
    service = await build(cfg)
    task = await run_service(service)
    yield service
    service.stop()
    await asyncio.wait_for(task, 15)


@pytest.fixture
def ingress_url(ingress: Service) -> str:
    return f"http://127.0.0.1:{ingress.bound_http_port}"


@pytest.fixture
def ingress_grpc(ingress: Service) -> str:
    return f"127.0.0.1:{ingress.bound_grpc_port}"


@pytest.fixture(scope="session")
def mail_servers() -> Iterator[MailServers]:
    """The session's SMTP and IMAP servers on loopback (one pair per xdist worker), started by
    the first test that asks for them; tests share them through their own `new_user()`s."""
    from mail_servers import MailServers  # pymap is imported only by a session that uses it

    with MailServers() as servers:
        yield servers


@pytest.fixture
def mail(mail_servers: MailServers) -> Iterator[MailServers]:
    """The session's mail servers with no scripted fault left from another test, at either end."""
    mail_servers.clear_faults()
    yield mail_servers
    mail_servers.clear_faults()
