"""The ``prices`` file: what a team pays per million tokens of each model, read and checked at start.

A JSON or YAML mapping of model name (or ``fnmatch`` glob) to its prices, each a decimal amount of
``cost_currency`` per million tokens::

    {"gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25},
     "acme-*": {"input": 0.4, "output": 1.6, "currency": "EUR"}}

``input`` and ``output`` are required; ``cache_read`` and ``cache_write`` (the input tokens read from
or written to the provider's prompt cache) default to ``input``; ``currency``, when given, must be
``cost_currency``. An exact name wins over a glob; globs are tried in the file's order.

What a reader would not guess: a price per *million* tokens times a number of tokens is exactly an
amount in *micro*-units of the currency, the unit the budget stores count in, so a price is a sum of
products of integers and decimals, rounded up once (a tree is never under-charged by rounding).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final, NamedTuple

MICROS: Final = 1_000_000
"""Micro-units in one unit of a currency: what the budget stores count spend in."""

_FIELDS: Final = ("input", "output", "cache_read", "cache_write", "currency")
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


def amount(name: str, value: object) -> Decimal:
    """A decimal amount of money, at least 0 and at most a millionth fine (``max_cost``)."""
    number = _decimal(name, value)
    if number != number.quantize(Decimal("0.000001"), rounding="ROUND_DOWN"):
        raise ValueError(f"{name}: {value!r} is finer than a millionth of the currency")
    return number


def currency(name: str, value: object) -> str:
    """An ISO 4217 currency code: three letters (``usd`` reads as ``USD``)."""
    text = value.strip().upper() if isinstance(value, str) else value
    if not isinstance(text, str) or not _CURRENCY.fullmatch(text):
        raise ValueError(f"{name}: {value!r} is not an ISO 4217 currency code (three letters: USD, EUR)")
    return text


def micros(value: Decimal) -> int:
    """``value`` units of a currency as whole micro-units, rounded up."""
    return math.ceil(value * MICROS)


def _decimal(name: str, value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise ValueError(f"{name}: {value!r} is not a decimal amount")
    try:
        number = Decimal(value.strip() if isinstance(value, str) else str(value))
    except InvalidOperation:
        raise ValueError(f"{name}: {value!r} is not a decimal amount") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{name}: {value!r} must be a finite amount of at least 0")
    return number


class Price(NamedTuple):
    """One model's prices per million tokens (micro-units per token), and the currency it named."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    currency: str | None

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> int:
        """Micro-units of a response's tokens (``input_tokens`` counts the cached ones too)."""
        fresh = max(input_tokens - cache_read - cache_write, 0)
        spent = (
            fresh * self.input
            + cache_read * self.cache_read
            + cache_write * self.cache_write
            + output_tokens * self.output
        )
        return math.ceil(spent)


class Prices:
    """A prices file, read: the price of a model by its name, exact names first, then globs in order."""

    __slots__ = ("_exact", "_globs", "source")

    def __init__(self, entries: Mapping[str, Price], source: str) -> None:
        self.source = source
        self._exact = {name: price for name, price in entries.items() if not _is_glob(name)}
        self._globs = [(name, price) for name, price in entries.items() if _is_glob(name)]

    @classmethod
    def of(cls, data: object, source: str) -> Prices:
        """Prices from the mapping a file holds; a ``ValueError`` names the entry that is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"prices: {source} is not a mapping of model name to prices")
        entries = {}
        for model, fields in data.items():
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"prices: {source}: {model!r} is not a model name")
            entries[model.strip()] = _entry(model, fields, source)
        return cls(entries, source)

    def find(self, model: str) -> Price | None:
        """The price of ``model``: its own entry, else the first glob that matches it."""
        price = self._exact.get(model)
        if price is not None:
            return price
        for pattern, price in self._globs:
            if fnmatch.fnmatchcase(model, pattern):
                return price
        return None

    def currencies(self) -> list[tuple[str, str]]:
        """(model, currency) of every entry that names its currency."""
        return [
            (model, price.currency)
            for model, price in [*self._exact.items(), *self._globs]
            if price.currency is not None
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prices) and (self._exact, self._globs) == (other._exact, other._globs)

    def __hash__(self) -> int:
        return hash(tuple(self._exact))

    def __repr__(self) -> str:
        return f"<Prices {self.source}: {len(self._exact) + len(self._globs)} models>"


def _is_glob(name: str) -> bool:
    return any(char in name for char in "*?[")


def _entry(model: str, fields: object, source: str) -> Price:
    where = f"prices: {source}: {model!r}"
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a mapping of input, output (cache_read, cache_write, currency)")
    unknown = sorted(str(key) for key in fields if key not in _FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown {', '.join(unknown)}; an entry holds {', '.join(_FIELDS)}")
    missing = [key for key in ("input", "output") if key not in fields]
    if missing:
        raise ValueError(f"{where}: no {' or '.join(missing)} price (per million tokens)")
    prices = {key: _decimal(f"{where}: {key}", fields[key]) for key in _FIELDS[:4] if key in fields}
    named = fields.get("currency")
    return Price(
        prices["input"],
        prices["output"],
        prices.get("cache_read", prices["input"]),
        prices.get("cache_write", prices["input"]),
        currency(f"{where}: currency", named) if named is not None else None,
    )


def read_prices(path: str) -> Prices:
    """The prices file at ``path`` (``.yaml`` / ``.yml``: YAML, anything else JSON), checked."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ValueError(f"prices: cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    if os.path.splitext(path)[1].lower() in (".yaml", ".yml"):
        data = _yaml(path, text)
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"prices: {path} is not JSON ({exc})") from None
    return Prices.of(data, path)


def _yaml(path: str, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ValueError(f"prices: {path} is YAML, which needs PyYAML: pip install pyyaml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"prices: {path} is not YAML ({exc})".replace("\n", " ")) from None
