"""The data of the generic benchmark workloads: keys and values of one parameter set,
generated once per process (setup is never timed), key orders and Zipf samples.

Keys are big-endian record numbers of ``key_size`` bytes (so sequential order is key
order); values are distinct random bytes.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import lru_cache

from .runner import (
    BenchParams,
)

__all__ = ["Dataset", "dataset", "key_order", "zipf_sample"]


# -- data -----------------------------------------------------------------------------------
@dataclass
class Dataset:
    """Keys and values of one parameter set, generated once (setup is never timed)."""

    keys: list[bytes]
    values: list[bytes]
    missing: list[bytes]

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.keys)) + sum(map(len, self.values))


@lru_cache(maxsize=2)
def dataset(params: BenchParams) -> Dataset:
    n, ks = params.records, params.key_size
    keys = [i.to_bytes(ks, "big") for i in range(n)]
    missing = [(n + i).to_bytes(ks, "big") for i in range(n)]
    rng = random.Random(params.seed)
    pool = rng.randbytes(params.value_size + 4096)
    vs = params.value_size
    values = [pool[i % 4096 : i % 4096 + vs] for i in range(n)]
    # distinct values: stamp the record number into the first bytes
    stamp = min(vs, 4)
    values = [i.to_bytes(8, "big")[-stamp:] + v[stamp:] for i, v in enumerate(values)]
    return Dataset(keys, values, missing)


def key_order(params: BenchParams, n: int, distribution: str | None = None) -> list[int]:
    """``n`` record numbers drawn by ``distribution`` (default ``params.distribution``)."""
    dist = distribution or params.distribution
    rng = random.Random(params.seed + n)
    size = params.records
    if dist == "sequential":
        return [i % size for i in range(n)]
    if dist == "uniform":
        if n == size:
            order = list(range(size))
            rng.shuffle(order)
            return order
        return [rng.randrange(size) for _ in range(n)]
    return zipf_sample(size, n, params.zipf_s, rng)


def zipf_sample(size: int, n: int, s: float, rng: random.Random) -> list[int]:
    """``n`` draws over ``size`` items with Zipf(s) popularity; hot items are scattered."""
    cum = list(itertools.accumulate(1.0 / (r ** s) for r in range(1, size + 1)))
    ranks = rng.choices(range(size), cum_weights=cum, k=n)
    scatter = list(range(size))
    rng.shuffle(scatter)
    return [scatter[r] for r in ranks]


