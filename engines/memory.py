"""``memory``: a sorted in-memory map (sortedcontainers).

Not persistent: it always starts empty and is rebuilt from the changelog on open —
the simplest proof that the fault-tolerance path works.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import compress, filterfalse, repeat
from operator import is_, is_not

from localstate.engine import (
    ChangeRecord,
    KeyValueEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import StoreClosedError
from localstate.kv import KeyValueIterator, prefix_upper_bound, reject_none
from sortedcontainers import SortedDict

from ._util import require_bytes, require_bytes_pairs

__all__ = ["MemoryEngine", "MemoryEngineFactory"]

_CHUNK = 1024


def _compact(value: bytes) -> bytes:
    """``value`` in an allocation of its own size. orjson (3.13) returns small results
    inside a larger buffer: 300,000 json values of ~10 bytes held 1.19 GB, their copies
    29 MB. This engine keeps every value for the task's life, so it copies (~0.1 µs)."""
    return bytes(memoryview(value))


class MemoryEngine(KeyValueEngine):
    """A ``SortedDict[bytes, bytes]``. Iterators are weakly consistent: they never fail
    when the map changes underneath; keys are fetched in chunks after the last one seen."""

    def __init__(self, context: StoreContext | str | None = None, options: None = None) -> None:
        """Nothing of the context is needed but the store's name (a memory engine keeps no
        files); ``MemoryEngine()`` is an anonymous one. A plain name (``MemoryEngine("s")``,
        the form before every engine took a context) is still accepted: plug-ins subclass
        this engine."""
        if isinstance(context, str):
            self.name = context
        else:
            self.name = context.store if context is not None else "memory"
        self._data: SortedDict | None = SortedDict()

    def _require_open(self) -> SortedDict:
        d = self._data
        if d is None:
            raise StoreClosedError(f"store {self.name!r} (memory engine) is closed")
        return d

    # -- KeyValueStore ------------------------------------------------------------------
    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        return self._require_open().get(key, default)

    def get_all(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        d = self._require_open()
        keys = keys if isinstance(keys, list) else list(keys)
        values = list(map(d.get, keys))
        return dict(compress(zip(keys, values), map(is_not, values, repeat(None))))

    def put(self, key: bytes, value: bytes) -> None:
        d = self._require_open()
        if type(key) is not bytes:
            require_bytes(self.name, "key", key)
        if type(value) is not bytes:
            if value is None:
                reject_none(self.name, key, value)
            require_bytes(self.name, "value", value)
        d[key] = _compact(value)

    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        d = self._require_open()
        try:
            batch = entries if isinstance(entries, dict) else dict(entries)  # later pairs for one key win
        except TypeError:  # an unhashable key: name it the way every engine does
            require_bytes_pairs(self.name, entries.items() if isinstance(entries, Mapping) else entries)
            raise
        if not (set(map(type, batch)) <= {bytes} and set(map(type, batch.values())) <= {bytes}):
            require_bytes_pairs(self.name, batch.items())  # raises, naming the first bad key or value
        batch = dict(zip(batch, map(_compact, batch.values())))
        new_keys = list(filterfalse(d.__contains__, batch))
        if new_keys:
            d.update({k: batch[k] for k in new_keys})
        # Every key is in the sorted key list now, so the values can go straight into the
        # underlying dict (SortedDict subclasses dict) without SortedDict re-sorting keys.
        dict.update(d, batch)

    def delete(self, key: bytes) -> None:
        self._require_open().pop(key, None)

    def delete_all(self, keys: Iterable[bytes]) -> None:
        d = self._require_open()
        present = list(dict.fromkeys(filter(d.__contains__, keys)))
        if len(present) * 4 < len(d):
            pop = d.pop
            for k in present:
                pop(k)
            return
        # Many keys go: one C-level copy without them and one sort beat a Python-level
        # SortedDict.pop per key. (Open iterators re-read self._data per chunk.)
        remaining = dict(dict.items(d))
        deque(map(remaining.pop, present), 0)
        self._data = SortedDict(remaining)

    def _scan(self, keys: list[bytes], values: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        for i in range(0, len(keys), _CHUNK):
            if self._data is None:
                self._require_open()  # closed mid-scan: StoreClosedError
            yield from zip(keys[i : i + _CHUNK], values[i : i + _CHUNK])

    def range(self, start: bytes | None, stop: bytes | None) -> KeyValueIterator[bytes, bytes]:
        """The pairs of ``[start, stop)`` as of this call (copied now, in C): writes made
        while iterating are not seen and cannot make the scan run forever."""
        d = self._require_open()
        keys = list(d) if start is None and stop is None else list(d.irange(start, stop, inclusive=(True, False)))
        values = list(map(d.__getitem__, keys))
        return KeyValueIterator(self._scan(keys, values), what=f"store {self.name!r} iterator")

    def prefix(self, prefix: bytes) -> KeyValueIterator[bytes, bytes]:
        return self.range(prefix, prefix_upper_bound(prefix))

    def all(self) -> KeyValueIterator[bytes, bytes]:
        return self.range(None, None)

    def flush(self) -> None:
        self._require_open()

    def close(self) -> None:
        self._data = None

    # -- StorageEngine --------------------------------------------------------------------
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        d = self._require_open()
        if into_empty and not d:
            # one C-speed dict build (last write wins) and one sort, no intermediate dict
            built = SortedDict(records)
            # tombstones found without a Python-level loop over every record
            dead = list(compress(dict.keys(built), map(is_, dict.values(built), repeat(None))))
            if len(dead) * 8 > len(built):
                built = SortedDict(compress(dict.items(built), map(is_not, dict.values(built), repeat(None))))
            else:
                for k in dead:
                    del built[k]
            self._data = built
            return
        pop = d.pop
        for k, v in records:
            if v is None:
                pop(k, None)
            else:
                d[k] = v

    def wipe(self) -> None:
        self._require_open().clear()

    def __len__(self) -> int:
        return len(self._require_open())

    def stats(self) -> dict[str, float]:
        return {"estimated_keys": float(len(self._require_open()))}


class MemoryEngineFactory(StorageEngineFactory):
    """Factory ``memory``: no options."""

    description = "sorted in-memory map (sortedcontainers); rebuilt from the changelog on open"

    def create(self, spec: StoreSpec, context: StoreContext) -> MemoryEngine:
        return MemoryEngine(context)
