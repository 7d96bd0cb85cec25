"""A shared local Spark session for tests (pytest plugin).

``pytest_plugins = ["localstate.testing.spark"]`` provides:

* ``spark`` — session-scoped :class:`pyspark.sql.SparkSession` on ``local[2]``
  (starting one costs 6–10 s, so every test of a pytest run shares it), built by
  :func:`localstate.contrib.spark.spark_session` (127.0.0.1, UTC, Arrow, no UI);
* ``spark_master`` — the master URL it runs on (``LOCALSTATE_SPARK_MASTER`` overrides
  ``local[2]``).

Tests that need Spark should also carry ``@pytest.mark.spark``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["spark", "spark_master"]


@pytest.fixture(scope="session")
def spark_master() -> str:
    return os.environ.get("LOCALSTATE_SPARK_MASTER", "local[2]")


@pytest.fixture(scope="session")
def spark(spark_master: str) -> Iterator[Any]:
    from localstate.contrib.spark import spark_session

    session = spark_session(spark_master, app_name="localstate-tests", **{"spark.sql.shuffle.partitions": "4"})
    try:
        yield session
    finally:
        session.stop()
