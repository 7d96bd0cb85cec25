"""``format("localstate-state")``: the decoded committed state of a store, as a table.

The counterpart of Spark's own ``statestore`` data source (``spark.read.format(
"statestore")``, Spark 3.5+), for localstate jobs::

    spark.read.format("localstate-state").option("config", "job.toml") \\
        .option("store", "counts").load()

One row per key of the store as of each task's last commit, read with the job's
serdes, all partitions (or ``.option("partitions", "0,2")``), beside the running job
(:class:`~localstate.reader.StateReader`: no lock, no writes). One Spark input
partition per task partition.

Columns, like ``statestore``'s ``key``/``value``/``partition_id`` but flattened where
the serdes allow, so the state is queryable without ``from_json``:

* ``partition int`` — the task partition;
* the key: ``key`` (``string``/``long``/``binary`` for the ``string``, ``int``/``long``,
  ``bytes`` serdes); a ``tuple`` key becomes ``key_0, key_1, ...``;
* the value: a ``json``/``msgpack`` value that is a dict becomes one column per
  top-level field; any other value is ``value`` (``string`` for ``string`` and JSON
  text for structured values, ``long``/``double``/``boolean``/``binary`` for scalars).

Field types are inferred from up to ``sampleSize`` (default 100) committed records
read from the start of the changelog; pass ``.schema(...)`` to fix them (columns are
matched by name: ``partition``, ``key``, ``key_<i>``, ``value``, or a value field).
Nested dicts/lists in a flattened field are JSON text. ``.option("flatten",
"false")`` keeps ``key``/``value`` whole (structured ones as JSON text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from localstate import Config, ConfigError, LocalStateError
from localstate.reader import StateReader, sample_committed
from localstate.serdes import get_serde
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

__all__ = ["StateSource"]

_BATCH_ROWS = 50_000


def _spark_type(values: list[Any]) -> DataType:
    """The Spark type that holds every sampled value (JSON text when they differ)."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return StringType()
    if kinds == {bool}:
        return BooleanType()
    if kinds == {int}:
        return LongType()
    if kinds <= {int, float}:
        return DoubleType()
    if kinds == {bytes}:
        return BinaryType()
    return StringType()


def _infer(samples: list[tuple[Any, Any]], key_serde: str, msg_serde: str, flatten: bool) -> StructType:
    fields = [StructField("partition", IntegerType(), False)]
    keys = [k for k, _ in samples]
    if flatten and key_serde == "tuple" and keys:
        width = max(len(k) for k in keys)
        fields += [StructField(f"key_{i}", _spark_type([k[i] for k in keys if len(k) > i])) for i in range(width)]
    else:
        fields.append(StructField("key", _spark_type(keys) if keys else _serde_type(key_serde)))
    values = [v for _, v in samples]
    if flatten and values and all(isinstance(v, dict) for v in values):
        names: dict[str, None] = {}
        for v in values:
            names.update(dict.fromkeys(map(str, v)))
        fields += [StructField(n, _spark_type([v.get(n) for v in values])) for n in names]
    else:
        fields.append(StructField("value", _spark_type(values) if values else _serde_type(msg_serde)))
    return StructType(fields)


def _serde_type(serde: str) -> DataType:
    python_type = get_serde(serde).python_type
    return {str: StringType(), int: LongType(), bytes: BinaryType()}.get(python_type, StringType())  # type: ignore[arg-type]


_ACCEPTS: dict[type, Callable[[Any], bool]] = {
    LongType: lambda v: type(v) is int,
    IntegerType: lambda v: type(v) is int,
    DoubleType: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    BooleanType: lambda v: isinstance(v, bool),
    BinaryType: lambda v: isinstance(v, bytes),
}
"""Per Spark type: which decoded Python values a column of it takes as they are."""


def _cell_converter(data_type: DataType, store: str, column: str) -> Callable[[Any], Any]:
    """Decoded value → cell of ``data_type`` (built once per column, used per row)."""
    if isinstance(data_type, StringType):
        return lambda v: v if v is None or isinstance(v, str) else json.dumps(v, default=repr, sort_keys=True)
    accepts = _ACCEPTS.get(type(data_type), lambda v: True)
    as_double = isinstance(data_type, DoubleType)

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not accepts(value):
            raise LocalStateError(
                f"localstate-state: store {store!r}, column {column!r} is {data_type.simpleString()} but a "
                f"committed record holds {value!r} ({type(value).__name__}); pass .schema(...) with a type "
                "that holds it (string takes anything, as JSON text)"
            )
        return float(value) if as_double else value

    return convert


@dataclass(frozen=True)
class _TaskPartition(InputPartition):
    part: int


