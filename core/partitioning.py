"""Which task a key belongs to: Spark's hash partitioning, reproduced exactly.

:class:`~localstate.contrib.spark.StatefulJob` routes input rows to tasks with
``df.repartition(N, key)``: Spark's ``HashPartitioning``, whose partition id is
``pmod(murmur3_x86_32(key, seed=42), N)`` — the same value as the SQL expression
``pmod(hash(key), N)``. :func:`task_for` computes it without Spark, so tools that
move state between tasks (``localstate rescale``) put every key's state in the task
that will receive its rows. ``tests/test_partitioning.py`` proves the equality
against a real Spark session for every supported type.

Spark hashes a value by its **column type**; a Python value maps to the type a
PySpark/Arrow column of it gets by default:

=========  =================  ==================================================
Python     Spark column type  hash
=========  =================  ==================================================
``str``    StringType         UTF-8 bytes, Spark's ``hashUnsafeBytes`` (its own
                              tail handling: one byte at a time, sign-extended)
``bytes``  BinaryType         the same over the raw bytes
``int``    LongType (int64)   ``hashLong``; ``as_int32=True`` for an IntegerType
                              (int32) column: ``hashInt``
``bool``   BooleanType        ``hashInt(1 or 0)``
``float``  DoubleType         ``hashLong(doubleToLongBits)``, ``-0.0`` as ``0.0``
``None``   any (null)         the seed (a null key goes to ``pmod(42, N)``)
=========  =================  ==================================================
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from .errors import InvalidValueError

__all__ = ["SPARK_HASH_SEED", "spark_hash", "spark_hashes", "task_for"]

SPARK_HASH_SEED = 42
"""The seed of Spark's ``Murmur3Hash`` expression (``hash()``, ``HashPartitioning``)."""

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_DOUBLE = struct.Struct("<d")
_LONG = struct.Struct("<q")


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    k1 = ((k1 << 15) | (k1 >> 17)) & _M32
    return (k1 * _C2) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = ((h1 << 13) | (h1 >> 19)) & _M32
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed & _M32, _mix_k1(value & _M32)), 4)


def _hash_long(value: int, seed: int) -> int:
    h1 = _mix_h1(seed & _M32, _mix_k1(value & _M32))
    h1 = _mix_h1(h1, _mix_k1((value >> 32) & _M32))
    return _fmix(h1, 8)


def _hash_bytes(data: bytes, seed: int) -> int:
    # Spark's hashUnsafeBytes (kept by Spark for compatibility, unlike the reference
    # murmur3 tail): whole little-endian 4-byte words, then every remaining byte as a
    # sign-extended int mixed in on its own. _mix_k1/_mix_h1 inlined: this loop is the
    # hot path of a rescale (one call per key).
    n = len(data)
    aligned = n - n % 4
    h1 = seed & _M32
    words = [w for (w,) in struct.iter_unpack("<I", data[:aligned])]
    words += [(b - 256 if b > 127 else b) & _M32 for b in data[aligned:]]
    for k1 in words:
        k1 = (k1 * _C1) & _M32
        k1 = (((k1 << 15) | (k1 >> 17)) * _C2) & _M32
        h1 ^= k1
        h1 = ((((h1 << 13) | (h1 >> 19)) & _M32) * 5 + 0xE6546B64) & _M32
    return _fmix(h1, n)


