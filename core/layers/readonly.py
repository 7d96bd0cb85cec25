"""The ``readonly`` layer: reads forward, every write raises :class:`ReadOnlyStoreError`.

Used for state read from outside a job (:class:`~localstate.reader.StateReader`): a
write there would change nothing the job sees, so it is refused rather than accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from ..errors import ReadOnlyStoreError
from ..kv import KeyValueStore
from .forwarding import ForwardingStore

__all__ = ["ReadOnlyStore"]


class ReadOnlyStore(ForwardingStore):
    """``inner`` without writes; ``what`` says whose state it is (for the error)."""

    def __init__(self, inner: KeyValueStore[Any, Any], what: str) -> None:
        super().__init__(inner)
        self.what = what

    def _refuse(self, op: str) -> NoReturn:
        raise ReadOnlyStoreError(
            f"store {self.name!r} is read-only ({self.what}): {op}() is not allowed; "
            "write through the task's own TaskStorage"
        )

    def put(self, key: Any, value: Any) -> None:
        self._refuse("put")

    def put_all(self, entries: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> None:
        self._refuse("put_all")

    def delete(self, key: Any) -> None:
        self._refuse("delete")

    def delete_all(self, keys: Iterable[Any]) -> None:
        self._refuse("delete_all")
