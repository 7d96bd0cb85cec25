"""Exactly-once sinks for a :class:`~localstate.contrib.spark.StatefulJob`'s output.

A sink is the ``output`` of :meth:`StatefulJob.run_stream` (or of :meth:`StatefulJob.run`):
``sink(df, batch_id)`` delivers the emitted rows of micro-batch (or batch-run version)
``batch_id`` **at most once per batch id**, and a batch id is delivered whole or not at all.
Spark writes a micro-batch to its commit log only after ``foreachBatch`` returned, so a
driver that dies anywhere makes the restarted query run the last batch again; the sink
finds it already delivered and skips it. Together with the tasks' own exactly-once
commits every output row is delivered exactly once.

* :class:`FileSink` — the batch's rows written by Spark to a hidden temporary directory
  under the sink path, synced, then published by one ``rename`` to
  ``<path>/batch_id=<N>/``. Readers see whole batch directories only
  (:func:`published_batches`; Spark, pyarrow and pandas skip names starting with ``.``).
* :class:`KafkaSink` — the batch's rows and a marker record of ``N`` produced in **one**
  Kafka transaction; a restarted sink reads the last committed marker and skips what it
  already delivered. Consumers must read with ``isolation.level=read_committed``.

The sinks run on the driver (``foreachBatch`` calls them there): :class:`FileSink` lets
Spark's executors write the files; :class:`KafkaSink` streams the rows to the driver a
Spark partition at a time (``toLocalIterator``) into one transaction.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate import ConfigError, LocalStateError
from localstate.errors import FencedError
from localstate.faults import fault_point
from localstate.locking import fsync_dir

if TYPE_CHECKING:
    from localstate import Config
    from pyspark.sql import DataFrame

__all__ = ["FileSink", "KafkaSink", "published_batches", "check_delivered", "FILE_FORMATS", "MARKER_TOPIC_PREFIX"]

log = logging.getLogger("localstate.contrib.spark.sinks")

FILE_FORMATS = ("parquet", "json", "csv", "orc")
"""The Spark data source formats :class:`FileSink` writes."""
BATCH_DIR = "batch_id={}"
"""A published batch's directory under the sink path (Hive-style: Spark reads the sink
path with a ``batch_id`` column)."""
_BATCH_DIR_RE = re.compile(r"batch_id=(\d+)")
TEMP_PREFIX = ".tmp-"
"""A batch being written: hidden from readers (Spark skips names starting with ``.``, and
with ``_`` unless they contain ``=``), removed when a sink is made on the path."""
MARKER_TOPIC_PREFIX = "localstate-markers."
"""A :class:`KafkaSink`'s marker topic is by default this prefix + its transactional id (compacted,
one partition, created if missing). One marker topic per sink: a read_committed reader stops at
the first open transaction of a partition, so another sink's transaction open in a shared marker
topic would hide this sink's last marker, and a restarted sink would deliver its last batch again."""
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _local_dir(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise ConfigError(
            f"FileSink path {text!r}: only local (POSIX) paths are supported — a batch is published "
            "by an atomic rename, which object stores do not have; use a local or shared mount"
        )
    if not text:
        raise ConfigError("FileSink path must not be empty")
    return Path(text).absolute()


def published_batches(path: str | os.PathLike[str]) -> list[int]:
    """The batch ids published under a :class:`FileSink`'s ``path``, ascending.

    Only these directories are output: a reader of the path reads ``<path>/batch_id=<N>/``
    for these ``N`` (Spark: ``spark.read.parquet(path)``, which also skips the hidden
    temporary directories of batches being written)."""
    root = _local_dir(path)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for e in os.scandir(root)
                  if e.is_dir(follow_symlinks=False) and (m := _BATCH_DIR_RE.fullmatch(e.name)))