class _StoreTableReader(DataSourceReader):
    def __init__(self, config: dict[str, Any], store: str, partitions: list[int], schema: StructType,
                 in_memory: bool = True) -> None:
        self.in_memory = in_memory
        self.config = config
        self.store = store
        self.parts = partitions
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [_TaskPartition(p) for p in self.parts]

    def _row_builder(self) -> Callable[[int, Any, Any], list[Any]]:
        """``(partition, key, value)`` → the row's cells, columns matched by name once."""
        columns: list[tuple[Callable[[int, Any, Any], Any], Callable[[Any], Any]]] = []
        for f in self.schema.fields:
            name = f.name
            if name == "partition":
                pick: Callable[[int, Any, Any], Any] = lambda p, k, v: p  # noqa: E731
            elif name == "key":
                pick = lambda p, k, v: k  # noqa: E731
            elif name == "value":
                pick = lambda p, k, v: v  # noqa: E731
            elif name.startswith("key_") and name[4:].isdigit():
                i = int(name[4:])
                pick = lambda p, k, v, i=i: k[i] if isinstance(k, tuple) and i < len(k) else None  # noqa: E731
            else:
                pick = lambda p, k, v, name=name: v.get(name) if isinstance(v, dict) else None  # noqa: E731
            columns.append((pick, _cell_converter(f.dataType, self.store, name)))

        def build(p: int, k: Any, v: Any) -> list[Any]:
            return [convert(pick(p, k, v)) for pick, convert in columns]

        return build

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, _TaskPartition)
        arrow = to_arrow_schema(self.schema)
        config = Config.from_dict(self.config)
        with StateReader(config, partition.part, in_memory=self.in_memory) as reader:
            view = reader.store(self.store)
            build = self._row_builder()
            rows: list[list[Any]] = []
            with view.all() as it:
                for k, v in it:
                    rows.append(build(partition.part, k, v))
                    if len(rows) >= _BATCH_ROWS:
                        yield _batch(rows, arrow)
                        rows = []
            if rows:
                yield _batch(rows, arrow)


def _batch(rows: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)


class StateSource(DataSource):
    """``format("localstate-state")``; options ``config`` (job config file), ``store``,
    optional ``partitions`` (``"0,2"``), ``flatten`` (default ``true``), ``sampleSize``,
    ``inMemory`` (default ``true``; ``false`` rebuilds each partition with the store's
    engine on the executor's disk, see :class:`~localstate.reader.StateReader`)."""

    @classmethod
    def name(cls) -> str:
        return "localstate-state"

    def _setup(self) -> tuple[Config, str, list[int]]:
        options = CaseInsensitiveDict(self.options)
        source = self.name()
        path = options.get("config")
        store = options.get("store")
        if not path or not store:
            raise ConfigError(f"data source {source!r} needs options 'config' (the job's .toml/.properties) and 'store'")
        config = Config.load(path)
        spec = config.stores.get(store)
        if spec is None:
            from localstate.registry import did_you_mean

            raise ConfigError(f"{source}: no store named {store!r} in job {config.job_name!r}.{did_you_mean(store, config.stores)}")
        raw = options.get("partitions")
        if raw:
            try:
                parts = sorted({int(x) for x in str(raw).split(",") if x.strip()})
            except ValueError:
                raise ConfigError(f"{source}: option 'partitions' = {raw!r}: expected comma-separated ints") from None
            bad = [p for p in parts if not 0 <= p < config.partitions]
            if bad:
                raise ConfigError(f"{source}: partitions {bad} out of range: job.partitions = {config.partitions}")
        else:
            parts = list(range(config.partitions))
        return config, store, parts

    def schema(self) -> StructType:
        config, store, _ = self._setup()
        options = CaseInsensitiveDict(self.options)
        flatten = str(options.get("flatten", "true")).lower() not in ("false", "0", "no")
        try:
            size = int(options.get("sampleSize", 100))
        except ValueError:
            raise ConfigError(f"{self.name()}: option 'sampleSize' must be an integer") from None
        spec = config.stores[store]
        with StateReader(config, 0) as reader:
            reader._spec(store)  # no changelog / unknown store: the reader's error
        samples = sample_committed(config, store, max(1, size))
        return _infer(samples, spec.key_serde, spec.msg_serde, flatten)

    def reader(self, schema: StructType) -> DataSourceReader:
        config, store, parts = self._setup()
        in_memory = str(CaseInsensitiveDict(self.options).get("inMemory", "true")).lower() not in ("false", "0", "no")
        return _StoreTableReader(config.to_dict(), store, parts, schema, in_memory)