def spark_hash(value: Any, *, as_int32: bool = False, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash(value)`` (a signed 32-bit int) for the column type ``value``'s
    Python type maps to (see the module table). Raises :class:`InvalidValueError` for
    other types, and for an ``int`` outside int64 (int32 with ``as_int32``)."""
    if value is None:
        return seed
    t = type(value)
    if t is bool:
        return _hash_int(int(value), seed)
    if t is int:
        lo, hi = (-(1 << 31), 1 << 31) if as_int32 else (-(1 << 63), 1 << 63)
        if not lo <= value < hi:
            raise InvalidValueError(
                f"key {value!r} does not fit the {'int32' if as_int32 else 'int64'} column Spark would route it by"
            )
        return _hash_int(value, seed) if as_int32 else _hash_long(value, seed)
    if t is str:
        return _hash_bytes(value.encode("utf-8"), seed)
    if t is bytes:
        return _hash_bytes(value, seed)
    if t is float:
        if math.isnan(value):
            raise InvalidValueError("a NaN key has no Spark partition this library reproduces")
        return _hash_long(_LONG.unpack(_DOUBLE.pack(value + 0.0))[0], seed)
    raise InvalidValueError(
        f"cannot route key {value!r} ({t.__name__}) the way Spark does: routing keys are str, bytes, "
        "int, bool, float or None"
    )


def task_for(value: Any, partitions: int, *, as_int32: bool = False) -> int:
    """The task (0..partitions-1) ``df.repartition(partitions, key)`` sends a row with
    key ``value`` to: ``pmod(spark_hash(value), partitions)``."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise InvalidValueError(f"partitions must be an int >= 1, got {partitions!r}")
    return spark_hash(value, as_int32=as_int32) % partitions


def spark_hashes(values: Sequence[Any], *, as_int32: bool = False) -> list[int]:
    """``[spark_hash(v, as_int32=as_int32) for v in values]``, vectorised with numpy
    (when installed) over the strings and bytes of each length and over int64 ints —
    the keys of a store usually share a few lengths — and per value otherwise."""
    try:
        import numpy as np
    except ImportError:
        return [spark_hash(v, as_int32=as_int32) for v in values]
    out = [0] * len(values)
    by_length: dict[int, tuple[list[int], list[bytes]]] = {}
    longs: tuple[list[int], list[int]] = ([], [])
    for i, v in enumerate(values):
        t = type(v)
        if t is str or t is bytes:
            data = v.encode("utf-8") if t is str else v
            slot = by_length.get(len(data))
            if slot is None:
                slot = by_length[len(data)] = ([], [])
            slot[0].append(i)
            slot[1].append(data)
        elif t is int and not as_int32 and -(1 << 63) <= v < (1 << 63):
            longs[0].append(i)
            longs[1].append(v)
        else:
            out[i] = spark_hash(v, as_int32=as_int32)
    m32 = np.uint64(_M32)

    def mix(h: Any, k1: Any) -> Any:
        k1 = (k1 * np.uint64(_C1)) & m32
        k1 = (((k1 << np.uint64(15)) | (k1 >> np.uint64(17))) * np.uint64(_C2)) & m32
        h = h ^ k1
        return ((((h << np.uint64(13)) | (h >> np.uint64(19))) & m32) * np.uint64(5) + np.uint64(0xE6546B64)) & m32

    def fmix(h: Any, length: int) -> list[int]:
        h = h ^ np.uint64(length)
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x85EBCA6B)) & m32
        h ^= h >> np.uint64(13)
        h = (h * np.uint64(0xC2B2AE35)) & m32
        h ^= h >> np.uint64(16)
        return (h.astype(np.int64) - ((h >= np.uint64(1 << 31)).astype(np.int64) << 32)).tolist()

    seed = np.uint64(SPARK_HASH_SEED)
    for n, (idx, blobs) in by_length.items():
        rows = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), n)
        aligned = n - n % 4
        h = np.full(len(blobs), seed, dtype=np.uint64)
        if aligned:
            words = np.ascontiguousarray(rows[:, :aligned]).view("<u4").astype(np.uint64)
            for j in range(aligned // 4):
                h = mix(h, words[:, j])
        for j in range(aligned, n):  # Spark's tail: each byte sign-extended, mixed on its own
            h = mix(h, rows[:, j].view(np.int8).astype(np.int64).astype(np.uint64) & m32)
        for i, value in zip(idx, fmix(h, n)):
            out[i] = value
    if longs[0]:
        v = np.array(longs[1], dtype=np.int64).view(np.uint64)
        h = mix(np.full(len(v), seed, dtype=np.uint64), v & m32)
        h = mix(h, v >> np.uint64(32))
        for i, value in zip(longs[0], fmix(h, 8)):
            out[i] = value
    return out
