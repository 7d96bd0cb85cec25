"""Same-run A/B of the change logger's hand-over to the changelog (issue 17, session 4).

The per-record path users feel: a rocksdb store (bytes serdes, default object cache),
random 16-byte keys / 100-byte values, ``put`` per record, ``commit()`` per 10,000, with a
Kafka changelog (a tansu broker started here) or a file changelog. Arms, alternating per
round after a warm-up round, medians of ``repeats``:

* ``now`` — this tree: the logger hands keys and values over as two lists
  (``append_columns``; Kafka produces from ``zip``, no tuple per record) and the file
  changelog encodes into one reused buffer (``BatchEncoder``).
* ``before (COMMIT)`` — ``ChangeLogger._drain`` as it was at ``COMMIT`` (``list(pending
  .items())`` handed to ``append``), compiled from ``git show``, and plain batches encoded
  by ``encode_batch`` then written in one piece, as before.
* ``raw rocksdict`` — ``WriteBatch`` per 10,000 keys, no changelog (the target's 0.67×);
  its GC column is not measured (nan).

Each arm reports puts/s (wall), puts per CPU-second of the main thread (``thread_time``)
and young-generation GC collections per 10k puts. Run::

    python -m localstate.benchmarks.ab_changelog_drain --records 200000 --repeats 3 --before a8c36e3~1
    python -m localstate.benchmarks.ab_changelog_drain --records 200000 --repeats 3 --before a8c36e3~1 --changelog file
    python -m localstate.benchmarks.ab_changelog_drain --records 500000 --repeats 3 --before a8c36e3~1 --changelog file --bulk

    python -m localstate.benchmarks.ab_changelog_drain --encode    # the batch encoding alone, ~10 s
    python -m localstate.benchmarks.ab_changelog_drain --search --records 100000 --repeats 5 --before a8c36e3~1

(``--bulk``: ``put_all`` of 10k per commit, the shape of bulk writes and search's
``index_all``, where the old drain's 10k tuples alive at once triggered young GCs.)
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.changelog.format import BatchEncoder, encode_batch
from localstate.changelogger import ChangeLogger

from .kafka_changelog import STORE_COMMIT_EVERY, _store_raw
from .quix_store_peer import keys_of, value_of

__all__ = ["main", "before_at"]

Figures = tuple[float, float, float]
"""puts/s (wall), puts per main-thread CPU-second, young GC collections per 10k puts."""


def _old_drain(commit: str) -> Callable[[ChangeLogger], None]:
    """``ChangeLogger._drain`` as it was at ``commit`` (its module compiled with the
    package's absolute imports)."""
    repo = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:core/changelogger.py"], check=True,
                            capture_output=True, text=True).stdout
    namespace: dict[str, Any] = {"__name__": "_changelogger_before"}
    exec(compile(source.replace("from .", "from localstate."), f"{commit}:core/changelogger.py", "exec"), namespace)
    return namespace["ChangeLogger"]._drain


def _write_in_one_piece(self: BatchEncoder, base_offset: int, records: list, write: Callable[[bytes], object]) -> int:
    """The plain batch as before: ``encode_batch`` (a fresh packer, a ``bytes`` copy of the
    payload, a second copy behind the header), then one write."""
    data = encode_batch(base_offset, records)
    write(data)
    return len(data)


@contextmanager
def before_at(commit: str) -> Iterator[None]:
    """The write path's hand-over and batch encoding as at ``commit``, for the arm's duration."""
    drain, write_plain = ChangeLogger.__dict__["_drain"], BatchEncoder.__dict__["write_plain"]
    ChangeLogger._drain = _old_drain(commit)  # type: ignore[method-assign]
    BatchEncoder.write_plain = _write_in_one_piece  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ChangeLogger._drain = drain  # type: ignore[method-assign]
        BatchEncoder.write_plain = write_plain  # type: ignore[method-assign]


def _young_collections() -> int:
    return gc.get_stats()[0]["collections"]


