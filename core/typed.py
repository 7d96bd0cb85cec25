"""Typed store accessors: ``storage.store("counts", str, int) -> KeyValueStore[str, int]``.

The model is Flink's typed state descriptors (``ValueStateDescriptor("count", Types.LONG)``):
the caller names the key and value types, a type checker sees them, and they are checked
once, at the call, against the store's serdes — a mismatch is an error naming the store
and the config key, not a wrong type discovered at the first ``get``. Kafka Streams'
style (``KeyValueStore<String, Long> s = context.getStateStore("counts")``) works too:
the one-argument form returns ``Any``, so an annotated assignment type-checks.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .kv import KeyValueStore
from .serdes import Serde

__all__ = ["check_store_types"]


def _check(store: str, what: str, serde: Serde | None, wanted: type) -> None:
    if wanted is object or wanted is Any:
        return
    if not isinstance(wanted, type):
        raise TypeError(f"store {store!r}: the {what} type must be a class (str, int, dict, ...), got {wanted!r}")
    have = serde.python_type if serde is not None else bytes
    if have is None:
        return  # json / msgpack / pickle hold many types: the caller's choice stands
    if not issubclass(have, wanted):
        key = "key.serde" if what == "key" else "msg.serde"
        name = serde.name if serde is not None else "bytes"
        raise ConfigError(
            f"store {store!r}: asked for {what}s of type {wanted.__name__}, but stores.{store}.{key} = "
            f"{name!r} gives {have.__name__}; ask for {have.__name__} or change the serde"
        )


def check_store_types(
    store: str,
    view: Any,
    key_serde: Serde | None,
    msg_serde: Serde | None,
    key_type: type | None,
    value_type: type | None,
) -> Any:
    """``view`` after checking that its serdes give ``key_type``/``value_type``
    (each ``None`` = unchecked). Raises :class:`ConfigError` on a mismatch and
    ``TypeError`` if the store is not a key-value store."""
    if key_type is None and value_type is None:
        return view
    if not isinstance(view, KeyValueStore):
        raise TypeError(
            f"store {store!r} is a {type(view).__name__}, not a key-value store: call store({store!r}) "
            "without types to get its own API"
        )
    if key_type is not None:
        _check(store, "key", key_serde, key_type)
    if value_type is not None:
        _check(store, "value", msg_serde, value_type)
    return view
