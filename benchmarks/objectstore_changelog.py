"""Objectstore changelog figures: commit latency and restore rate against a local S3 API
(moto_server started here) and ``file://``, vs the file changelog, in the same run.

* ``objectstore.commit`` — one task (``memory`` engine) commits ``records`` puts of 116
  bytes (16-byte key, 100-byte value) per commit: the changelog upload, the engine and
  the checkpoint write, as :meth:`TaskStorage.commit` runs them. Seconds per commit.
* ``objectstore.requests`` — requests and bytes per commit (PUT / GET / LIST / DELETE,
  counted by the system), the input of the cost model in docs/objectstore.md.
* ``objectstore.restore`` — a whole ``TaskStorage`` open on an empty state dir (the task
  moved to another machine): checkpoint read and claim, listing, download, replay.
* ``objectstore.snapshots`` — the ``rocksdb`` engine on moto, twice the commits over a
  key space of 1/12 of the records (the log is 12x the state), with ``snapshot.every`` 0
  (never) and 7: commit latency (uploads included) and the restore of the moved task
  (snapshot download + tail replay vs the whole changelog).

moto keeps objects in memory and runs on the same 2 cores as the client, so S3 figures
are client+server bound on this machine; a real S3 PUT takes ~20-60 ms.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.testing.s3 import MotoServer, objectstore_options

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run"]

VALUE = bytes(range(100))


def _values(kind: str, root: Path, server: MotoServer | None, engine: str = "memory",
            **extra: Any) -> dict[str, Any]:
    job = f"bench-{uuid.uuid4().hex[:8]}"
    values: dict[str, Any] = {
        "job.name": job,
        "job.state.dir": str(root / "state"),
        "stores.kv.factory": engine,
        "stores.kv.key.serde": "bytes",
        "stores.kv.msg.serde": "bytes",
        "stores.kv.write.batch.size": 1000,
    }
    if kind == "file":
        values.update({"systems.file.path": str(root / "changelog"), "job.changelog.system": "file"})
        return values
    values.update({"job.changelog.system": "s3", "job.checkpoint.system": "s3", "stores.kv.changelog": f"s3.{job}-kv"})
    if kind == "s3 (moto)":
        assert server is not None
        values.update(objectstore_options(server.endpoint, server.create_bucket(), job, **extra))
    else:
        values.update({"systems.s3.type": "objectstore", "systems.s3.path": f"file://{root}/objects"})
    return values


def _commits(values: dict[str, Any], commits: int, per_commit: int,
             keyspace: int | None = None) -> tuple[list[float], dict[str, int]]:
    """``commits`` commits of ``per_commit`` puts each (keys wrap at ``keyspace`` if given);
    seconds per commit and the requests they sent."""
    seconds = []
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        log = s.changelog("kv")
        system = getattr(log, "system", None)
        before = system.requests() if hasattr(system, "requests") else {}
        for c in range(commits):
            for i in range(per_commit):
                n = c * per_commit + i
                kv.put(b"%016d" % (n % keyspace if keyspace else n), VALUE)
            with Stopwatch() as watch:
                s.commit(input_position=c)
            seconds.append(watch.wall)
        after = system.requests() if hasattr(system, "requests") else {}
    return seconds, {k: after[k] - before.get(k, 0) for k in after}


def _restore(values: dict[str, Any], root: Path, n: int) -> tuple[float, dict[str, int]]:
    moved = {**values, "job.state.dir": str(root / f"moved-{uuid.uuid4().hex[:6]}")}
    with Stopwatch() as watch:  # the open, not the close
        s = TaskStorage(Config.from_dict(moved))
    dt = watch.wall
    with s:
        if s.last_restore["kv"].records != n:
            raise RuntimeError(f"restored {s.last_restore['kv'].records} records, expected {n}")
        system = getattr(s.changelog("kv"), "system", None)
        requests = system.requests() if hasattr(system, "requests") else {}
    return dt, requests


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Commit latency, requests per commit and restore rate: file changelog, objectstore on
    file:// and on moto S3, 500 records per commit (60 commits; 20 when ``quick``)."""
    commits = 20 if quick else 60
    per_commit = 500
    n = commits * per_commit
    repeats = max(1, min(repeats, 2) if quick else repeats)
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="objectstore-bench-"))
    try:
        with MotoServer() as server:
            for kind in ("file", "objectstore file://", "s3 (moto)"):
                params = {"commits": commits, "records_per_commit": per_commit, "record_bytes": 116}
                latencies: list[float] = []
                restores: list[float] = []
                requests: dict[str, int] = {}
                restore_requests: dict[str, int] = {}
                for r in range(repeats + 1):  # the first run warms up
                    d = root / f"{kind.split()[0]}-{r}"
                    values = _values(kind, d, server)
                    lat, req = _commits(values, commits, per_commit)
                    rest, rest_req = _restore(values, d, n)
                    if r:
                        latencies += lat
                        restores.append(rest)
                        requests, restore_requests = req, rest_req
                notes = {"file": "file changelog, fsync on", "objectstore file://": "objectstore on a local dir",
                         "s3 (moto)": "objectstore on moto_server 127.0.0.1"}[kind]
                rows.append(make_row("objectstore.commit", kind, params, "ms/commit",
                                     [x * 1000 for x in latencies], baseline=None if kind == "file" else "file",
                                     notes=notes))
                rows.append(make_row("objectstore.restore", kind, {**params, "records": n}, "records/s",
                                     [n / x for x in restores], baseline=None if kind == "file" else "file",
                                     notes="TaskStorage open on an empty state dir, memory engine"))
                if requests:
                    per = {k: v / commits for k, v in requests.items()}
                    rows.append(make_row("objectstore.requests", kind, {**params, **{k: round(v, 3) for k, v in per.items()}},
                                         "PUT/commit", [per["put"]], notes=f"per commit: {per}"))
                    rows.append(make_row("objectstore.restore_requests", kind, {**params, **restore_requests},
                                         "GET/restore", [restore_requests["get"]],
                                         notes=f"whole open of the moved task: {restore_requests}"))
            rows += _snapshot_rows(server, root, commits, per_commit, repeats)
        for kind in ("objectstore file://", "s3 (moto)"):
            ours = [r for r in rows if r["engine"] == kind]
            for row in ours:
                base = next((b for b in rows if b["engine"] == "file" and b["workload"] == row["workload"]), None)
                if base is not None and base["median"]:
                    row["ratio"] = row["median"] / base["median"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _snapshot_rows(server: MotoServer, root: Path, commits: int, per_commit: int, repeats: int) -> list[dict[str, Any]]:
    """rocksdb on moto, a log 12x its state (keys rewritten): snapshots every 7 commits or never."""
    rows = []
    commits *= 2
    keyspace = commits * per_commit // 12
    n = commits * per_commit
    for every in (0, 7):
        latencies: list[float] = []
        restores: list[float] = []
        replayed = 0
        for r in range(repeats + 1):
            d = root / f"snap{every}-{r}"
            values = _values("s3 (moto)", d, server, "rocksdb", **{"snapshot.every": every})
            lat, _ = _commits(values, commits, per_commit, keyspace)
            moved = {**values, "job.state.dir": str(d / "moved")}
            with Stopwatch() as watch:  # the open, not the close
                s = TaskStorage(Config.from_dict(moved))
            with s:
                replayed = s.last_restore["kv"].records
            dt = watch.wall
            if r:
                latencies += lat
                restores.append(dt)
        params = {"commits": commits, "records_per_commit": per_commit, "keys": keyspace,
                  "snapshot.every": every, "log_records": n, "replayed": replayed}
        name = f"rocksdb on moto, snapshot.every={every}"
        rows.append(make_row("objectstore.snapshots", name, params, "ms/commit", [x * 1000 for x in latencies],
                             notes="commit latency, snapshot uploads included"))
        rows.append(make_row("objectstore.snapshots", name, params, "s/restore", restores,
                             notes=f"open on an empty state dir: {replayed} of {n} log records replayed, "
                                   f"{keyspace} keys"))
    return rows
