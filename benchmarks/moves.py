"""What a task pays when it moves to a machine without its state (a lost executor, a
resized cluster): its first open there, with shipped snapshots and without.

One rocksdb task with the file changelog fills ``records`` keys (16-byte keys, 100-byte
values, 10,000 per commit, ``snapshot.interval.records`` at its default 500,000), then
rewrites a tenth of them, so the log holds more records than the state. The changelog
directory is on ``/dev/shm`` when it exists: another filesystem than the state dirs, so
snapshot files are copied there, not hard-linked, as to a cluster's shared storage.

Timed, each run on a new empty state dir ("another machine"):

* ``move: full replay`` — ``systems.file.snapshots = false``: the open replays the
  partition's whole changelog (what every move cost before snapshots were shipped);
* ``move: shipped snapshot`` — the open fetches the newest shipped snapshot and replays
  the records after it.

Rates are seconds per GB of state (its keys and values: ``records`` × 116 bytes);
``notes`` give the records each open replayed and the bytes it fetched. A third row
gives what shipping costs the writer: the load's commit time with shipping against
without (``ratio`` = with / without), the snapshot files being copied to the other
filesystem.

CI form (``quick``): 60,000 keys, small snapshot interval. Default: 2,000,000 keys
(about 0.3 GB of state).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run"]

FULL_RECORDS = 2_000_000
QUICK_RECORDS = 60_000
COMMIT_EVERY = 10_000
VALUE = random.Random(3).randbytes(100)


def _values(changelog: Path, state: Path, interval: int, ship: bool) -> dict[str, Any]:
    return {
        "job.name": "moves",
        "job.state.dir": str(state),
        "systems.file.path": str(changelog),
        "systems.file.snapshots": ship,
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.moves-kv",
        "stores.kv.key.serde": "bytes",
        "stores.kv.msg.serde": "bytes",
        "stores.kv.object.cache.size": 10_000,
        "stores.kv.write.batch.size": 5_000,
        "stores.kv.rocksdb.snapshot.interval.records": interval,
    }


def _load(values: dict[str, Any], records: int) -> float:
    """Fill, then rewrite a tenth; the seconds spent in ``commit()``."""
    committing = 0.0
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        rng = random.Random(1)
        keys = [rng.randbytes(16) for _ in range(records)]
        for pass_keys in (keys, keys[: records // 10]):
            for i in range(0, len(pass_keys), COMMIT_EVERY):
                kv.put_all([(k, VALUE) for k in pass_keys[i : i + COMMIT_EVERY]])
                with Stopwatch() as watch:
                    s.commit()
                committing += watch.wall
    return committing


def _open_elsewhere(values: dict[str, Any], where: Path) -> tuple[float, int, int]:
    """Seconds of the first open on an empty state dir, records replayed, bytes fetched."""
    shutil.rmtree(where, ignore_errors=True)
    with Stopwatch() as watch:  # the open, not the close
        s = TaskStorage(Config.from_dict({**values, "job.state.dir": str(where)}))
    with s:
        replayed = s.last_restore["kv"].records
    seconds = watch.wall
    fetched = sum(p.stat().st_size for p in where.rglob("snapshots/*/*") if p.is_file())
    shutil.rmtree(where, ignore_errors=True)
    return seconds, replayed, fetched


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    records = QUICK_RECORDS if quick else FULL_RECORDS
    interval = 20_000 if quick else 500_000
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="localstate-moves-"))
    shared = Path(tempfile.mkdtemp(prefix="localstate-moves-", dir=shm if shm.is_dir() else None))
    params = {"records": records, "snapshot.interval.records": interval,
              "changelog": "another filesystem" if shm.is_dir() else "same filesystem (hard links)"}
    try:
        loads: dict[bool, list[float]] = {True: [], False: []}
        opens: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
        state_bytes = records * (16 + len(VALUE))
        for ship in (True, False):
            values = _values(shared / f"changelog-{ship}", root / f"machine-a-{ship}", interval, ship)
            loads[ship].append(_load(values, records))
            for _ in range(repeats):
                opens[ship].append(_open_elsewhere(values, root / "machine-b"))
        gb = state_bytes / 1e9
        rows = []
        for ship, name in ((False, "move: full replay"), (True, "move: shipped snapshot")):
            runs = [t / gb for t, _, _ in opens[ship]]
            replayed = statistics.median(r for _, r, _ in opens[ship])
            fetched = statistics.median(f for _, _, f in opens[ship])
            rows.append(make_row(name, "rocksdb", params, "s/GB", runs, baseline=None if not ship else "move: full replay",
                                 notes=f"state {state_bytes / 1e6:.0f} MB; replayed {replayed:.0f} records; "
                                       f"fetched {fetched / 1e6:.0f} MB"))
        rows.append(make_row("move: commit time with shipping", "rocksdb", params, "s", loads[True],
                             notes=f"without shipping {loads[False][0]:.2f} s for the same load "
                                   f"(ratio {loads[True][0] / loads[False][0]:.2f})"))
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    import json
    import sys

    for row in run(quick="--quick" in sys.argv, repeats=3):
        print(json.dumps({k: row[k] for k in ("workload", "median", "min", "max", "unit", "notes")}))
