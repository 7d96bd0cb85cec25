"""Which PySpark each Spark part of localstate needs, and Arrow conversions for all of them.

=============================  ============  ==========================================
part                           pyspark       because
=============================  ============  ==========================================
runner (``StatefulJob``)       >= 3.4        ``mapInArrow`` (3.3) and ``foreachBatch``;
                                             3.4 is the first PySpark that runs on
                                             Python 3.11 (3.3 lacks it), so 3.4 is the
                                             oldest one tested
data sources (``sources``)     >= 4.2        the Python DataSource API arrived in 4.0,
                                             admission control (``maxOffsetsPerTrigger``)
                                             and ``availableNow`` for Python streaming
                                             sources in 4.2
=============================  ============  ==========================================

A part used on an older PySpark raises :class:`PySparkVersionError` naming the part,
the version it needs and the version installed, instead of an ``AttributeError`` deep
inside Spark. ``spark.createDataFrame(arrow_table)`` and ``DataFrame.toArrow()`` exist
only from PySpark 4.0: :func:`dataframe_from_arrow` and :func:`dataframe_to_arrow` do
the same on every supported version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from localstate.errors import LocalStateError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "RUNNER_PYSPARK",
    "SOURCES_PYSPARK",
    "PySparkVersionError",
    "dataframe_from_arrow",
    "dataframe_to_arrow",
    "pyspark_version",
    "require_pyspark",
]

RUNNER_PYSPARK = (3, 4)
"""Oldest PySpark the runner supports (and CI tests)."""
SOURCES_PYSPARK = (4, 2)
"""Oldest PySpark the ``localstate-kafka``/``-jsonl``/``-changelog`` sources support."""

_ARROW_DATAFRAMES = (4, 0)  # createDataFrame(pyarrow.Table) and DataFrame.toArrow()


class PySparkVersionError(LocalStateError, ImportError):
    """The installed PySpark is older than the part of localstate being used needs."""


def pyspark_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed PySpark (``ImportError`` when it is missing)."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def require_pyspark(minimum: tuple[int, int] = RUNNER_PYSPARK, part: str = "the localstate Spark runner") -> None:
    """Raise :class:`PySparkVersionError` unless PySpark ``>= minimum`` is installed; when
    it is not installed at all, the error names the extra to install."""
    try:
        installed = pyspark_version()
    except ImportError as e:
        raise PySparkVersionError(
            f"{part} needs PySpark, which is not installed ({e}). Install it with: pip install 'localstate[spark]'"
        ) from e
    if installed < minimum:
        import pyspark

        need = ".".join(map(str, minimum))
        raise PySparkVersionError(
            f"{part} needs pyspark>={need}, but pyspark {pyspark.__version__} is installed: "
            f"pip install 'pyspark>={need}'"
        )


def dataframe_from_arrow(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A DataFrame of ``table``'s rows with its column types, on any supported PySpark."""
    if pyspark_version() >= _ARROW_DATAFRAMES:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    # Before 4.0 the Arrow path goes through pandas; the explicit schema keeps the
    # Arrow types (an int column with nulls would otherwise arrive as double).
    return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))


def dataframe_to_arrow(df: DataFrame) -> pa.Table:
    """``df``'s rows as a ``pyarrow.Table``, on any supported PySpark (an action)."""
    if pyspark_version() >= _ARROW_DATAFRAMES:
        return df.toArrow()
    from pyspark.sql.pandas.types import to_arrow_schema

    # _collect_as_arrow is what toPandas() uses internally on 3.x: Arrow batches
    # straight from the executors, without a detour through pandas.
    batches = df._collect_as_arrow()  # noqa: SLF001
    return pa.Table.from_batches(batches, schema=to_arrow_schema(df.schema))
