"""Small helpers shared by the built-in key-value engines."""

from __future__ import annotations

from collections.abc import Iterable

from localstate.errors import SerializationError

__all__ = ["require_bytes", "require_bytes_pairs"]


def require_bytes(store: str, what: str, obj: object) -> None:
    """Raise the standard TypeError for a non-bytes key/value reaching an engine."""
    if type(obj) is not bytes:
        raise SerializationError(
            f"store {store!r}: engines store bytes, but a {what} of type {type(obj).__name__} "
            f"({obj!r:.60}) reached the engine. Set stores.{store}.key.serde / "
            f"stores.{store}.msg.serde (e.g. string, json, long) so the serialized layer encodes it."
        )


def require_bytes_pairs(store: str, entries: Iterable[tuple[object, object]]) -> None:
    for k, v in entries:
        if type(k) is not bytes:
            require_bytes(store, "key", k)
        if type(v) is not bytes:
            if v is None:
                from localstate.kv import reject_none

                reject_none(store, k, v)
            require_bytes(store, "value", v)
