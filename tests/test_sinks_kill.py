"""Exactly-once output with the driver SIGKILLed inside the sink, then restarted from its
checkpoint.

The driver (:mod:`localstate.testing.sink_driver`, ``local[2]``) streams the
:class:`~localstate.testing.spark.KeyCount` job over JSON-lines files, one per
micro-batch, into a :class:`~localstate.contrib.spark.sinks.FileSink` or a
:class:`~localstate.contrib.spark.sinks.KafkaSink`. A fault point of the sink
(:mod:`localstate.faults`, armed through ``LOCALSTATE_FAULTS``) SIGKILLs the driver at an
exact moment; the test then kills what is left of its process group and starts it again
on the same checkpoint, state and sink:

* files — after batch B's directory is written and synced, before its rename
  (``sink.file.before_rename``: a hidden temporary directory is left, B is not published),
  then after the rename, before Spark's commit log records B (``sink.file.after_rename``:
  the restarted query runs B again and must find it published);
* Kafka — inside B's transaction, rows and marker produced, before the commit
  (``sink.kafka.before_commit``: the restart must abort it), then after the commit,
  before Spark's commit log (``sink.kafka.after_commit``: the restart must skip B).

Every micro-batch emits the running totals of its file's keys, so a ``(key, count)`` row
is unique over the whole output: what a reader sees (the published directories; a
``read_committed`` consumer) must be exactly the rows of a crash-free run, computed from
the input.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from localstate.testing.processes import run_process_group
from localstate.testing.spark_cluster_driver import write_input

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the driver's processes through /proc"),
]

FILES = 4
ROWS_PER_FILE = 400
KEYS = 40
RUN_TIMEOUT_S = 300.0


def expected_rows(files: list[Counter[str]]) -> list[Counter[tuple[str, int]]]:
    """Per micro-batch, the rows of a crash-free run: each key of the batch's file with its
    running total."""
    total: Counter[str] = Counter()
    out = []
    for counts in files:
        total.update(counts)
        out.append(Counter({(k, total[k]): 1 for k in counts}))
    return out


def run_driver(root: Path, sink: str, faults: str | None, n: int, *extra: str) -> int:
    """Run the driver to its end (or its fault's SIGKILL); then SIGKILL whatever of its
    process group is left. Returns its exit code."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("LOCALSTATE_FAULTS", None)
    if faults:
        env["LOCALSTATE_FAULTS"] = faults
    cmd = [sys.executable, "-m", "localstate.testing.sink_driver", "--root", str(root), "--input",
           str(root / "input"), "--sink", sink, *extra]
    run = run_process_group(cmd, env, root / f"driver-{n}.log", timeout_s=RUN_TIMEOUT_S, poll_s=0.2)
    if run.timed_out:
        pytest.fail(f"driver run {n} did not finish within {RUN_TIMEOUT_S:.0f}s; log: {root / f'driver-{n}.log'}")
    return run.returncode


def _log(root: Path, n: int) -> str:
    return (root / f"driver-{n}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def stream_input(tmp_path: Path) -> tuple[Path, list[Counter[tuple[str, int]]]]:
    files = write_input(tmp_path / "input", FILES, rows_per_file=ROWS_PER_FILE, keys=KEYS, seed=5)
    return tmp_path, expected_rows(files)


def _kills_then_finish(root: Path, sink: str, kills: list[str], *extra: str) -> None:
    for n, fault in enumerate([*kills, None]):
        code = run_driver(root, sink, fault, n, *extra)
        if fault is not None:
            assert code == -signal.SIGKILL, f"run {n} ({fault}) was not killed by its fault point:\n{_log(root, n)}"
    result = json.loads((root / "result.json").read_text())
    assert code == 0 and result["status"] == "ok", f"{result}\n{_log(root, len(kills))}"


def test_file_sink_killed_before_and_after_the_rename(
    stream_input: tuple[Path, list[Counter[tuple[str, int]]]],
) -> None:
    from localstate.contrib.spark.sinks import TEMP_PREFIX, published_batches

    root, expected = stream_input
    out = root / "out"
    # batch 1 written but not published; then batch 1 published but not in Spark's commit log
    code = run_driver(root, "file", "sink.file.before_rename=kill@2", 0)
    assert code == -signal.SIGKILL, _log(root, 0)
    assert published_batches(out) == [0]
    assert [p.name.split("-")[1] for p in out.iterdir() if p.name.startswith(TEMP_PREFIX)] == ["1"]
    _kills_then_finish(root, "file", ["sink.file.after_rename=kill@1"])
    assert published_batches(out) == list(range(FILES))
    assert not [p for p in out.iterdir() if p.name.startswith(TEMP_PREFIX)]
    for b in range(FILES):
        rows: Counter[tuple[str, int]] = Counter()
        for part in (out / f"batch_id={b}").glob("part-*.json"):
            rows.update((r["key"], r["count"]) for r in map(json.loads, part.read_text().splitlines()))
        assert rows == expected[b], f"batch {b}"


@pytest.mark.kafka
def test_kafka_sink_killed_inside_and_after_the_transaction(
    stream_input: tuple[Path, list[Counter[tuple[str, int]]]], apache_kafka_broker: str,
) -> None:
    from localstate.testing.sink_driver import TRANSACTIONAL_ID, create_topic, read_topic

    root, expected = stream_input
    topic = create_topic(apache_kafka_broker)
    extra = ("--bootstrap", apache_kafka_broker, "--topic", topic)
    _kills_then_finish(root, "kafka", ["sink.kafka.before_commit=kill@2", "sink.kafka.after_commit=kill@1"], *extra)
    committed = read_topic(apache_kafka_broker, topic)
    want: Counter[tuple[str, int]] = sum(expected, Counter())
    got = Counter((v["key"], v["count"]) for _, v in committed)
    assert got == want
    assert all(k == v["key"] for k, v in committed)
    # what the first kill's transaction had sent of batch 1 (records still in the producer's
    # buffer died with it) is in the log, aborted: only a read_uncommitted reader sees it
    uncommitted = Counter((v["key"], v["count"]) for _, v in read_topic(apache_kafka_broker, topic,
                                                                         isolation="read_uncommitted"))
    aborted = uncommitted - got
    assert aborted <= expected[1] and uncommitted == got + aborted
    markers = read_topic(apache_kafka_broker, f"{topic}-markers")
    assert [(k, v["batch_id"]) for k, v in markers] == [(TRANSACTIONAL_ID, b) for b in range(FILES)]
