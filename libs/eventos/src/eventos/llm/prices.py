"""The price table (SPEC §9): USD per million input and output tokens by `provider/model`.

`EVENTOS_LLM_PRICES` holds it as JSON, or `EVENTOS_LLM_PRICES_FILE` names a JSON file:
`{"openai/gpt-4.1-mini": {"input_per_mtok": 0.4, "output_per_mtok": 1.6}, "local/*": {...}}`.
A model matches its exact key, else `provider/*`, else `*`; a model with no price costs
nothing (logged once), so a budget cannot hold it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from eventos.contracts import LlmStepInput, ModelRef
from eventos.errors import ConfigError

log = logging.getLogger(__name__)
PER_MTOK = Decimal(1_000_000)
BYTES_PER_TOKEN = 3  # an upper estimate of prompt tokens from its size (English is ~4)
MESSAGE_OVERHEAD_TOKENS = 4


@dataclass(frozen=True)
class Price:
    input_per_mtok: Decimal
    output_per_mtok: Decimal


ZERO = Price(Decimal(0), Decimal(0))


@dataclass
class PriceTable:
    """Prices by `provider/model`, `provider/*` or `*`."""

    prices: dict[str, Price] = field(default_factory=dict)
    _unpriced: set[str] = field(default_factory=set)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PriceTable:
        env = os.environ if env is None else env
        raw, where = env.get("EVENTOS_LLM_PRICES", ""), "EVENTOS_LLM_PRICES"
        if not raw.strip() and (path := env.get("EVENTOS_LLM_PRICES_FILE", "").strip()):
            try:
                raw, where = Path(path).read_text(), path
            except OSError as exc:
                raise ConfigError(f"EVENTOS_LLM_PRICES_FILE {path!r}: {exc.strerror}") from None
        if not raw.strip():
            return cls()
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where} is not JSON: {exc.msg}") from None
        return cls.from_doc(doc, where)

    @classmethod
    def from_doc(cls, doc: Any, where: str = "prices") -> PriceTable:
        if not isinstance(doc, dict):
            raise ConfigError(f"{where} must map `provider/model` to prices")
        return cls({str(key): _price(value, f"{where}[{key!r}]") for key, value in doc.items()})

    def price(self, model: ModelRef) -> Price:
        for key in (f"{model.provider}/{model.name}", f"{model.provider}/*", "*"):
            if key in self.prices:
                return self.prices[key]
        label = f"{model.provider}/{model.name}"
        if label not in self._unpriced:
            self._unpriced.add(label)
            log.warning("no price for %s: its steps count 0 USD against budgets", label)
        return ZERO

    def estimate(self, step: LlmStepInput) -> Decimal:
        """The step's upper estimate: prompt tokens * input price + max_tokens * output price."""
        return self.cost(step.model, prompt_tokens(step), step.max_tokens)

    def cost(self, model: ModelRef, input_tokens: int, output_tokens: int) -> Decimal:
        p = self.price(model)
        return (input_tokens * p.input_per_mtok + output_tokens * p.output_per_mtok) / PER_MTOK


def prompt_tokens(step: LlmStepInput) -> int:
    """An upper estimate of a step's prompt tokens from its size."""
    size = sum(
        len(m.content.encode()) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
        for m in step.messages
    )
    return math.ceil(size / BYTES_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * len(step.messages)


def _price(value: Any, where: str) -> Price:
    if not isinstance(value, dict) or set(value) != {"input_per_mtok", "output_per_mtok"}:
        raise ConfigError(f"{where} must be {{input_per_mtok, output_per_mtok}}")
    amounts = [value["input_per_mtok"], value["output_per_mtok"]]
    if any(isinstance(a, bool) or not isinstance(a, int | float) or a < 0 for a in amounts):
        raise ConfigError(f"{where}: prices are non-negative numbers (USD per million tokens)")
    return Price(Decimal(str(amounts[0])), Decimal(str(amounts[1])))
