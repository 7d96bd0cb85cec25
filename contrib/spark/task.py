"""The API a task is written against: :class:`StreamTask` (what a job implements),
:class:`TaskContext` (its stores, timers, clocks and partition), :class:`Emitter` (the rows
it emits). :mod:`localstate.contrib.spark.runner` runs tasks on Spark; the same classes
serve a task run without Spark (the tutorial's first half)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, TypeVar, overload

import pyarrow as pa
from localstate import Config, ConfigError, KeyValueStore, LocalStateError, TaskStorage
from localstate.keyed import NO_KEY, KeyedState
from localstate.layers.ttl import wall_clock_ms
from localstate.timers import EVENT_TIME, PROCESSING_TIME, Timers, check_timer_store

__all__ = ["Emitter", "StreamTask", "TaskContext"]

K = TypeVar("K")
V = TypeVar("V")

_EARLIEST = -(1 << 62)


@dataclass
class TaskContext:
    """What :meth:`StreamTask.init` gets: the task's partition and its open stores."""

    partition: int
    partitions: int
    config: Config
    storage: TaskStorage
    timer_store: str = "timers"
    """The store that keeps this task's timers (:attr:`StreamTask.timer_store`)."""
    open_seconds: float = 0.0
    """Wall seconds the runner spent opening the storage before :meth:`StreamTask.init`
    (the task lock, the checkpoint, a rollback of a re-run batch, a restore)."""
    key_column: str | None = None
    """The input column holding each row's key (a :class:`StatefulJob`'s ``key=``): keyed
    state handles are scoped to it around :meth:`StreamTask.process`."""
    kept_open: bool = False
    """Whether the storage was kept open from the task's previous run in this worker (no
    open, no restore: :mod:`localstate.kept_open`); :attr:`memo` holds what that run left."""
    _timers: dict[bytes, Timers] = field(default_factory=dict, init=False, repr=False)
    _keyed: KeyedState | None = field(default=None, init=False, repr=False)
    _plain: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @overload
    def store(self, name: str) -> Any: ...
    @overload
    def store(self, name: str, key_type: type[K], value_type: type[V]) -> KeyValueStore[K, V]: ...

    def store(self, name: str, key_type: type | None = None, value_type: type | None = None) -> Any:
        """The store ``name`` of this task (``storage.store(name)``); with types,
        ``context.store("counts", str, int)`` is a checked ``KeyValueStore[str, int]``."""
        if self._keyed is not None and name in self._keyed.handles:
            raise ConfigError(f"store {name!r} is the store of the keyed state handle {name!r}: use the handle, "
                              "or give the plain store another name")
        self._plain[name] = "plain store (context.store)"
        return self.storage.store(name, key_type, value_type)  # type: ignore[arg-type]

    @property
    def memo(self) -> dict[str, Any]:
        """In-memory values the task keeps between its runs while the worker keeps its
        storage open (:attr:`TaskStorage.memo <localstate.storage.TaskStorage.memo>`):
        empty after every open; the task keeps it equal to what its stores hold, e.g. a
        copy of the values it reads back every run."""
        return self.storage.memo

    @property
    def keyed(self) -> KeyedState:
        """Keyed state handles (:mod:`localstate.keyed`): ``context.keyed.value("last_seen", int)``
        in ``init``; each handle reads and writes the entry of ``context.keyed.key``, the
        current key, which the runner sets around :meth:`StreamTask.process` and
        :meth:`StreamTask.on_timer`."""
        if self._keyed is None:
            self._plain.setdefault(self.timer_store, "timer store")
            self._keyed = KeyedState(self.storage, self._plain)
        return self._keyed

    def process(self, task: StreamTask, batch: pa.RecordBatch, emit: Emitter) -> None:
        """Hand ``batch`` to ``task``: its own ``process_batch``, or — when it has only the
        per-record :meth:`StreamTask.process`, declared keyed state and the runner knows the
        key column — ``process`` per row with ``keyed.key`` set to the row's key. Either way
        there is no current key afterwards (``window`` sets one itself if it needs one)."""
        keyed, column = self._keyed, self.key_column
        if keyed is None:
            task.process_batch(batch, emit)
            return
        try:
            if column is None or type(task).process_batch is not StreamTask.process_batch:
                task.process_batch(batch, emit)
                return
            if column not in batch.schema.names:
                raise ConfigError(f"key column {column!r} is not an input column (columns: "
                                  f"{', '.join(batch.schema.names)})")
            process = task.process
            for record in batch.to_pylist():
                keyed.key = record[column]
                process(record, emit)
        finally:
            keyed.key = NO_KEY

    @property
    def watermark(self) -> int | None:
        """The task's event-time clock (ms), committed with its state; None before any event."""
        return self.storage.event_time

    @property
    def timers(self) -> Timers:
        """Event-time timers: ``register(key, ts)`` fires ``on_timer(key, ts, emit)`` once the
        watermark reaches ``ts`` (see :mod:`localstate.timers`)."""
        return self._domain(EVENT_TIME)

    @property
    def processing_timers(self) -> Timers:
        """Processing-time timers: fire once the wall clock (ms since the epoch) reaches ``ts``."""
        return self._domain(PROCESSING_TIME)

    def _domain(self, domain: bytes) -> Timers:
        timers = self._timers.get(domain)
        if timers is None:
            name = self.timer_store
            spec = self.config.stores.get(name)
            if spec is None:
                raise ConfigError(
                    f"job {self.config.job_name!r}: timers are kept in the store {name!r}, which the config "
                    f"does not declare; add stores.{name}.factory = memory (or rocksdb) with the default "
                    "bytes serdes"
                )
            check_timer_store(name, spec)
            now = wall_clock_ms if domain == PROCESSING_TIME else self._event_now
            timers = self._timers[domain] = Timers(self.storage.store(name), domain, now)
        return timers

    def _event_now(self) -> int:
        t = self.storage.event_time
        return _EARLIEST if t is None else t

    def fire_timers(self, task: StreamTask, emit: Emitter) -> int:
        """Fire the due timers of both domains into ``task`` (the runner calls this after
        each input batch and before ``window``). Returns how many fired."""
        if self.timer_store not in self.config.stores:
            return 0
        fired = 0
        batched = type(task).on_timers is not StreamTask.on_timers
        keyed = self._keyed
        on_timer = task.on_timer

        def scoped(key: Any, ts: int) -> None:
            keyed.key = key  # type: ignore[union-attr]
            on_timer(key, ts, emit)

        try:
            for domain in (EVENT_TIME, PROCESSING_TIME):
                timers = self._domain(domain)
                if batched:
                    fired += timers.fire_batch(lambda keys, stamps: task.on_timers(keys, stamps, emit))
                elif keyed is not None:
                    fired += timers.fire(scoped)
                else:
                    fired += timers.fire(lambda key, ts: on_timer(key, ts, emit))
        finally:
            if keyed is not None:
                keyed.key = NO_KEY
        return fired

    def observe_event_time(self, task: StreamTask, batch: pa.RecordBatch) -> None:
        """Advance the watermark to ``max(task.event_time_column) - task.watermark_delay_ms``."""
        column = task.event_time_column
        if column is None or batch.num_rows == 0:
            return
        import pyarrow.compute as pc

        try:
            values = batch.column(column)
        except KeyError:
            raise ConfigError(
                f"{type(task).__name__}.event_time_column = {column!r} is not an input column "
                f"(columns: {', '.join(batch.schema.names)})"
            ) from None
        if pa.types.is_timestamp(values.type):
            values = pc.cast(values, pa.timestamp("ms", tz=values.type.tz)).cast(pa.int64())
        elif not pa.types.is_integer(values.type):
            raise ConfigError(
                f"{type(task).__name__}.event_time_column {column!r} has type {values.type}; "
                "use a timestamp or an integer column of epoch milliseconds"
            )
        latest = pc.max(values).as_py()
        if latest is not None:
            self.storage.advance_event_time(int(latest) - task.watermark_delay_ms)