def store_puts(changelog: str, bootstrap: str | None, keys: list[bytes], value: bytes, bulk: bool = False) -> Figures:
    """Per-record ``put`` (``bulk``: one ``put_all`` of a dict), ``commit()`` per 10k,
    through ``TaskStorage``."""
    job = f"drain-{uuid.uuid4().hex[:8]}"
    root = Path(tempfile.mkdtemp(prefix="ab-drain-"))
    values: dict[str, Any] = {
        "job.name": job, "job.state.dir": str(root / "state"),
        "stores.kv.factory": "rocksdb", "stores.kv.key.serde": "bytes", "stores.kv.msg.serde": "bytes",
    }
    if changelog == "kafka":
        values.update({"stores.kv.changelog": f"kafka.{job}-kv", "systems.kafka.bootstrap.servers": bootstrap,
                       "systems.kafka.checkpoint.topic": f"{job}-checkpoints"})
    else:
        values.update({"stores.kv.changelog": "file.kv-log", "systems.file.path": str(root / "changelog")})
    try:
        with TaskStorage(Config.from_dict(values)) as storage:
            store, commit = storage.store("kv"), storage.commit
            put, put_all = store.put, store.put_all
            g0, t0, c0 = _young_collections(), time.perf_counter(), time.thread_time()
            for start in range(0, len(keys), STORE_COMMIT_EVERY):
                if bulk:  # a dict: no (key, value) tuple of the benchmark's own per record
                    put_all(dict.fromkeys(keys[start : start + STORE_COMMIT_EVERY], value))
                else:
                    for key in keys[start : start + STORE_COMMIT_EVERY]:
                        put(key, value)
                commit(input_position=start)
            wall, cpu, young = time.perf_counter() - t0, time.thread_time() - c0, _young_collections() - g0
        return len(keys) / wall, len(keys) / cpu, young * 10_000 / len(keys)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def encode_rows(repeats: int) -> None:
    """The file changelog's batch encoding alone: ``encode_batch`` + one write (before)
    against ``BatchEncoder.write_plain`` (now), into a file with the partition's 1 MiB
    write buffer; main-thread CPU ns per record, rounds interleaved, medians."""
    import random

    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="ab-encode-") as scratch:
        out = open(Path(scratch) / "batches", "wb", buffering=1 << 20)
        try:
            for batch in (500, 10_000):
                records = [(rng.randbytes(16), rng.randbytes(100)) for _ in range(batch)]
                encoder = BatchEncoder()
                arms: dict[str, Callable[[], object]] = {
                    "before: encode_batch + write": lambda r=records: out.write(encode_batch(0, r)),
                    "now: BatchEncoder.write_plain": lambda r=records, e=encoder: e.write_plain(0, r, out.write),
                }
                calls = max(1, 400_000 // batch)
                ns: dict[str, list[float]] = {name: [] for name in arms}
                for round_ in range(repeats + 1):
                    for name, arm in arms.items():
                        out.seek(0)
                        out.truncate()
                        c0 = time.thread_time()
                        for _ in range(calls):
                            arm()
                        if round_:
                            ns[name].append((time.thread_time() - c0) / (calls * batch) * 1e9)
                medians = {name: statistics.median(v) for name, v in ns.items()}
                print(f"batches of {batch:,} records (116 B), load {os.getloadavg()[0]:.1f}: " + "; ".join(
                    f"{name} {m:.0f} ns/record" for name, m in medians.items()))
        finally:
            out.close()


def search_rows(n: int, repeats: int, commit: str) -> None:
    """Full-text indexing with the file changelog (``index_all`` per 10k, one commit),
    this tree against the hand-over as at ``commit``, raw tantivy beside them."""
    from .search_engine import _documents, _raw_build, index_in_chunks, interleaved, timed

    docs = _documents(n)

    def before(root: Path) -> tuple[float, float, float]:
        with before_at(commit):
            return index_in_chunks(root, docs)

    load = os.getloadavg()[0]
    results = interleaved({"raw tantivy": lambda root: timed(n, lambda: _raw_build(root / "raw", docs)),
                           "now": lambda root: index_in_chunks(root, docs), f"before ({commit})": before}, repeats)
    raw = results["raw tantivy"]
    print(f"{n:,} documents, index_all per 10k, file changelog; load {load:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"medians of {repeats}, arms interleaved")
    for name, runs in results.items():
        print(f"  {name:<22} {statistics.median(f[0] for f in runs):>10,.0f} docs/s "
              f"({statistics.median(f[0] / r[0] for f, r in zip(runs, raw)):.2f}x raw)  process CPU "
              f"{1e6 * statistics.median(f[1] for f in runs) / n:.2f} µs/doc, task thread "
              f"{1e6 * statistics.median(f[2] for f in runs) / n:.2f} µs/doc")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", metavar="COMMIT", help="add the arm with the hand-over as at COMMIT")
    parser.add_argument("--changelog", choices=("kafka", "file"), default="kafka")
    parser.add_argument("--bulk", action="store_true", help="put_all of 10k per commit instead of put per record")
    parser.add_argument("--encode", action="store_true", help="only the file batch encoding, before vs now")
    parser.add_argument("--search", action="store_true", help="full-text indexing (index_all) instead of puts")
    args = parser.parse_args(argv)
    if args.search:
        search_rows(args.records, args.repeats, args.before or "HEAD")
        return
    if args.encode:
        encode_rows(max(args.repeats, 5))
        return
    keys, value = keys_of(args.records, 1), value_of(1)
    broker_context: AbstractContextManager[Any] = nullcontext()
    if args.changelog == "kafka":
        from localstate.testing.kafka import TansuBroker

        broker_context = TansuBroker()
    with broker_context as broker:
        bootstrap = broker.bootstrap if broker is not None else None
        arms: dict[str, Callable[[], Figures]] = {"now": lambda: store_puts(args.changelog, bootstrap, keys, value, args.bulk)}
        if args.before:
            def before() -> Figures:
                with before_at(args.before):
                    return store_puts(args.changelog, bootstrap, keys, value, args.bulk)

            arms[f"before ({args.before})"] = before
        arms["raw rocksdict"] = lambda: (*_store_raw(keys, value)[::2], float("nan"))  # type: ignore[return-value]
        runs: dict[str, list[Figures]] = {name: [] for name in arms}
        load_start = os.getloadavg()
        for round_ in range(args.repeats + 1):
            for name, arm in arms.items():
                figures = arm()
                if round_:  # round 0 warms every arm up
                    runs[name].append(figures)
        load_end = os.getloadavg()
    print(f"{args.records:,} puts ({'put_all' if args.bulk else 'put'}), {args.changelog} changelog, commit per {STORE_COMMIT_EVERY:,}; "
          f"load {load_start[0]:.1f} -> {load_end[0]:.1f}; medians of {args.repeats}, arms interleaved")
    raw = runs["raw rocksdict"]
    for name, figures in runs.items():
        wall = statistics.median(f[0] for f in figures)
        cpu = statistics.median(f[1] for f in figures)
        young = statistics.median(f[2] for f in figures)
        # per-round ratios against raw (same round), then their median
        vs_wall = statistics.median(f[0] / r[0] for f, r in zip(figures, raw))
        vs_cpu = statistics.median(f[1] / r[1] for f, r in zip(figures, raw))
        runs_text = ", ".join(f"{f[0]:,.0f}" for f in figures)
        print(f"  {name:<22} {wall:>10,.0f} puts/s ({vs_wall:.2f}x raw) [{runs_text}]  "
              f"{cpu:>10,.0f} puts/cpu-s ({vs_cpu:.2f}x raw)  young GCs/10k: {young:.1f}")


if __name__ == "__main__":
    main()