def check_delivered(config: Config, output: Any) -> None:
    """Before a batch run: raise if the tasks committed a version after the last one
    ``output`` delivered (the driver died between the commit and the delivery), naming
    the version to run again. Nothing to check for an output without ``delivered()``
    or one that delivered nothing yet."""
    delivered = getattr(output, "delivered", None)
    if not callable(delivered):
        return
    last = delivered()
    if last is None:
        return
    from .streaming import committed_batches

    committed = [v for v in committed_batches(config).values() if v is not None]
    if committed and max(committed) > last:
        version = last + 1
        raise LocalStateError(
            f"job {config.job_name!r}: the tasks committed version {max(committed)} but {output!r} delivered "
            f"only up to version {last}: the driver stopped between a commit and its delivery. Run version "
            f"{version} again with the same input (job.run(df, version={version}, output=sink)): the tasks "
            "roll back and apply it again, and the sink delivers it"
        )


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (itself included), so a rename that
    publishes it never exposes files whose data a power loss could still take back."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def publish_dir(temp: Path, final: Path) -> None:
    """Make the written directory ``temp`` durable, then publish it as ``final`` with one
    rename, itself made durable: a reader sees the whole batch or none of it."""
    _fsync_tree(temp)
    fault_point("sink.file.before_rename")
    os.rename(temp, final)
    fsync_dir(final.parent)


def _older_than_delivered(sink: str, batch_id: int, last: int) -> LocalStateError:
    return LocalStateError(
        f"{sink}: batch {batch_id} comes after batch {last} was delivered. Spark runs batch ids in "
        "order and re-runs only the last one, so this job's checkpoint is older than the sink's output "
        "(a new checkpoint location, or a second job on the same sink): give the sink a new path or "
        "transactional id, or restore the checkpoint"
    )


def _check_batch_id(batch_id: int) -> None:
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ConfigError(f"batch_id must be an int >= 0, got {batch_id!r}")