class Emitter:
    """Collects a task's output rows and hands them out as Arrow batches of ``schema``.

    ``emit(row)`` takes one dict keyed by exactly the output column names, ``emit.rows(rows)``
    many, and ``emit.arrow(batch)`` a record batch holding (at least) the output columns —
    the vectorised path. Order is kept across the three forms.

    A row's keys must be the output columns, no more and no fewer: an unknown key (a
    misspelt name) is an error naming it with a "did you mean", and so is a missing one —
    a null is emitted by giving the column with ``None``, which a nullable column takes and
    a non-nullable one refuses. Rows are checked when they are turned into a batch (at the
    next ``emit.arrow`` or the end of the task's step), all rows of a batch at once, for
    about one ``len()`` per row.
    """

    __slots__ = ("schema", "_rows", "_batches", "_columns", "_required")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._rows: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._columns = dict.fromkeys(schema.names).keys()
        """The key set every emitted row must have (a dict view, comparable with a row's keys)."""
        self._required = [i for i, f in enumerate(schema) if not f.nullable]

    def __call__(self, row: dict[str, Any]) -> None:
        self._rows.append(row)

    def rows(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows.extend(rows)

    def arrow(self, batch: pa.RecordBatch | pa.Table) -> None:
        self._flush_rows()
        if batch.num_rows == 0:
            return
        missing = [n for n in self.schema.names if n not in batch.schema.names]
        if missing:
            raise LocalStateError(
                f"emitted Arrow batch with columns {', '.join(batch.schema.names)} does not fit the job's output "
                f"schema {self._fields()}: it lacks the column(s) "
                f"{self._described(missing, batch.schema.names, 'the batch has {}')}"
            )
        try:
            table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
            table = table.select(self.schema.names).cast(self.schema)
        except (KeyError, ValueError, pa.ArrowNotImplementedError) as e:  # ArrowInvalid, a null in a required column
            raise LocalStateError(
                f"emitted Arrow batch with columns {batch.schema} does not fit the job's output "
                f"schema {self.schema}: {e}; emit the output columns with compatible types"
            ) from e
        self._batches.extend(table.to_batches())

    def _flush_rows(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            try:
                batch = pa.RecordBatch.from_pylist(rows, schema=self.schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                self._check_keys(rows, range(len(rows)))  # a row with the wrong keys is named first
                raise LocalStateError(
                    f"emitted rows do not fit the job's output schema {self.schema}: {e}; "
                    f"first row: {rows[0]!r}"
                ) from e
            self._check_row_keys(rows, batch)
            self._check_nulls(batch)
            self._batches.append(batch)

    def _check_row_keys(self, rows: list[dict[str, Any]], batch: pa.RecordBatch) -> None:
        """Every row's keys are exactly the output columns, checked in C over the whole batch.

        ``from_pylist`` ignores unknown keys and makes a missing one null. A row with fewer
        keys than columns lacks one; when the key counts add up to ``columns x rows`` a row
        with more keys implies one with fewer, so every bad batch has a row that lacks a
        column — and such a row has a null there. So only null cells need a look: the
        column's key must be in the row (a ``None`` given on purpose). Cost: one ``len``
        per row, a null count per column and a dict lookup per null cell."""
        if sum(map(len, rows)) != len(self._columns) * len(rows):
            self._check_keys(rows, range(len(rows)))
        for name, column in zip(self.schema.names, batch.columns):
            nulls = column.null_count
            if not nulls:
                continue
            if nulls == len(rows):
                suspects: list[dict[str, Any]] | map[dict[str, Any]] = rows
            else:
                import pyarrow.compute as pc

                suspects = map(rows.__getitem__, pc.indices_nonzero(column.is_null()).to_pylist())
            try:
                if all(map(dict.__contains__, suspects, repeat(name))):
                    continue
            except TypeError:  # a row that is not a dict: named below
                pass
            self._check_keys(rows, range(len(rows)))

    def _check_keys(self, rows: list[dict[str, Any]], suspects: Iterable[int]) -> None:
        """The first of the ``suspects`` rows whose keys are not the output columns, named
        in an error (one key-set comparison per row: the error path)."""
        for i in suspects:
            row = rows[i]
            if not isinstance(row, dict):
                raise LocalStateError(
                    f"emitted row {i} of this batch is a {type(row).__name__}, not a dict keyed by the output "
                    f"columns {self._fields()}: {row!r}"
                )
            if row.keys() != self._columns:
                raise LocalStateError(f"emitted row {row!r} does not fit the job's output schema {self._fields()}: "
                                      f"{self._key_problems(row)}")

    def _key_problems(self, row: dict[str, Any]) -> str:
        names = self.schema.names
        problems = []
        unknown = [k for k in row if k not in self._columns]
        if unknown:
            problems.append(f"unknown field(s) {self._described(unknown, names, 'did you mean {}?')}")
        missing = [self.schema.field(n) for n in names if n not in row]
        if missing:
            nullable = [f.name for f in missing if f.nullable]
            required = [f.name for f in missing if not f.nullable]
            if nullable:
                problems.append(f"missing field(s) {', '.join(map(repr, nullable))} (nullable: to emit a null, "
                                f"give {', '.join(f'{n!r}: None' for n in nullable)})")
            if required:
                problems.append(f"missing field(s) {', '.join(map(repr, required))} (not nullable)")
        return "; ".join(problems)

    @staticmethod
    def _described(names: list[str], choices: list[str], closest: str) -> str:
        """``'usr' (did you mean 'user'?)`` per name: ``closest`` formatted with the closest
        of ``choices`` when one is close (:func:`~localstate.registry.did_you_mean`'s rule)."""
        from localstate.registry import did_you_mean

        out = []
        for name in names:
            hint = did_you_mean(str(name), choices).strip()
            if hint.startswith("Did you mean "):
                out.append(f"{name!r} ({closest.format(hint.removeprefix('Did you mean ').rstrip('?'))})")
            else:
                out.append(repr(name))
        return ", ".join(out)

    def _fields(self) -> str:
        return "(" + ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in self.schema) + ")"

    def _check_nulls(self, batch: pa.RecordBatch) -> None:
        """No null in a non-nullable output column (``from_pylist`` builds one without
        checking; ``emit.arrow``'s cast refuses it itself)."""
        for i in self._required:
            if batch.column(i).null_count:
                name = self.schema.field(i).name
                raise LocalStateError(
                    f"emitted rows: output column {name!r} is not nullable but got a null (None); give it a "
                    "value, or declare the column nullable in the output schema"
                )

    def drain(self) -> list[pa.RecordBatch]:
        """The batches emitted since the last drain (and forget them)."""
        self._flush_rows()
        out, self._batches = self._batches, []
        return out


class StreamTask:
    """A stateful task: one instance per partition run (a Spark task attempt).

    Lifecycle per run: ``init(context)`` → ``process_batch`` per Arrow batch of the
    partition's input → ``window(emit)`` → (the runner commits) → ``close()``.
    Override :meth:`process_batch` for the vectorised path, or only :meth:`process`
    for the per-record convenience (about 20× slower: every row becomes a dict).
    """

    def init(self, context: TaskContext) -> None:
        """Get stores by name (``context.store(name)``) and load task-level state."""

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        """Handle one Arrow batch of input rows; default: :meth:`process` per row."""
        process = self.process
        for record in batch.to_pylist():
            process(record, emit)

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        """Handle one input row (a dict keyed by column name)."""
        raise NotImplementedError(f"{type(self).__name__} must implement process() or process_batch()")

    timer_store: str = "timers"
    """The store (``bytes`` serdes) that keeps the task's timers, when it uses any."""
    event_time_column: str | None = None
    """An input column of event times (timestamp, or int epoch ms): before each input batch
    is processed the watermark (the task's event time) moves to the batch's maximum minus
    :attr:`watermark_delay_ms`; after it, due event-time timers fire."""
    watermark_delay_ms: int = 0
    """How far behind the latest event time the watermark stays (out-of-orderness bound)."""

    def on_timer(self, key: Any, ts: int, emit: Emitter) -> None:
        """A timer registered with ``context.timers``/``context.processing_timers`` fired."""
        raise NotImplementedError(f"{type(self).__name__} registered timers but does not implement on_timer()")

    def on_timers(self, keys: list[Any], timestamps: list[int], emit: Emitter) -> None:
        """Vectorised :meth:`on_timer`: override to take due timers in chunks (in
        ``(ts, key)`` order per chunk); default: :meth:`on_timer` per timer."""
        on_timer = self.on_timer
        for key, ts in zip(keys, timestamps):
            on_timer(key, ts, emit)

    def window(self, emit: Emitter) -> None:
        """Called at every window/commit boundary: after the partition's last batch of a
        run (batch job) or micro-batch (streaming), before the commit."""

    def close(self) -> None:
        """Release task resources (stores are closed by the runner). Always called."""
