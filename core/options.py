"""Parsing engine/system options (frozen dataclasses) from flat config keys."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Collection, Mapping
from typing import Any, Literal, get_args, get_origin

from .errors import ConfigError
from .registry import did_you_mean

__all__ = ["parse_options", "option_keys", "coerce"]


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
        raise ConfigError(f"{key} = {value!r}: {e} ({getattr(tp, '__name__', tp)})") from None
    return value


def parse_options(cls: type, raw: Mapping[str, Any], prefix: str, pass_through: Collection[str] = ()) -> Any:
    """Build ``cls`` from ``raw`` (keys relative to ``prefix``); unknown keys are errors.

    ``prefix`` is the full config prefix for messages, e.g. ``"stores.counts.rocksdb"``.
    Keys under a ``pass_through`` prefix are collected as string dicts into the field of
    that name (``producer.linger.ms`` → ``producer={"linger.ms": "10"}``), for settings
    handed on to a client library as they are.
    Validation hooks: a ``validate(self, prefix)`` method on ``cls`` is called last.
    """
    fields = option_keys(cls)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {name: {} for name in pass_through}
    for key, value in raw.items():
        head, dot, rest = key.partition(".")
        if dot and head in pass_through:
            kwargs[head][rest] = "true" if value is True else "false" if value is False else str(value)
            continue
        f = fields.get(key)
        if f is None or f.name in pass_through:
            raise ConfigError(
                f"unknown option {prefix}.{key}.{did_you_mean(key, fields)}"
                .replace(" Valid names:", " Valid options:")
            )
        kwargs[f.name] = coerce(value, hints[f.name], f"{prefix}.{key}")
    opts = cls(**kwargs)
    validate = getattr(opts, "validate", None)
    if validate is not None:
        validate(prefix)
    return opts
