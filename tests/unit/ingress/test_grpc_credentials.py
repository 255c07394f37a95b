"""Reading the bearer token of a gRPC call's metadata."""

from __future__ import annotations

import pytest
from eventos_ingress.credentials import bearer_token


@pytest.mark.parametrize(
    ("metadata", "token"),
    [
        ((("authorization", "Bearer abc-123"),), b"abc-123"),
        ((("Authorization", "bearer  abc-123 "),), b"abc-123"),
        ((("x-other", "1"), ("authorization", "Bearer t")), b"t"),
        ((("authorization", "Basic abc-123"),), None),
        ((("authorization", "Bearer "),), None),
        ((("authorization", "Bearerabc"),), None),
        ((), None),
        (None, None),
    ],
)
def test_bearer_token(metadata: tuple[tuple[str, str], ...] | None, token: bytes | None) -> None:
    assert bearer_token(metadata) == token