class FileSink:
    """Exactly-once files: each batch a directory ``<path>/batch_id=<N>/`` published whole.

    ``sink(df, batch_id)`` (the ``output`` of :meth:`StatefulJob.run_stream`) writes ``df``
    with ``df.write.format(format).options(**options)`` to ``<path>/.tmp-<N>-<random>/``,
    fsyncs its files and directories, renames it to ``<path>/batch_id=<N>/`` (one atomic
    ``rename(2)``) and fsyncs ``path``. A batch whose directory exists is skipped: it is
    whole, written by an earlier run of the same batch (Spark re-runs the last micro-batch
    after a driver crash). Making a sink removes the temporary directories a killed
    writer left. One job writes a path.

    ``path`` must be a POSIX file system the driver and the executors share (a local disk
    under ``local[*]``; a shared mount on a cluster); it is created if missing. Errors
    (a URL scheme, a file, an unwritable directory, an unknown ``format``) are raised here,
    before anything is written.
    """

    def __init__(self, path: str | os.PathLike[str], *, format: str = "parquet",  # noqa: A002 - Spark's word
                 options: Mapping[str, str] | None = None) -> None:
        if format not in FILE_FORMATS:
            from localstate.registry import did_you_mean

            raise ConfigError(f"FileSink format {format!r} is not one of {', '.join(FILE_FORMATS)}"
                              f"{did_you_mean(format, FILE_FORMATS)}")
        root = _local_dir(path)
        if root.exists() and not root.is_dir():
            raise ConfigError(f"FileSink path {str(root)!r} is a file, not a directory: choose a directory")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"FileSink path {str(root)!r} cannot be created: {e}") from e
        if not os.access(root, os.W_OK | os.X_OK):
            raise ConfigError(f"FileSink path {str(root)!r} is not writable by this process (uid {os.getuid()})")
        self.path = root
        self.format = format
        self.options = dict(options or {})
        for entry in os.scandir(root):
            if entry.name.startswith(TEMP_PREFIX):
                log.info("FileSink %s: removing %s, left by a writer that died before publishing it", root, entry.name)
                shutil.rmtree(entry.path, ignore_errors=True)

    def __repr__(self) -> str:
        return f"FileSink({str(self.path)!r}, format={self.format!r})"

    def batch_dir(self, batch_id: int) -> Path:
        """Where batch ``batch_id`` is published."""
        return self.path / BATCH_DIR.format(batch_id)

    def published(self) -> list[int]:
        """The batch ids published so far (:func:`published_batches`)."""
        return published_batches(self.path)

    def delivered(self) -> int | None:
        """The last published batch id (None: none)."""
        done = self.published()
        return done[-1] if done else None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.write(df, batch_id)

    def write(self, df: DataFrame, batch_id: int) -> bool:
        """Publish ``df`` as batch ``batch_id``; False if it was published already (nothing
        written). An error leaves no published directory for ``batch_id``."""
        _check_batch_id(batch_id)
        final = self.batch_dir(batch_id)
        if final.is_dir():
            log.info("%r: batch %d is published already; skipped", self, batch_id)
            return False
        done = self.published()
        if done and done[-1] > batch_id:
            raise _older_than_delivered(repr(self), batch_id, done[-1])
        temp = self.path / f"{TEMP_PREFIX}{batch_id}-{uuid.uuid4().hex}"
        try:
            df.write.format(self.format).options(**self.options).mode("errorifexists").save(temp.as_uri())
            publish_dir(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        fault_point("sink.file.after_rename")
        return True


class KafkaSink:
    """Exactly-once Kafka output through transactions, one per batch.

    ``sink(df, batch_id)`` produces every row of ``df`` to ``topic`` — the value is the
    row as JSON (or the string/binary column ``value``), the key the column ``key`` (or
    none) — and one marker record ``{"batch_id": N, "rows": R}`` keyed by
    ``transactional_id`` to ``marker_topic`` (default :data:`MARKER_TOPIC_PREFIX` + the
    transactional id; never shared with another sink), all in one transaction, committed before
    ``sink`` returns (so before Spark's commit log records the batch). The first call
    of a sink object initialises the transactional producer (which aborts whatever an
    earlier writer with the same id left open, and fences it) and reads the last
    committed marker; a batch id at or below it is skipped.

    ``transactional_id``: fixed per job and sink, the same after a restart (it is what
    finds the earlier writer's marker and fences it); two sinks must never share one.
    ``producer``: extra librdkafka settings. Rows reach the driver a Spark partition at
    a time (the next one prefetched), so driver memory bounds two partitions, not the
    batch; a batch must commit within ``transaction.timeout.ms`` (set to 5 minutes; at
    most the broker's ``transaction.max.timeout.ms``, 15 minutes by default).

    Consumers of ``topic`` must set ``isolation.level=read_committed``: a
    ``read_uncommitted`` reader sees aborted transactions' rows too.
    """

    FIXED = ("transactional.id", "enable.idempotence", "acks", "bootstrap.servers")

    def __init__(self, bootstrap_servers: str, topic: str, *, transactional_id: str, key: str | None = None,
                 value: str | None = None, marker_topic: str | None = None,
                 producer: Mapping[str, Any] | None = None, timeout_ms: int = 30_000) -> None:
        for name, given in (("bootstrap_servers", bootstrap_servers), ("topic", topic),
                            ("transactional_id", transactional_id)):
            if not isinstance(given, str) or not given.strip():
                raise ConfigError(f"KafkaSink {name} must be a non-empty string, got {given!r}")
        if marker_topic is None:
            marker_topic = MARKER_TOPIC_PREFIX + transactional_id
        if not _TOPIC_CHARS.fullmatch(marker_topic):
            raise ConfigError(
                f"KafkaSink marker topic {marker_topic!r} is not a valid topic name (letters, digits, '.', '_', "
                "'-'; at most 200): choose a transactional_id of those characters or pass marker_topic"
            )
        if marker_topic == topic:
            raise ConfigError(f"KafkaSink marker_topic must differ from the output topic {topic!r}")
        extra = dict(producer or {})
        fixed = sorted(set(extra) & set(self.FIXED))
        if fixed:
            raise ConfigError(f"KafkaSink producer settings {fixed}: the sink sets these itself; remove them")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.transactional_id = transactional_id
        self.key = key
        self.value = value
        self.marker_topic = marker_topic
        self.timeout_s = timeout_ms / 1000
        self._producer_conf = {
            "linger.ms": 5,
            # librdkafka's default (60 s) would abort a large batch still being produced
            "transaction.timeout.ms": 300_000,
            **extra,
            "bootstrap.servers": bootstrap_servers,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
        }
        from localstate.changelog.kafka.client import KafkaClient, KafkaSettings

        settings = KafkaSettings(bootstrap_servers=bootstrap_servers, timeout_ms=timeout_ms, retries=1)
        self._client = KafkaClient(settings, where=repr(self), group_id=f"localstate-sink-{transactional_id}")
        self._producer: Any = None
        self._fenced: FencedError | None = None
        self.last_delivered: int | None = None
        """The last batch id this sink's transactions delivered (known after the first call)."""

    def __repr__(self) -> str:
        return f"KafkaSink(topic={self.topic!r}, transactional_id={self.transactional_id!r})"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.write(df, batch_id)

    def write(self, df: DataFrame, batch_id: int) -> bool:
        """Deliver ``df`` as batch ``batch_id`` in one transaction; False if it was
        delivered already (nothing produced)."""
        _check_batch_id(batch_id)
        self.open()
        return self.deliver(self._records(df), batch_id)

    def delivered(self) -> int | None:
        """The last batch id delivered (None: none); connects on first use (:meth:`open`)."""
        return self.open()

    def _records(self, df: DataFrame) -> Iterable[tuple[Any, Any]]:
        from pyspark.sql import functions as F

        for name in (self.key, self.value):
            if name is not None and name not in df.columns:
                raise ConfigError(f"{self!r}: column {name!r} is not in the output (columns: {', '.join(df.columns)})")
        key = F.col(self.key).cast("string") if self.key is not None else F.lit(None).cast("string")
        value = F.col(self.value) if self.value is not None else F.to_json(F.struct(*[F.col(c) for c in df.columns]))
        rows = df.select(key.alias("k"), value.alias("v"))

        def pairs() -> Iterator[tuple[Any, Any]]:
            for k, v in rows.toLocalIterator(prefetchPartitions=True):
                yield k, bytes(v) if isinstance(v, bytearray) else v

        return pairs()

    def open(self) -> int | None:
        """Connect: check the topics, initialise the transactional producer (fencing an
        earlier writer with the same id) and read the last delivered batch id. Called by
        the first write; call it first to find bad settings before a job starts."""
        if self._fenced is not None:
            # opening again would fence the writer that took over: a zombie stays down
            raise self._fenced
        if self._producer is not None:
            return self.last_delivered
        from confluent_kafka import KafkaException, Producer

        client = self._client
        if not client.topic_exists(self.topic):
            raise ConfigError(
                f"{self!r}: kafka topic {self.topic!r} does not exist on brokers {self.bootstrap_servers}: "
                "create it first (the sink never creates its output topic)"
            )
        if client.topic_exists(self.marker_topic) and len(client.partitions(self.marker_topic)) != 1:
            raise ConfigError(
                f"{self!r}: marker topic {self.marker_topic!r} has {len(client.partitions(self.marker_topic))} "
                "partitions; it must have one (the sink reads its last marker from partition 0): "
                "pass a new marker_topic"
            )
        try:
            client.ensure_topic(self.marker_topic, 1, checkpoint=True)
        except LocalStateError as e:
            raise ConfigError(f"{self!r}: marker topic {self.marker_topic!r} is not usable: {e}") from e
        from localstate.changelog.kafka.client import client_log

        producer = Producer({**self._producer_conf, "logger": client_log})
        try:
            client.with_retries(f"initialise transactional id {self.transactional_id!r}",
                                lambda: producer.init_transactions(self.timeout_s))
        except KafkaException as e:
            raise LocalStateError(f"{self!r}: could not initialise the transactional producer: {e}") from e
        self.last_delivered = self._last_marker()
        self._producer = producer
        log.info("%r: last delivered batch %s", self, self.last_delivered)
        return self.last_delivered

    def _last_marker(self) -> int | None:
        """The batch id of this transactional id's last committed marker (read_committed),
        read from the end of the marker topic backwards in growing windows."""
        client = self._client
        consumer = client.consumer("read_committed")
        want = self.transactional_id.encode()
        try:
            low, _ = client.watermarks(consumer, self.marker_topic, 0)
            end = client.end_offset(consumer, self.marker_topic, 0)
            window = 64
            stop = end
            while stop > low:
                start = max(low, stop - window)
                found = None
                for msgs, _ in client.scan(consumer, self.marker_topic, 0, start, stop):
                    for m in msgs:
                        if m.key() == want and m.value() is not None:
                            found = int(json.loads(m.value())["batch_id"])
                if found is not None:
                    return found
                stop = start
                window *= 4
            return None
        finally:
            consumer.close()

    def deliver(self, records: Iterable[tuple[Any, Any]], batch_id: int) -> bool:
        """Produce ``records`` (``(key, value)`` pairs, str or bytes or None) and the
        marker of ``batch_id`` in one transaction; False if ``batch_id`` was delivered
        already. :class:`~localstate.errors.FencedError` if another writer with the same
        transactional id took over (this one must stop)."""
        from confluent_kafka import KafkaError, KafkaException
        from localstate.changelog.kafka.client import aborted_transaction_error, is_fenced

        self.open()
        last = self.last_delivered
        if last is not None and batch_id <= last:
            if batch_id < last:
                raise _older_than_delivered(repr(self), batch_id, last)
            log.info("%r: batch %d was delivered already; skipped", self, batch_id)
            return False
        producer = self._producer
        produce, poll, topic = producer.produce, producer.poll, self.topic
        try:
            producer.begin_transaction()
            n = 0
            for key, value in records:
                while True:
                    try:
                        produce(topic, value, key)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        poll(0.05)
                n += 1
                if not n % 10_000:
                    poll(0)
            marker = json.dumps({"batch_id": batch_id, "rows": n}).encode()
            produce(self.marker_topic, marker, self.transactional_id.encode())
            fault_point("sink.kafka.before_commit")
            producer.commit_transaction(self.timeout_s)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            aborted = False
            if isinstance(err, KafkaError) and err.code() == KafkaError._FATAL:
                # a call refused because the producer already failed says only "fatal":
                # the abort reports why (fenced by a second writer, ...)
                err = aborted_transaction_error(producer, self.timeout_s) or err
                aborted = True
            if isinstance(err, KafkaError) and err.fatal() and not is_fenced(err):
                self._producer = None  # a fatal error ends the producer; the next write opens a new one
                raise LocalStateError(f"{self!r}: batch {batch_id} was not delivered: {err}") from e
            if is_fenced(err):
                self._producer = None
                self._fenced = FencedError(
                    f"{self!r}: fenced: another writer with transactional id {self.transactional_id!r} took over; "
                    f"batch {batch_id} and later ones are left to it ({err}). Stop this job"
                )
                raise self._fenced from e
            if not aborted:
                self._abort()
            raise LocalStateError(f"{self!r}: batch {batch_id} was not delivered (transaction aborted): {err}") from e
        except BaseException:
            self._abort()
            raise
        self.last_delivered = batch_id
        fault_point("sink.kafka.after_commit")
        return True

    def _abort(self) -> None:
        producer = self._producer
        if producer is None:
            return
        try:
            producer.abort_transaction(self.timeout_s)
        except Exception:  # noqa: BLE001 - the next writer's init_transactions aborts it anyway
            log.warning("%r: abort_transaction failed; the next open aborts the transaction", self, exc_info=True)
            self._producer = None

    def close(self) -> None:
        """Flush and drop the producer (idempotent); the next write opens it again."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self.timeout_s)
        self._client.close()
