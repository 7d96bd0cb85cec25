"""PySpark Python data sources (batch and streaming) for localstate jobs' inputs,
one module per source over a shared stream reader (:mod:`._base`).

Register them once per session with :func:`register_sources`, then::

    spark.read.format("localstate-kafka").option("bootstrap.servers", "127.0.0.1:9092") \\
        .option("topic", "views").load()
    spark.readStream.format("localstate-jsonl").schema("ts long, user_id string") \\
        .load("/data/views")
    spark.readStream.format("localstate-changelog").option("path", "./changelog") \\
        .option("stream", "pageviews-counts").load()

* ``localstate-kafka`` (:mod:`.kafka`), ``localstate-jsonl`` (:mod:`.jsonl`),
  ``localstate-changelog`` (:mod:`.changelog`), and ``localstate-state``
  (:mod:`localstate.contrib.spark.state_source`: a store's decoded committed state).

Every offset is a plain JSON dict that Spark stores in its checkpoint (offset log);
a micro-batch re-run after a failure reads exactly the same records, as the
exactly-once runner (:mod:`localstate.contrib.spark.streaming`) requires. All readers
produce Arrow record batches (no per-row Python objects on the way into Spark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localstate.contrib.spark.compat import SOURCES_PYSPARK, require_pyspark
from localstate.lazy import lazy_exports

# Here, not in the source modules (imported on first use): importing the package on an
# older PySpark is the clear error, not a bare ImportError at the first use of a source.
require_pyspark(SOURCES_PYSPARK, "the localstate Spark data sources (localstate-kafka, -jsonl, -changelog)")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .changelog import CHANGELOG_SCHEMA, ChangelogSource
    from .jsonl import JsonLinesSource
    from .kafka import KAFKA_SCHEMA, KafkaSource

__all__ = [
    "KafkaSource",
    "JsonLinesSource",
    "ChangelogSource",
    "register_sources",
    "KAFKA_SCHEMA",
    "CHANGELOG_SCHEMA",
]


def register_sources(spark: SparkSession) -> None:
    """Register ``localstate-kafka``, ``localstate-jsonl``, ``localstate-changelog`` and
    ``localstate-state`` (:mod:`localstate.contrib.spark.state_source`)."""
    from localstate.contrib.spark.state_source import StateSource

    from .changelog import ChangelogSource
    from .jsonl import JsonLinesSource
    from .kafka import KafkaSource

    for source in (KafkaSource, JsonLinesSource, ChangelogSource, StateSource):
        spark.dataSource.register(source)


_LAZY = {"KafkaSource": ".kafka", "KAFKA_SCHEMA": ".kafka", "JsonLinesSource": ".jsonl",
         "ChangelogSource": ".changelog", "CHANGELOG_SCHEMA": ".changelog"}
"""Where each source lives. They are imported on first use, not with the package: Spark
runs a stream reader in a fresh interpreter per query, which imports this package on
its way to the one source module it unpickles (and needs none of the others)."""


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
