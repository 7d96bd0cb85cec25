"""Spark's Kafka connector (``spark-sql-kafka-0-10``) for tests and benchmarks: its jars,
fetched by Maven from Maven Central into a cache directory once
(:func:`fetch_kafka_connector`), given to a session as ``spark.jars``
(:func:`kafka_connector_conf`).

Only the jars Spark does not ship itself: the connector, its token provider,
``kafka-clients`` and ``commons-pool2``. Local jars cost a session start next to nothing,
where ``spark.jars.packages`` resolves the coordinate with Ivy at every start (a few
seconds even when cached), which is why the shared test session
(:mod:`localstate.testing.spark`) takes the fetched jars.

Command line: ``python -m localstate.testing.kafka_connector fetch [SPARK_VERSION ...]``
(default: the installed PySpark's).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from localstate.contrib.spark.kafka_input import kafka_connector_package

from .apache_kafka import cache_root, maven_fetch

__all__ = ["fetch_kafka_connector", "kafka_connector_conf", "connector_cache_dir"]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>localstate.testing</groupId>
  <artifactId>spark-kafka-connector</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def connector_cache_dir(coordinate: str) -> Path:
    """Where the jars of ``coordinate`` are kept: ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/localstate/spark-kafka/<artifact>-<version>``."""
    _group, artifact, version = coordinate.split(":")
    return cache_root() / "spark-kafka" / f"{artifact}-{version}"


def fetch_kafka_connector(spark_version: str | None = None, *, timeout_s: float = 600.0) -> list[Path]:
    """The connector's jars for ``spark_version`` (default: the installed PySpark), fetched
    with Maven on first use."""
    coordinate = kafka_connector_package(spark_version)
    group, artifact, version = coordinate.split(":")
    scala = artifact.rsplit("_", 1)[1]
    keep = f"{artifact},spark-token-provider-kafka-0-10_{scala},kafka-clients,commons-pool2"
    lib = maven_fetch(connector_cache_dir(coordinate), _POM.format(group=group, artifact=artifact, version=version),
                      f"{artifact}-{version}.jar", coordinate, "Spark's Kafka connector",
                      extra_args=(f"-DincludeArtifactIds={keep}",), timeout_s=timeout_s)
    return sorted(lib.glob("*.jar"))


def kafka_connector_conf(spark_version: str | None = None, *, fetch: bool = True) -> dict[str, str]:
    """``{"spark.jars": <the connector's jars>}`` for a session; ``{}`` when ``fetch`` is
    False and they are not in the cache yet."""
    lib = connector_cache_dir(kafka_connector_package(spark_version))
    if not fetch and not lib.is_dir():
        return {}
    return {"spark.jars": ",".join(map(str, fetch_kafka_connector(spark_version)))}


def _main(argv: list[str]) -> int:
    if not argv or argv[0] != "fetch":
        print("usage: python -m localstate.testing.kafka_connector fetch [SPARK_VERSION ...]", file=sys.stderr)
        return 2
    versions: list[str | None] = [*argv[1:]] or [None]
    for version in versions:
        t0 = time.perf_counter()
        jars = fetch_kafka_connector(version)
        print(f"{kafka_connector_package(version)}: {len(jars)} jars in {jars[0].parent} "
              f"({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
