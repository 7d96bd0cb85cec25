"""``hyperloglog``: keyed distinct counters, one HyperLogLog++ sketch per key.

Built on datasketch's :class:`~datasketch.HyperLogLogPlusPlus` (its registers, its
estimator, its precision range 4–16) with a **fixed** hash: ``xxh3_64`` of the item's
documented byte encoding (``localstate.engines._hashing``). The hash is never taken
from a serialized sketch — datasketch's ``deserialize()`` silently resets a custom
hash to SHA-1 — sketches are rebuilt from their registers only.

Updates are vectorised: :meth:`HyperLogLogEngine.add_all` hashes a batch in one C
loop and folds it into the registers with ``numpy.maximum.at``; the registers it
produces are identical to calling datasketch's ``update()`` per item with the same
hash (tested).

Change records are **deltas**: ``key (key.serde) + register index (2 bytes, big
endian)`` → the register value (1 byte), only for registers that grew since the last
commit, so a hot sketch logs a few bytes per commit instead of ``2**p``.
:meth:`HyperLogLogEngine.delete` logs tombstones for the key's non-zero registers.
Small sketches are **sparse**: a dict ``register index -> value`` until more than
``2**p / 16`` registers are set (p >= 8), then a dense datasketch sketch, so many
small keys (pages with few viewers) cost bytes, not ``2**p`` each. The registers
are the same either way; the representation is invisible to the API and the log.

One meta record (key ``b"\\x00"``, a single byte, which no register record can be)
holds the precision and hash, so a restore with a different precision fails with a
clear error instead of silently mixing sketches.

Config::

    stores.viewers.factory = hyperloglog
    stores.viewers.key.serde = string
    stores.viewers.hyperloglog.precision = 14     # 2**14 registers, ~0.8% standard error
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasketch import HyperLogLogPlusPlus
from localstate.engine import (
    ChangeRecord,
    StorageEngine,
    StorageEngineFactory,
    StoreContext,
    StoreSpec,
)
from localstate.errors import ConfigError, CorruptionError, InvalidValueError, StoreClosedError
from localstate.serdes import Serde, encode_for

from ._hashing import HASH_NAME, hash_item, hash_items

__all__ = ["HyperLogLogEngine", "HyperLogLogEngineFactory", "HyperLogLogOptions", "item_hash", "META_KEY"]

META_KEY = b"\x00"
"""Change-record key of the meta record (precision and hash of every sketch)."""
_IDX = struct.Struct(">H")


def item_hash(item: Any) -> int:
    """The fixed 64-bit hash of an item, usable as datasketch's ``hashfunc``."""
    return hash_item("hyperloglog", item)


@dataclass(frozen=True)
class HyperLogLogOptions:
    """``stores.<s>.hyperloglog.precision``: ``p`` in 4..16; ``2**p`` one-byte registers per
    key and a standard error of about ``1.04 / sqrt(2**p)`` (p=14: 16 KiB, 0.81%)."""

    precision: int = 14

    def validate(self, prefix: str) -> None:
        if not 4 <= self.precision <= 16:
            raise ConfigError(f"{prefix}.precision = {self.precision}: must be between 4 and 16")


def _bit_length32(x: np.ndarray) -> np.ndarray:
    # frexp's exponent of an exactly representable integer is its bit length (0 -> 0)
    return np.frexp(x.astype(np.float64))[1]


