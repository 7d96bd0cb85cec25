"""The Apache Flink peer of the streaming shape, run as a long-lived script.

``python flink_peer.py CSV_DIR WORK_DIR [--parallelism 2] [--checkpoint-ms 1000]`` starts
PyFlink's gateway JVM once and then answers one command per line of standard input, so
every run after the first is timed in a warm JVM and the runs can be interleaved with the
benchmark's other queries:

* ``{"run": NAME}`` — the windowed count over ``CSV_DIR`` into Flink's ``blackhole`` sink;
* ``{"run": NAME, "output": DIR}`` — the same into CSV files under ``DIR``
  (``window_start,user_id,views``; the benchmark compares them with localstate's windows);
* ``{"quit": true}`` — exit.

Each answer is one line ``FLINK-PEER-RESULT {"seconds": ..., ...}`` on standard output
(other lines, e.g. from the JVM, are to be ignored). ``seconds`` runs from submitting the
``INSERT`` to its job having finished (job submission, the local cluster's start, the
read, the windows, every checkpoint and the final one included).

The query is Flink SQL's tumbling window count: ``TUMBLE(event_time, 1 hour)`` grouped by
``window_start, user_id``, with a 60 s bounded-out-of-orderness watermark on
``event_time = TO_TIMESTAMP_LTZ(ts, 0)``, over the ``filesystem`` connector's ``csv``
format; RocksDB state backend (``state.backend.type: rocksdb``), a checkpoint every
``--checkpoint-ms`` to ``WORK_DIR``, ``parallelism.default`` = ``--parallelism``, the
session time zone UTC. At the end of the input Flink's final watermark closes every window
(Spark's and localstate's queries leave the last hour's windows open).

It imports only the standard library and pyflink, so it runs in a virtualenv of its own
(``apache-flink`` pins its own pyarrow, pandas and numpy).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

RESULT_PREFIX = "FLINK-PEER-RESULT "

SOURCE = """
CREATE TEMPORARY TABLE page_views (
  ts BIGINT,
  user_id STRING,
  event_time AS TO_TIMESTAMP_LTZ(ts, 0),
  WATERMARK FOR event_time AS event_time - INTERVAL '60' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')
"""

QUERY = """
SELECT UNIX_TIMESTAMP(CAST(window_start AS STRING)) AS window_start, user_id, COUNT(*) AS `views`
FROM TABLE(TUMBLE(TABLE page_views, DESCRIPTOR(event_time), INTERVAL '1' HOUR))
GROUP BY window_start, window_end, user_id
"""

SINK_COLUMNS = "window_start BIGINT, user_id STRING, `views` BIGINT"


def table_env(work: Path, parallelism: int, checkpoint_ms: int) -> Any:
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for key, value in {
        "parallelism.default": str(parallelism),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.interval": f"{checkpoint_ms} ms",
        "execution.checkpointing.dir": (work / "checkpoints").resolve().as_uri(),
        "table.local-time-zone": "UTC",
    }.items():
        conf.set_string(key, value)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    return TableEnvironment.create(settings)


def run_once(t_env: Any, name: str, output: str | None) -> dict[str, Any]:
    sink = f"sink_{name}"
    if output is None:
        t_env.execute_sql(f"CREATE TEMPORARY TABLE {sink} ({SINK_COLUMNS}) WITH ('connector' = 'blackhole')")
    else:
        t_env.execute_sql(f"CREATE TEMPORARY TABLE {sink} ({SINK_COLUMNS}) WITH ('connector' = 'filesystem', "
                          f"'path' = '{Path(output).resolve().as_uri()}', 'format' = 'csv')")
    t0 = time.perf_counter()
    result = t_env.execute_sql(f"INSERT INTO {sink} {QUERY}")
    result.wait()
    seconds = time.perf_counter() - t0
    t_env.execute_sql(f"DROP TEMPORARY TABLE {sink}")
    return {"name": name, "seconds": seconds}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="flink_peer.py")
    parser.add_argument("csv_dir", type=Path)
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    t_env = table_env(args.work_dir, args.parallelism, args.checkpoint_ms)
    t_env.execute_sql(SOURCE.format(path=args.csv_dir.resolve().as_uri()))
    from pyflink.version import __version__

    print(RESULT_PREFIX + json.dumps({"ready": time.perf_counter() - t0, "version": __version__}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        answer = run_once(t_env, str(command["run"]), command.get("output"))
        shutil.rmtree(args.work_dir / "checkpoints", ignore_errors=True)
        print(RESULT_PREFIX + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
