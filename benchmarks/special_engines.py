"""The figures of the ``topn``, ``hyperloglog`` and ``bloom`` engines.

Every engine figure runs through ``TaskStorage(...).store()`` with the file changelog
on (commits included, fsync'd); each is paired with a raw-library baseline measured in
the same run on the same data:

* ``topn_offer`` — 1M offers (string members, random int scores) over 100k members,
  capacity 100, ``offer_all`` in batches of 10k with a commit after each. Baseline:
  the same bounded top-N written directly on ``dict`` + ``SortedList`` (no encoding,
  no logging). Target >= 300k offers/s.
* ``hll_update`` — 1M distinct string items into one key, ``add_all`` in batches of
  100k with a commit after each. Baseline: datasketch ``HyperLogLogPlusPlus.update``
  per item with the same xxh3 hash (raw datasketch + xxhash). Target >= 1.5M/s.
  Also ``hll_commit_bytes`` (changelog bytes of one commit after 10k more items into
  the 1M sketch: delta logging) and ``hll_rel_error`` at 1M distinct.
* ``bloom_add`` / ``bloom_lookup`` — 1M items, capacity 1M, fp.rate 0.01, batched;
  ``bloom_commit`` is the commit that logs the changed words after the adds.
  Baseline: a Python ``set`` (exact membership, ``update`` / a ``map`` of
  ``__contains__``). Target >= 5M/s. Also ``bloom_fp_rate`` on 1M absent items.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from typing import Any

from localstate import Config, TaskStorage
from sortedcontainers import SortedList

from .runner import add_ratios, make_row
from .timing import Stopwatch, repeat_trials

__all__ = ["run"]


def _config(root: str, **store: Any) -> Config:
    return Config.from_dict({
        "job.name": "bench", "job.state.dir": f"{root}/state", "systems.file.path": f"{root}/log",
        **{f"stores.s.{k}": v for k, v in store.items()},
    })


# -- top-N ---------------------------------------------------------------------------------
def _topn_rows(quick: bool, repeats: int) -> list[dict[str, Any]]:
    n, members, cap, batch = (50_000, 5_000, 100, 5_000) if quick else (1_000_000, 100_000, 100, 10_000)
    rng = random.Random(1)
    offers = [(f"page-{rng.randrange(members)}", rng.randrange(1_000_000)) for _ in range(n)]
    params = {"offers": n, "members": members, "capacity": cap, "batch": batch, "changelog": "file"}

    def ours() -> float:
        root = tempfile.mkdtemp(prefix="bench-topn-")
        try:
            with TaskStorage(_config(root, factory="topn", **{"key.serde": "string", "topn.size": cap})) as s:
                t = s.store("s")
                with Stopwatch() as watch:
                    for i in range(0, n, batch):
                        t.offer_all(offers[i:i + batch])
                        s.commit()
                return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw() -> float:
        entries: dict[str, int] = {}
        order = SortedList()
        with Stopwatch() as watch:
            for m, score in offers:
                old = entries.get(m)
                if old is not None:
                    order.remove((-old, m))
                elif len(entries) >= cap:
                    worst = order[-1]
                    if (-score, m) >= worst:
                        continue
                    del order[-1]
                    del entries[worst[1]]
                order.add((-score, m))
                entries[m] = score
        return n / watch.wall

    base = make_row("topn_offer", "dict+SortedList (raw)", params, "ops/s", repeat_trials(raw, repeats))
    row = make_row("topn_offer", "topn", params, "ops/s", repeat_trials(ours, repeats), baseline=base["engine"],
                   notes="offer_all + commit per batch; target >= 300k/s")
    return [row, base]


# -- HyperLogLog -----------------------------------------------------------------------------
def _hll_rows(quick: bool, repeats: int) -> list[dict[str, Any]]:
    from datasketch import HyperLogLogPlusPlus
    from localstate.engines.hyperloglog import item_hash

    n, batch, p = (100_000, 20_000, 14) if quick else (1_000_000, 100_000, 14)
    items = [f"viewer-{i}" for i in range(n)]
    extra = [f"late-viewer-{i}" for i in range(10_000)]
    params = {"items": n, "batch": batch, "precision": p, "changelog": "file"}
    figures: dict[str, list[float]] = {"bytes": [], "error": []}

    def ours() -> float:
        root = tempfile.mkdtemp(prefix="bench-hll-")
        try:
            with TaskStorage(_config(root, factory="hyperloglog",
                                     **{"key.serde": "string", "hyperloglog.precision": p})) as s:
                h = s.store("s")
                with Stopwatch() as watch:
                    for i in range(0, n, batch):
                        h.add_all("page", items[i:i + batch])
                        s.commit()
                rate = n / watch.wall
                figures["error"].append(abs(h.count("page") - n) / n)
                log = s.changelog("s")
                start = log.end_offset()
                h.add_all("page", extra)
                s.commit()
                figures["bytes"].append(float(sum(len(k) + len(v or b"") for k, v in log.read(start, log.end_offset()))))
                return rate
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw() -> float:
        sketch = HyperLogLogPlusPlus(p=p, hashfunc=item_hash)
        update = sketch.update
        with Stopwatch() as watch:
            for x in items:
                update(x)
        return n / watch.wall

    base = make_row("hll_update", "datasketch+xxh3 (raw)", params, "ops/s", repeat_trials(raw, repeats))
    row = make_row("hll_update", "hyperloglog", params, "ops/s", repeat_trials(ours, repeats), baseline=base["engine"],
                   notes="add_all + commit per batch; target >= 1.5M/s")
    timed = slice(1, None)  # drop the warm-up's figures
    return [
        row, base,
        make_row("hll_commit_bytes", "hyperloglog", {**params, "added": len(extra)}, "bytes",
                 figures["bytes"][timed], notes="changelog key+value bytes of one commit (delta logging; "
                 f"a full sketch is {1 << p} bytes)"),
        make_row("hll_rel_error", "hyperloglog", params, "ratio", figures["error"][timed],
                 notes=f"|count - {n}| / {n}"),
    ]


# -- Bloom -------------------------------------------------------------------------------------
def _bloom_rows(quick: bool, repeats: int) -> list[dict[str, Any]]:
    n, fp = (100_000, 0.01) if quick else (1_000_000, 0.01)
    items = [f"impression-{i}" for i in range(n)]
    absent = [f"other-{i}" for i in range(n)]
    params = {"items": n, "capacity": n, "fp_rate": fp, "changelog": "file"}
    lookups: list[float] = []
    rates: list[float] = []
    commits: list[float] = []

    def ours() -> float:
        root = tempfile.mkdtemp(prefix="bench-bloom-")
        try:
            with TaskStorage(_config(root, factory="bloom", **{"bloom.capacity": n, "bloom.fp.rate": fp})) as s:
                b = s.store("s")
                with Stopwatch() as watch:
                    b.add_all(items)
                rate = n / watch.wall
                with Stopwatch() as watch:
                    s.commit()
                commits.append(watch.wall)
                with Stopwatch() as watch:
                    hits = b.might_contain_all(items)
                lookups.append(n / watch.wall)
                assert hits.all()
                rates.append(float(b.might_contain_all(absent).mean()))
                return rate
        finally:
            shutil.rmtree(root, ignore_errors=True)

    set_lookups: list[float] = []

    def raw() -> float:
        seen: set[str] = set()
        with Stopwatch() as watch:
            seen.update(items)
        rate = n / watch.wall
        with Stopwatch() as watch:
            all(map(seen.__contains__, items))
        set_lookups.append(n / watch.wall)
        return rate

    base = make_row("bloom_add", "python set (exact)", params, "ops/s", repeat_trials(raw, repeats))
    row = make_row("bloom_add", "bloom", params, "ops/s", repeat_trials(ours, repeats), baseline=base["engine"],
                   notes="one add_all (dirty words tracked); target >= 5M/s")
    timed = slice(1, None)
    base_look = make_row("bloom_lookup", "python set (exact)", params, "ops/s", set_lookups[timed])
    look = make_row("bloom_lookup", "bloom", params, "ops/s", lookups[timed], baseline=base_look["engine"],
                    notes="might_contain_all; target >= 5M/s")
    return [
        row, base, look, base_look,
        make_row("bloom_commit", "bloom", params, "s", commits[timed],
                 notes="the commit after the adds: one changelog record per changed word, fsync'd"),
        make_row("bloom_fp_rate", "bloom", params, "ratio", rates[timed],
                 notes=f"measured on {n} absent items; configured {fp}"),
    ]


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """All rows of the three engines (``quick``: small sizes that finish in seconds)."""
    rows = _topn_rows(quick, repeats) + _hll_rows(quick, repeats) + _bloom_rows(quick, repeats)
    add_ratios(rows)
    return rows
