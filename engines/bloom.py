"""``bloom``: single or keyed Bloom filters (split-block layout, numpy + the fixed xxh3 hash).

Why our own small implementation instead of rbloom or fastbloom-rs: the changelog
contract is "changed 64-bit words only", so the engine must know which words an add
changed. Neither library exposes that (only whole-filter dumps, which would mean a
full copy and diff per commit), rbloom cannot be saved at all with its default hash,
and a library's internal bit layout may change with its version while our changelog
must stay readable. A numpy array gives the words directly, batches stay vectorised
(one C-level hash ``map`` per batch, no per-item Python), and the layout is fixed and
documented here.

Layout: a **split block Bloom filter** (the layout of Parquet's and Impala's filters):
``B`` blocks of 256 bits, each block 8 lanes of 32 bits. An item's 64-bit hash ``h``
(``localstate.engines._hashing``) picks block ``b = ((h >> 32) * B) >> 32``; with
``x = h & 0xffffffff`` lane ``j`` gets bit ``((x * SALT[j]) mod 2**32) >> 27`` (the
eight Parquet salts). Blocks are stored one after another: 32-bit word ``8 * b + j``
is lane ``j`` of block ``b``, and **word** ``i`` of the change records is the
little-endian 64-bit pair of 32-bit words ``2i, 2i + 1``. All 8 probes of an item hit
one 32-byte block (one cache line, no modulo), so a new item changes at most 4 words. ``B`` is the smallest even count whose exact split-block
false-positive rate (a Poisson mixture over the items per block) at ``capacity``
items is at most ``fp.rate`` — about 10-15% more bits than a classic Bloom filter.

Change records: ``key (key.serde; empty when not keyed) + word index (4 bytes, big
endian)`` → the 64-bit word (8 bytes, big endian); only words that changed since the
last commit (dirty word indexes are tracked as adds change them).
``delete(key=...)`` logs tombstones for the key's non-zero words. One meta record (key
``b"\\x00"``) holds the geometry, so restoring with a different capacity or rate fails
with a clear error instead of corrupting the filters.

Config::

    stores.seen.factory = bloom
    stores.seen.bloom.capacity = 10000000
    stores.seen.bloom.fp.rate = 0.001
    stores.seen.bloom.keyed = false       # true: one filter per key (capacity per key)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from localstate.engine import (
    ChangeRecord,
    StorageEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import ConfigError, CorruptionError, InvalidValueError, StoreClosedError
from localstate.serdes import Serde, describe_encode_error

from ._hashing import HASH_NAME, hash_item, hash_items

__all__ = ["BloomEngine", "BloomEngineFactory", "BloomOptions", "bloom_geometry", "split_block_fp_rate", "META_KEY"]

META_KEY = b"\x00"
"""Change-record key of the meta record (geometry and hash)."""
SALTS = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
_SALTS = np.array(SALTS, dtype=np.uint32)[:, None]
_WORD_INDEX = struct.Struct(">I")
_WORD = struct.Struct(">Q")
_MAX_BLOCKS = 1 << 29  # 4 * blocks word indexes fit the 4-byte record key; 16 GiB per filter
_CHUNK = 8192  # items per vectorised step: the temporaries stay in cache


def split_block_fp_rate(capacity: int, blocks: int) -> float:
    """The false-positive rate of a split block filter of ``blocks`` blocks holding
    ``capacity`` items: the number of items in a looked-up block is Poisson(n / B), and
    each of the 8 lanes must already have the probed bit set."""
    lam = capacity / blocks
    top = int(lam + 12 * math.sqrt(lam) + 30)
    log_lam = math.log(lam)
    total = 0.0
    for j in range(top + 1):
        pj = math.exp(-lam + j * log_lam - math.lgamma(j + 1))
        total += pj * (1.0 - (31 / 32) ** j) ** 8
    return total


def bloom_geometry(capacity: int, fp_rate: float) -> int:
    """The number of blocks ``B`` (even) for ``capacity`` items at ``fp_rate``."""
    lo, hi = 1, 2
    while split_block_fp_rate(capacity, 2 * hi) > fp_rate:
        lo, hi = hi, hi * 2
        if hi > _MAX_BLOCKS:
            return 2 * hi
    while lo < hi:  # smallest h with fp(2h) <= fp_rate
        mid = (lo + hi) // 2
        if split_block_fp_rate(capacity, 2 * mid) <= fp_rate:
            hi = mid
        else:
            lo = mid + 1
    return 2 * lo


@dataclass(frozen=True)
class BloomOptions:
    """``stores.<s>.bloom.*``.

    ``capacity``: items per filter at which the false-positive rate is ``fp.rate``
    (beyond it the rate grows); ``fp.rate`` in (0, 1); ``keyed``: one filter per key
    (``add(item, key=...)``), each of that capacity, allocated on its first add.
    """

    capacity: int = 1_000_000
    fp_rate: float = 0.01
    keyed: bool = False

    def validate(self, prefix: str) -> None:
        if self.capacity <= 0:
            raise ConfigError(f"{prefix}.capacity = {self.capacity}: must be a positive number of items")
        if not 0.0 < self.fp_rate < 1.0:
            raise ConfigError(f"{prefix}.fp.rate = {self.fp_rate}: must be strictly between 0 and 1 (e.g. 0.01)")
        blocks = bloom_geometry(self.capacity, self.fp_rate)
        if blocks > _MAX_BLOCKS:
            raise ConfigError(
                f"{prefix}.capacity = {self.capacity} at fp.rate = {self.fp_rate} needs more than "
                f"{_MAX_BLOCKS * 32} bytes, the most one filter can address; use keyed filters or a larger fp.rate"
            )


class _Filter:
    """One filter: ``lanes`` (``uint32[8 * B]``, block after block) and a dirty flag per 64-bit word."""

    __slots__ = ("lanes", "dirty")

    def __init__(self, blocks: int) -> None:
        self.lanes = np.zeros(8 * blocks, dtype="<u4")
        self.dirty = np.zeros(4 * blocks, dtype=np.bool_)

    @property
    def words(self) -> np.ndarray:
        return self.lanes.view("<u8")


class BloomEngine(StorageEngine):
    """``add(item)``, ``add_all(items)``, ``might_contain(item)``, ``item in bloom``,
    ``might_contain_all(items)``; with ``keyed = true`` every call takes ``key=``.

    Items are ``bytes``, ``str`` or ``int`` (``42`` and ``"42"`` are the same item);
    keys go through ``key.serde``. No false negatives; false positives at about
    ``fp.rate`` up to ``capacity`` items per filter.
    """

    def __init__(self, context: StoreContext, options: BloomOptions | None = None) -> None:
        options = options or BloomOptions()
        self.name = context.store
        self.capacity = options.capacity
        self.fp_rate = options.fp_rate
        self.keyed = options.keyed
        self.blocks = bloom_geometry(options.capacity, options.fp_rate)
        self.nwords = 4 * self.blocks
        self._lanes_of_block = np.arange(8, dtype=np.intp)[:, None]
        self._logger = context.change_logger
        self._key: Serde | None = context.key_serde
        self._meta = f"bloom;split-block;{HASH_NAME};blocks={self.blocks}".encode()
        self._meta_logged = False
        self._filters: dict[bytes, _Filter] | None = {}

    # -- helpers -----------------------------------------------------------------------------------
    def _live(self) -> dict[bytes, _Filter]:
        filters = self._filters
        if filters is None:
            raise StoreClosedError(f"store {self.name!r} (bloom engine) is closed")
        return filters

    def _prefix(self, key: Any) -> bytes:
        if not self.keyed:
            if key is not None:
                raise InvalidValueError(
                    f"store {self.name!r} is a single Bloom filter: call without key=, or set "
                    f"stores.{self.name}.bloom.keyed = true for one filter per key"
                )
            return b""
        if key is None:
            raise InvalidValueError(
                f"store {self.name!r} holds one Bloom filter per key (stores.{self.name}.bloom.keyed = "
                "true): pass key=..."
            )
        serde = self._key
        if type(key) is bytes and (serde is None or serde.name == "bytes"):
            return key
        if serde is None:
            serde = Serde("bytes", bytes, bytes)
        try:
            return serde.encode(key)
        except Exception as e:
            raise describe_encode_error(self.name, "key", serde, key, e) from e

    def _filter_for_write(self, filters: dict[bytes, _Filter], prefix: bytes) -> _Filter:
        f = filters.get(prefix)
        if f is None:
            f = filters[prefix] = _Filter(self.blocks)
        return f

    def _probes(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """32-bit word indexes and bit masks of a chunk of hashes, both shape ``(8, n)``."""
        block = ((hashes >> np.uint64(32)) * np.uint64(self.blocks)) >> np.uint64(32)
        masks = np.left_shift(np.uint32(1), (_SALTS * hashes.astype(np.uint32)) >> np.uint32(27))
        return (block.astype(np.intp) << 3) + self._lanes_of_block, masks

    def _probe_one(self, h: int) -> list[tuple[int, int]]:
        base = (((h >> 32) * self.blocks) >> 32) << 3
        x = h & 0xFFFFFFFF
        return [(base + j, 1 << (((x * salt) & 0xFFFFFFFF) >> 27)) for j, salt in enumerate(SALTS)]

    # -- the filter API ------------------------------------------------------------------------------------
    def add(self, item: Any, *, key: Any = None) -> bool:
        """Add ``item``; ``True`` if it was definitely not in the filter before. O(1)."""
        filters = self._live()
        prefix = self._prefix(key)
        h = hash_item(self.name, item)
        f = self._filter_for_write(filters, prefix)
        lanes, dirty = f.lanes, f.dirty
        new = False
        for i, bit in self._probe_one(h):
            old = int(lanes[i])
            if not old & bit:
                lanes[i] = old | bit
                dirty[i >> 1] = True
                new = True
        return new

    def add_all(self, items: Iterable[Any], *, key: Any = None) -> None:
        """Add every item, vectorised in chunks. Every item is validated (hashed) before
        any bit changes. O(len(items))."""
        filters = self._live()
        prefix = self._prefix(key)
        hashes = hash_items(self.name, items)
        if not len(hashes):
            return
        f = self._filter_for_write(filters, prefix)
        lanes, dirty = f.lanes, f.dirty
        probes, or_at = self._probes, np.bitwise_or.at
        for start in range(0, len(hashes), _CHUNK):
            idx, masks = probes(hashes[start:start + _CHUNK])
            unset = (lanes[idx] & masks) != masks
            if unset.any():
                idx = idx[unset]
                # .at, not fancy assignment: two items of one chunk may share a word
                or_at(lanes, idx, masks[unset])
                dirty[idx >> 1] = True

    def might_contain(self, item: Any, *, key: Any = None) -> bool:
        """``False``: ``item`` was never added; ``True``: probably added (``fp.rate``)."""
        prefix = self._prefix(key)
        h = hash_item(self.name, item)
        f = self._live().get(prefix)
        if f is None:
            return False
        lanes = f.lanes
        return all(int(lanes[i]) & bit for i, bit in self._probe_one(h))

    def might_contain_all(self, items: Iterable[Any], *, key: Any = None) -> np.ndarray:
        """:meth:`might_contain` for each item, as a ``bool`` array (vectorised)."""
        prefix = self._prefix(key)
        hashes = hash_items(self.name, items)
        f = self._live().get(prefix)
        out = np.zeros(len(hashes), dtype=np.bool_)
        if f is None:
            return out
        lanes, probes, all_ = f.lanes, self._probes, np.logical_and.reduce
        for start in range(0, len(hashes), _CHUNK):
            idx, masks = probes(hashes[start:start + _CHUNK])
            out[start:start + _CHUNK] = all_((lanes[idx] & masks) == masks, axis=0)
        return out

    def __contains__(self, item: Any) -> bool:
        """``item in bloom``; for a keyed store ``(key, item) in bloom``."""
        if self.keyed:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise InvalidValueError(
                    f"store {self.name!r} is keyed: test membership with (key, item) in store"
                )
            return self.might_contain(item[1], key=item[0])
        return self.might_contain(item)

    def delete(self, *, key: Any) -> bool:
        """Drop the filter of ``key`` (keyed stores); ``True`` if it existed."""
        filters = self._live()
        prefix = self._prefix(key)
        f = filters.pop(prefix, None)
        if f is None:
            return False
        pack = _WORD_INDEX.pack
        self._logger.log_all([(prefix + pack(i), None) for i in np.flatnonzero(f.words).tolist()])
        return True

    def keys(self) -> Iterator[Any]:
        """Keys that have a filter, decoded by ``key.serde`` (keyed stores; a snapshot)."""
        filters = self._live()
        if not self.keyed:
            return iter([])
        decode = self._key.decode if self._key is not None else bytes
        return iter([decode(k) for k in filters])

    def fill_ratio(self, *, key: Any = None) -> float:
        """Fraction of bits set."""
        prefix = self._prefix(key)
        f = self._live().get(prefix)
        if f is None:
            return 0.0
        return int(np.unpackbits(f.lanes.view(np.uint8)).sum()) / (256 * self.blocks)

    def words(self, *, key: Any = None) -> np.ndarray:
        """A copy of the filter's 64-bit words (zeros if it has none)."""
        prefix = self._prefix(key)
        f = self._live().get(prefix)
        return np.zeros(self.nwords, dtype="<u8") if f is None else f.words.copy()

    def __len__(self) -> int:
        """Number of allocated filters (0 or 1 when not keyed)."""
        return len(self._live())

    # -- StorageEngine -------------------------------------------------------------------------------------
    def prepare_commit(self) -> None:
        """Log the words that changed since the last commit (one record each)."""
        filters = self._live()
        records: list[ChangeRecord] = []
        for prefix, f in filters.items():
            idx = np.flatnonzero(f.dirty)
            if not len(idx):
                continue
            f.dirty[idx] = False
            keys = idx.astype(">u4").tobytes()
            vals = f.words[idx].astype(">u8").tobytes()
            records.extend(
                [(prefix + keys[j:j + 4], vals[2 * j:2 * j + 8]) for j in range(0, 4 * len(idx), 4)]
            )
        if records:
            if not self._meta_logged:
                records.insert(0, (META_KEY, self._meta))
                self._meta_logged = True
            self._logger.log_all(records)

    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        filters = self._live()
        latest: dict[bytes, dict[int, bytes | None]] = {}
        unpack = _WORD_INDEX.unpack
        for rk, v in records:
            if len(rk) < 4:
                if rk == META_KEY:
                    self._check_meta(v)
                    continue
                raise CorruptionError(
                    f"store {self.name!r}: change record key {rk!r} is not a Bloom word key; the "
                    "changelog does not belong to a bloom store"
                )
            per = latest.get(rk[:-4])
            if per is None:
                per = latest[rk[:-4]] = {}
            per[unpack(rk[-4:])[0]] = v
        zero = bytes(8)
        for prefix, per in latest.items():
            if (prefix != b"") != self.keyed:
                raise ConfigError(
                    f"store {self.name!r}: its changelog holds {'keyed' if prefix else 'single'} filters but "
                    f"stores.{self.name}.bloom.keyed = {str(self.keyed).lower()}; restore with the original setting"
                )
            idx = np.fromiter(per.keys(), dtype=np.intp, count=len(per))
            if len(idx) and int(idx.max()) >= self.nwords:
                raise CorruptionError(
                    f"store {self.name!r}: word index {int(idx.max())} in the changelog is beyond the "
                    f"filter's {self.nwords} words"
                )
            vals = np.frombuffer(b"".join([zero if v is None else v for v in per.values()]), dtype=">u8")
            f = self._filter_for_write(filters, prefix)
            f.words[idx] = vals
            if not f.lanes.any():
                del filters[prefix]

    def _check_meta(self, value: bytes | None) -> None:
        if value is None or value == self._meta:
            self._meta_logged = value is not None
            return
        raise ConfigError(
            f"store {self.name!r}: its changelog was written by Bloom filters with "
            f"{value.decode(errors='replace')!r}, but stores.{self.name}.bloom.capacity = {self.capacity} and "
            f"fp.rate = {self.fp_rate} give blocks={self.blocks}. Restore with the original "
            "capacity and fp.rate, or use a new changelog stream."
        )

    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        filters = self._live()
        out: list[ChangeRecord] = []
        for rk in keys:
            if rk == META_KEY:
                out.append((rk, self._meta if self._meta_logged else None))
                continue
            f = filters.get(rk[:-4]) if len(rk) >= 4 else None
            i = _WORD_INDEX.unpack(rk[-4:])[0] if f is not None else 0
            w = int(f.words[i]) if f is not None and i < self.nwords else 0
            out.append((rk, _WORD.pack(w) if w else None))
        return out

    def flush(self) -> None:
        self._live()

    def close(self) -> None:
        self._filters = None

    def _check(self) -> None:
        """Verify every invariant in O(total words); raises AssertionError."""
        filters = self._live()
        for prefix, f in filters.items():
            assert (prefix != b"") == self.keyed, prefix
            assert f.lanes.dtype == np.dtype("<u4") and f.lanes.shape == (8 * self.blocks,), prefix
            assert f.dirty.dtype == np.bool_ and f.dirty.shape == (self.nwords,), prefix
            assert not (f.dirty & (f.words == 0)).any(), "a dirty word is zero"
            # items set one bit in every lane of their block: no block has an empty lane
            # while another of its lanes is set
            nonempty = f.lanes.reshape(self.blocks, 8) != 0
            assert (nonempty.all(axis=1) == nonempty.any(axis=1)).all(), "a block has an empty lane"


class BloomEngineFactory(StorageEngineFactory):
    """Factory ``bloom``: ``stores.<s>.bloom.capacity``, ``.fp.rate``, ``.keyed``."""

    options_prefix = "bloom"
    options_type = BloomOptions
    description = "single or keyed split-block Bloom filters (numpy + xxh3); changed-word change records"

    def create(self, spec: StoreSpec, context: StoreContext) -> BloomEngine:
        return BloomEngine(context, spec.options)