class HyperLogLogEngine(StorageEngine):
    """``add(key, item)``, ``add_all(key, items)``, ``count(key)``, ``merge_into``, ``keys()``.

    Keys go through the store's ``key.serde``; items are ``bytes``, ``str`` or ``int``
    (see ``localstate.engines._hashing``: ``42`` and ``"42"`` are the same item).
    A key that was never added to counts 0 and is not listed by :meth:`keys`.
    """

    def __init__(self, context: StoreContext, options: HyperLogLogOptions | None = None) -> None:
        options = options or HyperLogLogOptions()
        self.name = context.store
        self.precision = p = options.precision
        self._m = 1 << p
        self._mask = (1 << p) - 1
        self._max_rank = 64 - p
        self._logger = context.change_logger
        self._key: Serde = context.key_serde
        self._meta = f"hll++;{HASH_NAME};p={p}".encode()
        self._meta_logged = False
        self._sparse_limit = self._m // 16 if p >= 8 else 0
        # key -> a dense datasketch sketch, or a sparse {register index: value} dict
        self._sketches: dict[bytes, HyperLogLogPlusPlus | dict[int, int]] | None = {}
        self._dirty: dict[bytes, set[int]] = {}

    # -- helpers ------------------------------------------------------------------------------
    def _require_open(self) -> dict[bytes, HyperLogLogPlusPlus | dict[int, int]]:
        sketches = self._sketches
        if sketches is None:
            raise StoreClosedError(f"store {self.name!r} (hyperloglog engine) is closed")
        return sketches

    def _enc_key(self, key: Any) -> bytes:
        if key is None:
            raise InvalidValueError(f"store {self.name!r}: None is not a valid key")
        return encode_for(self.name, "key", self._key, key)

    def _new_sketch(self) -> HyperLogLogPlusPlus:
        return HyperLogLogPlusPlus(p=self.precision, hashfunc=item_hash)

    def _dense_regs(self, sk: HyperLogLogPlusPlus | dict[int, int] | None) -> np.ndarray:
        """The registers of ``sk`` as an array: the sketch's own for a dense one (no
        copy), a new one for a sparse or missing one."""
        if sk is None:
            return np.zeros(self._m, dtype=np.int8)
        if type(sk) is dict:
            reg = np.zeros(self._m, dtype=np.int8)
            if sk:
                reg[list(sk)] = list(sk.values())
            return reg
        return sk.reg

    def _store_regs(self, sketches: dict, k: bytes, reg: np.ndarray) -> None:
        """Keep ``reg`` under ``k`` in the representation its size calls for."""
        nz = np.flatnonzero(reg)
        if not len(nz):
            sketches.pop(k, None)
        elif len(nz) <= self._sparse_limit:
            sketches[k] = dict(zip(nz.tolist(), reg[nz].tolist()))
        else:
            sk = sketches.get(k)
            if type(sk) is HyperLogLogPlusPlus:
                if sk.reg is not reg:
                    sk.reg[:] = reg
            else:
                sketches[k] = HyperLogLogPlusPlus(reg=reg if reg.base is None else reg.copy(), hashfunc=item_hash)

    # -- the counter API -----------------------------------------------------------------------------
    def add(self, key: Any, item: Any) -> bool:
        """Count ``item`` under ``key``; ``True`` if a register grew. O(1)."""
        sketches = self._require_open()
        k = self._enc_key(key)
        h = hash_item(self.name, item)
        idx = h & self._mask
        rank = self._max_rank - (h >> self.precision).bit_length() + 1
        sk = sketches.get(k)
        if sk is None:
            sk = sketches[k] = {} if self._sparse_limit else self._new_sketch()
        if type(sk) is dict:
            if rank <= sk.get(idx, 0):
                return False
            sk[idx] = rank
            if len(sk) > self._sparse_limit:
                sketches[k] = HyperLogLogPlusPlus(reg=self._dense_regs(sk), hashfunc=item_hash)
            grew = True
        else:
            reg = sk.reg
            grew = rank > reg[idx]
            if grew:
                reg[idx] = rank
        if grew:
            dirty = self._dirty.get(k)
            if dirty is None:
                self._dirty[k] = {idx}
            else:
                dirty.add(idx)
            return True
        return False

    def add_all(self, key: Any, items: Iterable[Any]) -> int:
        """Count every item under ``key`` (one vectorised pass); returns how many registers
        grew. Items are all validated before any register changes. O(len(items))."""
        sketches = self._require_open()
        k = self._enc_key(key)
        hashes = hash_items(self.name, items)
        if not len(hashes):
            return 0
        p = self.precision
        idx = (hashes & np.uint64(self._mask)).astype(np.intp)
        w = hashes >> np.uint64(p)
        hi = (w >> np.uint64(32)).astype(np.uint32)
        lo = (w & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        bits = np.where(hi != 0, _bit_length32(hi) + 32, _bit_length32(lo))
        rank = (self._max_rank + 1 - bits).astype(np.int8)
        sk = sketches.get(k)
        reg = self._dense_regs(sk)
        grew = rank > reg[idx]
        if not grew.any():
            return 0
        grown_idx = idx[grew]
        if len(grown_idx) * 8 > self._m:
            before = reg.copy()
            np.maximum.at(reg, grown_idx, rank[grew])
            changed = np.flatnonzero(reg != before)
        else:
            np.maximum.at(reg, grown_idx, rank[grew])
            # each grown index held a smaller value before the batch, so it changed
            changed = np.unique(grown_idx)
        if type(sk) is not HyperLogLogPlusPlus:
            self._store_regs(sketches, k, reg)
        dirty = self._dirty.get(k)
        if dirty is None:
            self._dirty[k] = set(changed.tolist())
        else:
            dirty.update(changed.tolist())
        return len(changed)

    def count(self, key: Any) -> int:
        """The estimated number of distinct items added under ``key`` (0 if none)."""
        sk = self._require_open().get(self._enc_key(key))
        if sk is None:
            return 0
        if type(sk) is dict:
            sk = HyperLogLogPlusPlus(reg=self._dense_regs(sk), hashfunc=item_hash)
        return int(round(float(sk.count())))

    def merge_into(self, key: Any, other_keys: Iterable[Any]) -> None:
        """Make ``key``'s sketch the union of itself and ``other_keys``' sketches (keys
        never added to are empty). The others are unchanged. O(2**p) per other key."""
        sketches = self._require_open()
        k = self._enc_key(key)
        others = [sketches.get(self._enc_key(o)) for o in other_keys]
        regs = [self._dense_regs(o) for o in others if o is not None]
        if not regs:
            return
        current = self._dense_regs(sketches.get(k))
        merged = np.maximum.reduce([current, *regs])
        changed = np.flatnonzero(merged != current)
        if len(changed):
            self._store_regs(sketches, k, merged)
            self._dirty.setdefault(k, set()).update(changed.tolist())

    def delete(self, key: Any) -> bool:
        """Forget ``key``'s sketch; ``True`` if it existed (not an error otherwise)."""
        sketches = self._require_open()
        k = self._enc_key(key)
        sk = sketches.pop(k, None)
        self._dirty.pop(k, None)
        if sk is None:
            return False
        pack = _IDX.pack
        self._logger.log_all([(k + pack(i), None) for i in np.flatnonzero(self._dense_regs(sk)).tolist()])
        return True

    def keys(self) -> Iterator[Any]:
        """Every key with a non-empty sketch, decoded by ``key.serde`` (a snapshot)."""
        decode = self._key.decode if self._key is not None else bytes
        return iter([decode(k) for k in self._require_open()])

    def registers(self, key: Any) -> np.ndarray:
        """A copy of ``key``'s registers (``int8[2**p]``, zeros if none)."""
        sk = self._require_open().get(self._enc_key(key))
        return sk.reg.copy() if type(sk) is HyperLogLogPlusPlus else self._dense_regs(sk)

    def sketch(self, key: Any) -> HyperLogLogPlusPlus:
        """A copy of ``key``'s datasketch sketch, with the engine's fixed hash."""
        return HyperLogLogPlusPlus(reg=self.registers(key), hashfunc=item_hash)

    def __len__(self) -> int:
        return len(self._require_open())

    def __contains__(self, key: Any) -> bool:
        return self._enc_key(key) in self._require_open()

    # -- StorageEngine -------------------------------------------------------------------------------
    def prepare_commit(self) -> None:
        """Log the registers that grew since the last commit (one record each)."""
        sketches = self._require_open()
        dirty = self._dirty
        if not dirty:
            return
        records: list[ChangeRecord] = []
        if not self._meta_logged:
            records.append((META_KEY, self._meta))
            self._meta_logged = True
        pack = _IDX.pack
        for k, idxs in dirty.items():
            sk = sketches[k]
            if type(sk) is dict:
                records.extend([(k + pack(i), bytes((sk[i],))) for i in sorted(idxs)])
            else:
                values = sk.reg.tobytes()
                records.extend([(k + pack(i), values[i:i + 1]) for i in sorted(idxs)])
        self._dirty = {}
        self._logger.log_all(records)

    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        sketches = self._require_open()
        m = self._m
        latest: dict[bytes, dict[int, int]] = {}
        unpack = _IDX.unpack
        for rk, v in records:
            if len(rk) < 2:
                if rk == META_KEY:
                    self._check_meta(v)
                    continue
                raise CorruptionError(
                    f"store {self.name!r}: change record key {rk!r} is not a hyperloglog register key; "
                    "the changelog does not belong to a hyperloglog store"
                )
            per = latest.get(rk[:-2])
            if per is None:
                per = latest[rk[:-2]] = {}
            per[unpack(rk[-2:])[0]] = 0 if v is None else v[0]
        for k, per in latest.items():
            idx = np.fromiter(per.keys(), dtype=np.intp, count=len(per))
            if int(idx.max()) >= m:
                raise CorruptionError(
                    f"store {self.name!r}: register index {int(idx.max())} in the changelog is out of range "
                    f"for precision {self.precision} ({m} registers)"
                )
            sk = sketches.get(k)
            reg = self._dense_regs(sk)
            reg[idx] = np.fromiter(per.values(), dtype=np.int8, count=len(per))
            self._store_regs(sketches, k, reg)

    def _check_meta(self, value: bytes | None) -> None:
        if value is None or value == self._meta:
            self._meta_logged = value is not None
            return
        raise ConfigError(
            f"store {self.name!r}: its changelog was written by a sketch with {value.decode(errors='replace')!r}, "
            f"but stores.{self.name}.hyperloglog.precision = {self.precision} now. Restore with the "
            "original precision, or use a new changelog stream to start new sketches."
        )

    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        sketches = self._require_open()
        out: list[ChangeRecord] = []
        for rk in keys:
            if rk == META_KEY:
                out.append((rk, self._meta if self._meta_logged else None))
                continue
            sk = sketches.get(rk[:-2]) if len(rk) >= 2 else None
            i = _IDX.unpack(rk[-2:])[0] & self._mask if sk is not None else 0
            v = 0 if sk is None else (sk.get(i, 0) if type(sk) is dict else int(sk.reg[i]))
            out.append((rk, bytes((v,)) if v else None))
        return out

    def flush(self) -> None:
        self._require_open()

    def close(self) -> None:
        self._sketches = None
        self._dirty = {}

    def _check(self) -> None:
        """Verify every invariant in O(total registers); raises AssertionError."""
        sketches = self._require_open()
        for k, sk in sketches.items():
            if type(sk) is dict:
                assert 0 < len(sk) <= self._sparse_limit, (k, len(sk))
                assert all(0 <= i < self._m and 0 < v <= self._max_rank + 1 for i, v in sk.items()), k
                continue
            reg = sk.reg
            assert reg.dtype == np.int8 and reg.shape == (self._m,), (k, reg.dtype, reg.shape)
            assert sk.p == self.precision and sk.hashfunc is item_hash, k
            assert int(reg.min()) >= 0 and int(reg.max()) <= self._max_rank + 1, k
        for k, idxs in self._dirty.items():
            assert k in sketches, k
            regs = self._dense_regs(sketches[k])
            assert all(0 <= i < self._m and regs[i] > 0 for i in idxs), k


class HyperLogLogEngineFactory(StorageEngineFactory):
    """Factory ``hyperloglog``: option ``stores.<s>.hyperloglog.precision`` (4..16, default 14)."""

    options_prefix = "hyperloglog"
    options_type = HyperLogLogOptions
    description = "keyed HyperLogLog++ distinct counters (datasketch + xxh3); register-delta change records"

    def create(self, spec: StoreSpec, context: StoreContext) -> HyperLogLogEngine:
        return HyperLogLogEngine(context, spec.options)
