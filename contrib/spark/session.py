"""A SparkSession with localstate's defaults, and waiting for a cluster's executors."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from localstate import LocalStateError

from .compat import RUNNER_PYSPARK, require_pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark_session", "one_host_exclusion", "wait_for_executors"]

_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,")


def spark_session(master: str = "local[*]", app_name: str = "localstate", **conf: Any) -> SparkSession:
    """A SparkSession for localstate jobs, with sane local defaults.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` (unless set), makes executors use this Python
    (``PYSPARK_PYTHON``), binds the driver to 127.0.0.1, disables the UI, uses UTC and
    Arrow. ``conf`` entries (Spark keys, e.g. ``**{"spark.sql.shuffle.partitions": "8"}``)
    override the defaults. For ``local-cluster[n,c,m]`` it waits (up to 120 s) until
    all ``n`` executors have registered.
    """
    require_pyspark(RUNNER_PYSPARK, "the localstate Spark runner")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    defaults: dict[str, Any] = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "50000",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # A task that failed on an executor (e.g. its state dir is unusable) is retried on
        # another one, and an executor where tasks keep failing is left out for a while
        # (placement proposes only executors Spark has not excluded): without it a retry
        # goes back to the executor its state preferred, and fails there again.
        "spark.excludeOnFailure.enabled": "true",
    }
    match = _LOCAL_CLUSTER.match(master)
    if match:
        defaults.update(one_host_exclusion(int(match.group(1)), int(conf.get("spark.task.maxFailures", 4))))
    defaults.update({k: str(v) for k, v in conf.items()})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in defaults.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if match:
        wait_for_executors(spark, int(match.group(1)))
    return spark


def one_host_exclusion(executors: int, max_failures: int = 4) -> dict[str, str]:
    """Spark settings for a cluster whose ``executors`` all run on one host (``local-cluster``,
    a test's standalone workers): exclude a failing executor, never the host, or two failures
    of one task would leave it nowhere to run. Spark wants a task's attempts per host below
    ``spark.task.maxFailures`` (``max_failures``)."""
    return {"spark.excludeOnFailure.task.maxTaskAttemptsPerNode": str(max(1, max_failures - 1)),
            "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": str(executors + 1),
            "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": str(executors + 1)}


def wait_for_executors(spark: SparkSession, count: int, timeout_s: float = 120.0) -> None:
    """Block until ``count`` executors have registered with ``spark``'s driver."""
    sc = spark.sparkContext._jsc.sc()  # noqa: SLF001 - the status API is JVM-only
    deadline = time.monotonic() + timeout_s
    while True:
        registered = sc.getExecutorMemoryStatus().size() - 1  # the driver is listed too
        if registered >= count:
            return
        if time.monotonic() >= deadline:
            raise LocalStateError(
                f"only {registered} of {count} Spark executors registered within {timeout_s:.0f}s; "
                "check the executor logs under $SPARK_HOME/work or the memory given to local-cluster"
            )
        time.sleep(0.25)
