"""The core figure: the core write and restore path, memory engine + file changelog.

1,000,000 puts of 16-byte string keys and 100-byte JSON values through
``TaskStorage(...).store()`` (object cache, json serde, logged layer), a commit
every 10,000 writes (fsync'd file changelog), then a reopen that restores every
record from that log. Target: restore >= 1M records/s.

Rows: ``core_write`` (ops/s, commits included), ``core_restore`` (records/s and
MB/s of changelog bytes, as reported by TaskStorage's restore listener data),
each against an in-process baseline measured in the same run:
``dict`` — the same puts into a plain dict (write), and a dict built from the
already-decoded records (restore's ideal).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import orjson
from localstate import Config, TaskStorage

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run", "CoreFigure", "json_values"]

FULL_RECORDS = 1_000_000
QUICK_RECORDS = 20_000
COMMIT_EVERY = 10_000
QUICK_COMMIT_EVERY = 1_000
KEY_SIZE = 16
VALUE_SIZE = 100
TARGET_RESTORE_RPS = 1_000_000


def json_values(count: int, size: int = VALUE_SIZE) -> list[dict[str, Any]]:
    """``count`` distinct JSON objects whose compact encoding is exactly ``size`` bytes."""
    out = []
    for i in range(count):
        obj: dict[str, Any] = {"user": f"u{i:06d}", "page": f"/p/{i % 97}", "n": i, "pad": ""}
        pad = size - len(orjson.dumps(obj))
        if pad < 0:
            raise ValueError(f"JSON values of {size} bytes are too small for the benchmark record")
        obj["pad"] = "x" * pad
        out.append(obj)
    return out


class CoreFigure:
    """One write + restore trial at ``records`` records under a fresh directory."""

    def __init__(self, records: int, commit_every: int, workdir: str | None = None, *,
                 key_order: str = "random") -> None:
        self.records = records
        self.commit_every = commit_every
        self.workdir = workdir
        order = list(range(records))
        if key_order == "random":
            random.Random(2).shuffle(order)
        elif key_order != "sequential":
            raise ValueError(f"key_order must be 'random' or 'sequential', not {key_order!r}")
        self.keys = [f"user:{i:011d}" for i in order]
        assert len(self.keys[0].encode()) == KEY_SIZE
        self.values = json_values(1000)

    def config(self, root: Path) -> Config:
        return Config.from_dict({
            "job.name": "core",
            "job.state.dir": str(root / "state"),
            "systems.file.path": str(root / "changelog"),
            "stores.events.factory": "memory",
            "stores.events.key.serde": "string",
            "stores.events.msg.serde": "json",
        })

    def trial(self) -> dict[str, float]:
        """Write then restore once; returns write ops/s, restore records/s and MB/s."""
        root = Path(tempfile.mkdtemp(prefix="lscore-", dir=self.workdir))
        try:
            config = self.config(root)
            keys, values, every = self.keys, self.values, self.commit_every
            nvals = len(values)
            with Stopwatch() as watch:
                with TaskStorage(config, 0) as storage:
                    put = storage.store("events").put
                    commit = storage.commit
                    for start in range(0, len(keys), every):
                        for i in range(start, min(start + every, len(keys))):
                            put(keys[i], values[i % nvals])
                        commit(input_position=start + every)
            write_s = watch.wall
            with Stopwatch() as watch, TaskStorage(config, 0) as storage:
                r = storage.last_restore["events"]
            open_s = watch.wall
            if r.records != len(keys):
                raise AssertionError(f"restored {r.records} records, wrote {len(keys)}")
            return {
                "write": len(keys) / write_s,
                "restore_rps": r.records / r.seconds,
                "restore_mbs": r.bytes / 1e6 / r.seconds,
                "open_s": open_s,
                "log_bytes": float(r.bytes),
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def baseline(self) -> dict[str, float]:
        """The same work on a plain dict: puts of encoded records, and a bulk build."""
        keys, values = self.keys, self.values
        nvals = len(values)
        encoded_vals = [orjson.dumps(v) for v in values]
        pairs = [(k.encode(), encoded_vals[i % nvals]) for i, k in enumerate(keys)]
        d: dict[bytes, bytes] = {}
        with Stopwatch() as watch:
            for k, v in pairs:
                d[k] = v
        write = len(pairs) / watch.wall
        with Stopwatch() as watch:
            built = dict(pairs)
        restore = len(built) / watch.wall
        nbytes = sum(len(k) + len(v) for k, v in pairs)
        return {"write": write, "restore_rps": restore, "restore_mbs": restore * nbytes / len(pairs) / 1e6}


def _figure(key_order: str, quick: bool, repeats: int) -> list[dict[str, Any]]:
    records = QUICK_RECORDS if quick else FULL_RECORDS
    every = QUICK_COMMIT_EVERY if quick else COMMIT_EVERY
    fig = CoreFigure(records, every, key_order=key_order)
    fig.trial()  # warm-up
    trials = [fig.trial() for _ in range(repeats)]
    fig.baseline()
    bases = [fig.baseline() for _ in range(repeats)]
    params = {
        "records": records, "key_size": KEY_SIZE, "value_size": VALUE_SIZE, "commit_every": every,
        "key_order": key_order, "engine": "memory", "changelog": "file (fsync)", "key_serde": "string",
        "msg_serde": "json",
    }
    suffix = "" if key_order == "random" else "_seq"
    write, restore = f"core_write{suffix}", f"core_restore{suffix}"
    rps = [t["restore_rps"] for t in trials]
    verdict = "meets" if statistics.median(rps) >= TARGET_RESTORE_RPS else "misses"
    if quick:
        verdict = f"quick run ({records} records): {verdict}"
    log_mb = statistics.median(t["log_bytes"] for t in trials) / 1e6
    rows = [
        make_row(write, "memory+file", params, "ops/s", [t["write"] for t in trials], baseline="dict",
                 notes=f"{records} puts ({key_order} key order) via TaskStorage.store(), a commit every {every}"),
        make_row(restore, "memory+file", params, "records/s", rps, baseline="dict",
                 notes=f"{verdict} the >= 1M records/s target ({key_order} keys); log {log_mb:.1f} MB; "
                       f"open incl. restore median {statistics.median(t['open_s'] for t in trials):.2f}s"),
        make_row(restore, "memory+file", params, "MB/s", [t["restore_mbs"] for t in trials],
                 baseline="dict", notes="changelog bytes read per second (batch headers included)"),
        make_row(write, "dict", params, "ops/s", [b["write"] for b in bases],
                 notes="the same encoded records put into a plain dict"),
        make_row(restore, "dict", params, "records/s", [b["restore_rps"] for b in bases],
                 notes="dict(pairs) from decoded records in memory: restore's ideal (no key order)"),
        make_row(restore, "dict", params, "MB/s", [b["restore_mbs"] for b in bases],
                 notes="key + value bytes per second of dict(pairs)"),
    ]
    base = {(r["workload"], r["unit"]): r["median"] for r in rows if r["engine"] == "dict"}
    for r in rows:
        if r["baseline"] == "dict":
            r["ratio"] = r["median"] / base[(r["workload"], r["unit"])]
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """The core figure (warm-up, then ``repeats`` trials) with the dict baseline.

    Keys arrive in random order (``core_*``: the sorted map must sort them on
    restore) and in key order (``core_*_seq``: e.g. time-ordered ids).
    """
    return _figure("random", quick, repeats) + _figure("sequential", quick, repeats)
