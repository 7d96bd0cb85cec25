"""``memory``: a sorted in-memory map (sortedcontainers).

Not persistent: it always starts empty and is rebuilt from the changelog on open —
the simplest proof that the fault-tolerance path works.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, compress, filterfalse, islice, repeat
from operator import is_, is_not
from typing import Any

from localstate.engine import (
    ChangeRecord,
    KeyValueEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import StoreClosedError
from localstate.kv import CloseableIterator, KeyValueIterator, prefix_upper_bound, reject_none
from localstate.serdes import all_of_type
from sortedcontainers import SortedDict

from ._util import require_bytes, require_bytes_pairs

__all__ = ["MemoryEngine", "MemoryEngineFactory"]

_CHUNK = 1024
_FIRST_CHUNK = 256
_MAX_CHUNK = 65536


def _compact(value: bytes) -> bytes:
    """``value`` in an allocation of its own size. orjson (3.13) returns small results
    inside a larger buffer: 300,000 json values of ~10 bytes held 1.19 GB, their copies
    29 MB. This engine keeps every value for the task's life, so it copies (~0.1 µs)."""
    return bytes(memoryview(value))


def _compacted(batch: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``batch`` with every value :func:`_compact`-ed, without a Python call per value. A
    batch whose keys all hold one value *object* (a marker: the timers' records, a set
    kept as a store) keeps one copy of it, not one per key. (Equal values that are
    distinct objects are copied one by one, as they come: merging them would make such
    a store faster to read than the same data written another way.)"""
    values = list(batch.values())
    if values and all(map(is_, values, repeat(values[0]))):
        return dict.fromkeys(batch, _compact(values[0]))
    return dict(zip(batch, map(bytes, map(memoryview, values))))


class _Scan:
    """One open range scan: the pairs (or only the keys) of ``[start, stop)`` as of its
    creation.

    Copying a whole range up front makes ``range(...)`` followed by a short read (the
    timers' ``take(n)``, a prefix probe) cost the size of the range. A scan instead
    copies chunks (growing, each one C-level ``irange`` slice) after the last key it
    copied, and the engine *freezes* every open scan — copies the rest of its range —
    before any write, so a scan never sees a write made after it was created. A
    keys-only scan (``range_keys``) copies no values."""

    __slots__ = ("data", "lo", "inclusive", "stop", "rest", "with_values")

    def __init__(self, data: SortedDict, start: bytes | None, stop: bytes | None, with_values: bool = True) -> None:
        self.data = data
        self.lo, self.inclusive, self.stop = start, True, stop
        self.with_values = with_values
        self.rest: tuple[list[bytes], list[bytes] | None] | None = None
        """The rest of the range (keys, values or None), once frozen."""

    def _copy(self, size: int | None) -> tuple[list[bytes], list[bytes] | None]:
        """Keys (and values) after the last key copied (``size`` of them, or all)."""
        keys = self.data.irange(self.lo, self.stop, inclusive=(self.inclusive, False))
        keys = list(keys if size is None else islice(keys, size))
        return keys, list(map(self.data.__getitem__, keys)) if self.with_values else None

    def freeze(self) -> None:
        """Copy the rest of the range now (a write is about to change the map)."""
        if self.rest is None:
            self.rest = self._copy(None)

    def chunks(self, engine: MemoryEngine) -> Iterator[Iterable[Any]]:
        """The scan's pairs (keys) as C-level iterators of up to ``_CHUNK`` each (chained
        by the caller, so reading one resumes no Python frame)."""
        try:
            size = _FIRST_CHUNK
            while self.rest is None:
                keys, values = self._copy(size)
                if keys:
                    self.lo, self.inclusive = keys[-1], False
                yield from self._slices(engine, keys, values)
                if len(keys) < size and self.rest is None:  # the range ended at that copy
                    return
                size = min(size * 4, _MAX_CHUNK)
            yield from self._slices(engine, *self.rest)
        finally:  # exhausted or closed: no longer needs freezing
            engine._scans.discard(self)

    @staticmethod
    def _slices(engine: MemoryEngine, keys: list[bytes], values: list[bytes] | None) -> Iterator[Iterable[Any]]:
        for i in range(0, len(keys), _CHUNK):
            if engine._data is None:
                engine._require_open()  # closed mid-scan: StoreClosedError
            if values is None:
                yield keys[i : i + _CHUNK]
            else:
                yield zip(keys[i : i + _CHUNK], values[i : i + _CHUNK])


class MemoryEngine(KeyValueEngine):
    """A ``SortedDict[bytes, bytes]``. Iterators show the map as of the call that created
    them (see :class:`_Scan`): copied lazily in chunks, and in full before any write."""

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
        self._scans: set[_Scan] = set()
        """Open scans not yet frozen (a plain set: the write path tests it per call)."""

    def _require_open(self) -> SortedDict:
        d = self._data
        if d is None:
            raise StoreClosedError(f"store {self.name!r} (memory engine) is closed")
        return d

    def _writable(self) -> SortedDict:
        """The map, for a write: first every open scan copies the rest of its range."""
        d = self._require_open()
        if self._scans:
            for scan in list(self._scans):
                scan.freeze()
            self._scans.clear()
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
        d = self._writable()
        if type(key) is not bytes:
            require_bytes(self.name, "key", key)
        if type(value) is not bytes:
            if value is None:
                reject_none(self.name, key, value)
            require_bytes(self.name, "value", value)
        d[key] = _compact(value)

    def put_all(self, entries: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes]) -> None:
        d = self._writable()
        try:
            batch = entries if isinstance(entries, dict) else dict(entries)  # later pairs for one key win
        except TypeError:  # an unhashable key: name it the way every engine does
            require_bytes_pairs(self.name, entries.items() if isinstance(entries, Mapping) else entries)
            raise
        if not (all_of_type(batch, bytes) and all_of_type(batch.values(), bytes)):
            require_bytes_pairs(self.name, batch.items())  # raises, naming the first bad key or value
        batch = _compacted(batch)
        new_keys = list(filterfalse(d.__contains__, batch))
        if len(new_keys) == len(batch):
            d.update(batch)  # all new: one SortedDict insert of keys and values
            return
        if new_keys:
            d.update(dict(zip(new_keys, map(batch.__getitem__, new_keys))))
        # Every key is in the sorted key list now, so the values can go straight into the
        # underlying dict (SortedDict subclasses dict) without SortedDict re-sorting keys.
        dict.update(d, batch)

    def delete(self, key: bytes) -> None:
        if type(key) is not bytes:
            require_bytes(self.name, "key", key)  # as every engine: not a silent no-op
        self._writable().pop(key, None)

    def delete_all(self, keys: Iterable[bytes]) -> None:
        d = self._writable()
        keys = keys if isinstance(keys, list) else list(keys)
        if len(keys) > _CHUNK and type(keys[0]) is bytes:
            # A long run of neighbouring keys in order (the timers' fired chunk, a
            # sweep's): one slice delete of the sorted keys instead of a rebuild of the
            # map from what remains, which cost the size of the rest per batch.
            start = d.bisect_left(keys[0])
            view = d.keys()
            if view[start : start + len(keys)] == keys:
                del view[start : start + len(keys)]
                return
        if not all_of_type(keys, bytes):
            for k in keys:  # raises for the first non-bytes key, before anything is deleted
                require_bytes(self.name, "key", k)
        present = list(dict.fromkeys(filter(d.__contains__, keys)))
        if len(present) * 4 < len(d):
            pop = d.pop
            for k in present:
                pop(k)
            return
        # Many keys go: one C-level copy without them beats a Python-level SortedDict.pop
        # per key. The copy walks the keys in order, so the new map's sort is one linear
        # pass (from the dict's insertion order it was a full sort). (Open scans were
        # frozen by _writable.)
        gone = set(present)
        kept = list(filterfalse(gone.__contains__, d))  # SortedDict iterates its keys in order
        self._data = SortedDict(zip(kept, map(d.__getitem__, kept)))

    def range(self, start: bytes | None, stop: bytes | None) -> KeyValueIterator[bytes, bytes]:
        """The pairs of ``[start, stop)`` as of this call: writes made while iterating are
        not seen and cannot make the scan run forever."""
        scan = _Scan(self._require_open(), start, stop)
        self._scans.add(scan)
        return KeyValueIterator(chain.from_iterable(scan.chunks(self)), what=f"store {self.name!r} iterator")

    def range_keys(self, start: bytes | None, stop: bytes | None) -> CloseableIterator[bytes]:
        """The keys of ``[start, stop)`` as of this call (as :meth:`range`), no value read."""
        scan = _Scan(self._require_open(), start, stop, with_values=False)
        self._scans.add(scan)
        return CloseableIterator(chain.from_iterable(scan.chunks(self)), what=f"store {self.name!r} iterator")

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
        d = self._writable()
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
        self._writable().clear()

    def __len__(self) -> int:
        return len(self._require_open())

    def stats(self) -> dict[str, float]:
        return {"estimated_keys": float(len(self._require_open()))}


class MemoryEngineFactory(StorageEngineFactory):
    """Factory ``memory``: no options."""

    description = "sorted in-memory map (sortedcontainers); rebuilt from the changelog on open"

    def create(self, spec: StoreSpec, context: StoreContext) -> MemoryEngine:
        return MemoryEngine(context)
