"""What the commit/restore checks cost: commit and open times of one task.

Run as a script against whichever ``localstate`` is importable, so two trees can be
compared in the same session (``PYTHONPATH=<tree> python benchmarks/trust_overhead.py``)::

    python benchmarks/trust_overhead.py --engine rocksdb --json out.json

Measures, for one store on the file changelog with fsync on (the defaults):

- ``commit_ms``: median wall time of ``commit()`` after ``puts`` puts of distinct keys
  (the whole protocol: cache flush, changelog append + fsync, engine flush/checkpoint,
  task checkpoint write);
- ``empty_commit_ms``: median ``commit()`` with nothing to write (the fixed cost);
- ``open_ms``: median time to open the task with its local copy present
  (``TaskStorage(...)``: checkpoint read, checks, local state reuse) and
  ``open_full_ms`` with the local copy deleted (a full restore of ``records`` records).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _config(root: Path, engine: str) -> Any:
    from localstate import Config

    return Config.from_dict({
        "job.name": "overhead",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.s.factory": engine,
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "json",
        "stores.s.object.cache.size": 10_000,
        "stores.s.write.batch.size": 500,
    })


def measure(engine: str, commits: int, puts: int, records: int, opens: int) -> dict[str, Any]:
    from localstate import TaskStorage

    root = Path(tempfile.mkdtemp(prefix="ls-overhead-"))
    try:
        config = _config(root, engine)
        commit_s: list[float] = []
        empty_s: list[float] = []
        with TaskStorage(config) as s:
            store = s.store("s")
            n = 0
            for _commit in range(commits):
                for _ in range(puts):
                    store.put(f"k{n % records:08d}", {"n": n})
                    n += 1
                t0 = time.perf_counter()
                s.commit(input_position={"n": n})
                commit_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                s.commit(input_position={"n": n})
                empty_s.append(time.perf_counter() - t0)
            # fill up to ``records`` keys for the open figures
            while n < records:
                store.put_all([(f"k{i:08d}", {"n": i}) for i in range(n, min(records, n + 50_000))])
                n = min(records, n + 50_000)
                s.commit(input_position={"n": n})
        open_s: list[float] = []
        full_s: list[float] = []
        for _ in range(opens):
            t0 = time.perf_counter()
            TaskStorage(config).close()
            open_s.append(time.perf_counter() - t0)
            shutil.rmtree(root / "state" / "overhead" / "s")
            t0 = time.perf_counter()
            TaskStorage(config).close()
            full_s.append(time.perf_counter() - t0)
        return {
            "engine": engine,
            "commit_ms": statistics.median(commit_s) * 1000,
            "empty_commit_ms": statistics.median(empty_s) * 1000,
            "open_ms": statistics.median(open_s) * 1000,
            "open_full_ms": statistics.median(full_s) * 1000,
            "commits": commits,
            "puts_per_commit": puts,
            "records": records,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="append", default=None)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--puts", type=int, default=100)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--opens", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = [measure(e, args.commits, args.puts, args.records, args.opens) for e in args.engine or ["memory", "rocksdb"]]
    for r in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
