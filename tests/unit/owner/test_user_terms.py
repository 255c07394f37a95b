"""A user's `daily_usd` as the owner API takes it (eventos.owner.users.daily_usd_of): a positive
amount at the column's scale (numeric(12, 4)), refused with the field's name otherwise."""

from __future__ import annotations

from decimal import Decimal

import pytest

from eventos.errors import InputInvalid
from eventos.owner import users


@pytest.mark.parametrize(
    ("given", "kept"),
    [(0.5, Decimal("0.5000")), ("12.25", Decimal("12.2500")), (1, Decimal("1.0000")),
     (0.0001, Decimal("0.0001")), (100_000, Decimal("100000.0000")), (None, None)],
)  # fmt: skip
def test_a_positive_amount_is_kept_at_the_columns_scale(given: object, kept: object) -> None:
    assert users.daily_usd_of(given) == kept


@pytest.mark.parametrize(
    "given",
    # 0.00001 passed the check once and rounded to 0 on the way in: the table's CHECK refused it
    # and the owner API answered 500 (found by tests/integration/ingress/test_owner_api_fuzz.py).
    [0.00001, 0.00004, 0, -1, "-0.5", 100_000.5, "nan", "inf", "x", True, [], {}],
)
def test_an_amount_that_is_not_positive_at_four_places_is_refused(given: object) -> None:
    with pytest.raises(InputInvalid) as refused:
        users.daily_usd_of(given)
    assert [path for path, _ in refused.value.errors] == ["daily_usd"]
