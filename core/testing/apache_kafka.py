"""A real Apache Kafka broker for tests: one KRaft node (broker and controller) on 127.0.0.1.

The broker is ``org.apache.kafka:kafka_2.13`` with its runtime dependencies, fetched by
Maven from Maven Central into a cache directory once (:func:`fetch_kafka`; later calls
find the jars and run no Maven at all), formatted with ``kafka.tools.StorageTool`` and
started as ``java -cp <jars> kafka.Kafka server.properties`` — the classes the
``kafka-storage.sh`` and ``kafka-server-start.sh`` scripts of a Kafka release run.

Unlike tansu (:mod:`localstate.testing.kafka`) the broker keeps its log on disk: a
broker stopped and started again still has every topic and record, as a production
broker does. It needs Java 17+ and Maven (``mvn``) on ``PATH`` for the first fetch.

Command line: ``python -m localstate.testing.apache_kafka fetch`` fetches the jars (CI
does it before the tests, so a download failure is reported as such).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

try:
    from .broker_process import BrokerProcess
except ImportError:  # run as a plain script by .ci/run, before anything is installed
    from broker_process import BrokerProcess  # type: ignore[no-redef]

__all__ = ["KAFKA_VERSION", "ApacheKafkaBroker", "fetch_kafka", "kafka_cache_dir", "cache_root", "maven_fetch"]

KAFKA_VERSION = "4.4.0"
"""The Kafka release the tests run (its broker runs on Java 17)."""

_LOG4J_VERSION = "2.24.3"  # the log4j-core version Kafka depends on: its slf4j binding
_READY_TIMEOUT_S = 60.0
_JVM_OPTS = ("-Xms256m", "-Xmx768m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
_COMPLETE = ".complete"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>localstate.testing</groupId>
  <artifactId>apache-kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

# Settings for a single test node: one partition for the internal topics (a new
# transactional id's first request would otherwise create 50), no wait before the first
# group rebalance, small thread pools and cleaner buffer on a 2-core machine.
_SERVER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={logs}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
log.cleaner.dedupe.buffer.size=16777216
"""

log = logging.getLogger("localstate.testing.apache_kafka")


def kafka_cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` are kept: ``$LOCALSTATE_KAFKA_CACHE/<version>``, else
    ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/localstate/apache-kafka/<version>``."""
    root = os.environ.get("LOCALSTATE_KAFKA_CACHE")
    if root:
        return Path(root) / version
    return cache_root() / "apache-kafka" / version


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/localstate`` (or ``~/.cache/localstate``): where the test fixtures
    keep what Maven fetched for them."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localstate"


def fetch_kafka(version: str = KAFKA_VERSION, *, timeout_s: float = 600.0) -> Path:
    """The directory holding ``kafka_2.13`` ``version`` and every runtime jar it needs,
    fetched with Maven on first use (:func:`maven_fetch`)."""
    return maven_fetch(kafka_cache_dir(version), _POM.format(kafka=version, log4j=_LOG4J_VERSION),
                       f"kafka_2.13-{version}.jar", f"org.apache.kafka:kafka_2.13:{version}",
                       "the Apache Kafka broker for the tests", timeout_s=timeout_s)


def maven_fetch(lib: Path, pom: str, expected_jar: str, what: str, purpose: str, *,
                extra_args: tuple[str, ...] = (), timeout_s: float = 600.0) -> Path:
    """``lib``, holding the runtime jars of the dependencies ``pom`` declares, copied there
    by Maven (``dependency:copy-dependencies`` plus ``extra_args``) on first use.
    Idempotent: a complete directory returns at once; a fetch goes to a temporary
    directory renamed into place, so a killed fetch leaves nothing that looks complete.
    ``expected_jar`` (a glob) must be among the jars; ``what`` names the artifact and
    ``purpose`` what it is for in errors."""
    if (lib / _COMPLETE).is_file():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(f"Maven (mvn) is needed to fetch {purpose} ({what}): apt-get install maven")
    lib.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".fetch-{lib.name}-", dir=lib.parent))
    try:
        (work / "pom.xml").write_text(pom)
        out = work / "lib"
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={out}", "-DincludeScope=runtime", *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s,
        )
        if proc.returncode != 0 or not any(out.glob(expected_jar)):
            raise RuntimeError(
                f"Maven could not fetch {what} (exit code {proc.returncode}): "
                f"{proc.stdout.decode(errors='replace')[-3000:]}"
            )
        (out / _COMPLETE).write_text(f"{what}\n")
        try:
            out.rename(lib)
        except OSError:  # fetched meanwhile by another process
            if not (lib / _COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lib


def _free_port() -> int:
    from localstate.testing.kafka import free_port

    return free_port()


class ApacheKafkaBroker(BrokerProcess):
    """One Apache Kafka KRaft node on 127.0.0.1 with its log in a temporary directory.

    The same interface as :class:`~localstate.testing.kafka.TansuBroker`; :meth:`stop`
    keeps the log, so :meth:`start` brings the broker back with every topic. :meth:`close`
    stops it and deletes the log.
    """

    name = "Apache Kafka"
    ready_timeout_s = _READY_TIMEOUT_S
    stop_grace_s = 30.0  # a controlled shutdown

    def __init__(self, port: int | None = None, *, version: str = KAFKA_VERSION) -> None:
        self.version = version
        self.port = port or _free_port()
        self.controller_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.home = Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self._formatted = False

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    def _java(self, lib: Path, *args: str) -> list[str]:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else "java"
        return [java, *_JVM_OPTS, "-cp", f"{lib}/*", *args]

    def _format(self, lib: Path) -> None:
        props = self.home / "server.properties"
        props.write_text(_SERVER.format(port=self.port, controller=self.controller_port, logs=self.home / "logs"))
        cluster_id = "-"
        while cluster_id.startswith("-"):  # the tool would take it for an option (Kafka's ids never start so)
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        proc = subprocess.run(
            self._java(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"formatting the Kafka log in {self.home} failed: {proc.stdout.decode(errors='replace')}")
        self._formatted = True

    def start(self) -> ApacheKafkaBroker:
        """Start the node (same ports and log as before) and wait until it answers."""
        if self.process is not None and self.process.poll() is None:
            return self
        lib = fetch_kafka(self.version)
        if not self._formatted:
            self._format(lib)
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(
                self._java(lib, "kafka.Kafka", str(self.home / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        self._wait_ready()
        return self

    def _answers(self, admin: Any, deadline: float) -> bool:
        if not admin.list_topics(timeout=1.0).brokers:
            return False
        self._load_transaction_coordinator(deadline)
        return True

    def _load_transaction_coordinator(self, deadline: float) -> None:
        """Initialise one transactional producer: a new node creates and loads its
        transaction log on the first such request, and answers it (and every other one
        meanwhile) with COORDINATOR_LOAD_IN_PROGRESS until then; a test with a short
        timeout must not meet that."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "localstate-testing-ready",
                             "logger": logging.getLogger("localstate.testing.kafka")})
        producer.init_transactions(max(1.0, deadline - time.monotonic()))

    def log_tail(self, nbytes: int = 3000) -> str:
        try:
            return self.log_file.read_bytes()[-nbytes:].decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the broker and delete its log."""
        self.stop(kill=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> ApacheKafkaBroker:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def _main(argv: list[str]) -> int:
    if argv != ["fetch"]:
        print("usage: python -m localstate.testing.apache_kafka fetch", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    lib = fetch_kafka()
    print(f"Apache Kafka {KAFKA_VERSION}: {len(list(lib.glob('*.jar')))} jars in {lib} "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
