"""`make run` gives ingress the admin token's file, so rewriting `.eventos/admin-token` rotates
the token without a restart (docs/security.md, "Rotating secrets"); a token given in
EVENTOS_ADMIN_TOKEN stays a variable."""

from __future__ import annotations

from pathlib import Path

from eventos.local.instance import LocalStack


def test_the_generated_token_is_passed_as_its_file(tmp_path: Path) -> None:
    instance = LocalStack(tmp_path, env={})
    instance.admin_token = "generated-token-0123456789"
    env = instance.service_env()
    assert env["EVENTOS_ADMIN_TOKEN_FILE"] == str(tmp_path / ".eventos" / "admin-token")


def test_a_token_given_in_the_environment_stays_a_variable(tmp_path: Path) -> None:
    instance = LocalStack(tmp_path, env={"EVENTOS_ADMIN_TOKEN": "given-token-0123456789"})
    instance.admin_token = "given-token-0123456789"
    env = instance.service_env()
    assert env["EVENTOS_ADMIN_TOKEN"] == "given-token-0123456789"
    assert "EVENTOS_ADMIN_TOKEN_FILE" not in env
