"""Parsing engine/system options (frozen dataclasses) from flat config keys."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Collection, Mapping
from fractions import Fraction
from typing import Any, Literal, get_args, get_origin

from .errors import ConfigError

__all__ = ["parse_options", "option_keys", "coerce", "parse_duration_ms", "parse_size_bytes"]

_DURATION_MS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}
# Sizes follow Flink's MemorySize and Spark: every unit is a power of 1024
# ("64mb" = "64 MiB" = 67108864), the way RocksDB and JVM users read them.
_SIZE_BYTES = {
    "b": 1, "byte": 1, "bytes": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_AMOUNT = re.compile(r"\s*([+-]?(?:\d[\d_]*)?(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def _with_units(value: str, units: Mapping[str, int], default_unit: str, what: str) -> int:
    """``"1h30m"``/``"64 MiB"``/``"500"`` → an int in the base unit (exact, or an error)."""
    text = value.strip()
    if not text:
        raise ValueError(f"expected a {what}")
    total = Fraction(0)
    pos = 0
    while pos < len(text):
        m = _AMOUNT.match(text, pos)
        if m is None or not m.group(1) or m.end() == pos:
            raise ValueError(f"expected a {what} such as {_examples(what)}")
        if not m.group(2) and (pos or m.end() < len(text)):
            raise ValueError(f"{value!r}: every part of a {what} needs a unit, e.g. {_examples(what)}")
        unit = (m.group(2) or default_unit).lower()
        if unit not in units:
            raise ValueError(f"unknown unit {m.group(2)!r} in a {what}; use e.g. {_examples(what)} "
                             f"(units: {'ms, s, m or min, h, d' if what == 'duration' else 'B, KB/KiB, MB/MiB, GB/GiB, TB/TiB'})")
        total += Fraction(m.group(1).replace("_", "")) * units[unit]
        pos = m.end()
    if total.denominator != 1:
        raise ValueError(f"{what} {value!r} is not a whole number of {default_unit}")
    return int(total)


def _examples(what: str) -> str:
    return "500ms, 30s, 24h, 1h30m" if what == "duration" else "4096, 50MB, 64 MiB, 1.5GiB"


def parse_duration_ms(value: Any, key: str) -> int:
    """A duration in milliseconds from ``500`` (ms), ``"500ms"``, ``"30 s"``, ``"24h"``, ``"1h30m"``."""
    return coerce(value, int, key if key.endswith(".ms") else key + ".ms")


def parse_size_bytes(value: Any, key: str) -> int:
    """A size in bytes from ``4096``, ``"50MB"``, ``"64 MiB"`` (units are powers of 1024)."""
    return coerce(value, int, key if key.endswith(".bytes") else key + ".bytes")


def option_keys(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """``{"block.cache.size.bytes": field}`` for an options dataclass."""
    return {f.name.replace("_", "."): f for f in dataclasses.fields(cls)}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a config value (often a string from a .properties file) to ``tp``."""
    origin = get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "types.UnionType"):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        return coerce(value, args[0], key)
    if origin is Literal:
        choices = get_args(tp)
        v = value.strip().lower() if isinstance(value, str) else value
        if v not in choices:
            from .registry import did_you_mean  # on the error path only, as below

            raise ConfigError(
                f"{key} = {value!r} is not one of {', '.join(map(repr, choices))}.{did_you_mean(str(v), map(str, choices))}"
            )
        return v
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            # Keys named *.ms / *.bytes take units, as Kafka/Flink users write them.
            if isinstance(value, str) and key.endswith(".ms"):
                return _with_units(value, _DURATION_MS, "ms", "duration")
            if isinstance(value, str) and key.endswith(".bytes"):
                return _with_units(value, _SIZE_BYTES, "b", "size")
            return int(str(value).strip().replace("_", "")) if isinstance(value, str) else int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if tp is str:
            if isinstance(value, os.PathLike):
                return os.fspath(value)
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError("expected a string")
            return str(value)
    except (TypeError, ValueError) as e:
        hint = ""
        if isinstance(value, str) and re.search(r"\s[#!]", value):
            hint = (" (a .properties file has no trailing comments: '#' starts a comment only at the "
                    "start of a line, as in Java; put the comment on a line of its own)")
        raise ConfigError(f"{key} = {value!r}: {e} ({getattr(tp, '__name__', tp)}){hint}") from None
    return value


def parse_options(cls: type, raw: Mapping[str, Any], prefix: str, pass_through: Collection[str] = ()) -> Any:
    """Build ``cls`` from ``raw`` (keys relative to ``prefix``); unknown keys and bad values
    are errors, all of them reported in one :class:`ConfigError`.

    ``prefix`` is the full config prefix for messages, e.g. ``"stores.counts.rocksdb"``.
    Keys under a ``pass_through`` prefix are collected as string dicts into the field of
    that name (``producer.linger.ms`` → ``producer={"linger.ms": "10"}``), for settings
    handed on to a client library as they are.
    Validation hooks: a ``validate(self, prefix)`` method on ``cls`` is called last.
    """
    fields = option_keys(cls)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {name: {} for name in pass_through}
    errors: list[str] = []
    for key, value in raw.items():
        head, dot, rest = key.partition(".")
        if dot and head in pass_through:
            kwargs[head][rest] = "true" if value is True else "false" if value is False else str(value)
            continue
        f = fields.get(key)
        if f is None or f.name in pass_through:
            # imported on the error path only: the registry scans the installed plug-ins'
            # entry points when imported (~15 ms with importlib.metadata), which a process
            # that only parses options (Spark's streaming-source runner) never needs
            from .registry import did_you_mean

            errors.append(f"unknown option {prefix}.{key}.{did_you_mean(key, fields)}"
                          .replace(" Valid names:", " Valid options:"))
            continue
        try:
            kwargs[f.name] = coerce(value, hints[f.name], f"{prefix}.{key}")
        except ConfigError as e:
            errors.append(str(e))
    if errors:  # every problem at once, not one per attempt
        raise ConfigError("; ".join(errors))
    opts = cls(**kwargs)
    validate = getattr(opts, "validate", None)
    if validate is not None:
        validate(prefix)
    return opts
