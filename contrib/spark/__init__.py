"""Stateful PySpark jobs on localstate: partition = task.

>>> from localstate.contrib.spark import StatefulJob, StreamTask, spark_session  # doctest: +SKIP

The names below are imported from :mod:`.runner` on first use, not with the package:
Spark's streaming-source runner (a fresh interpreter per query that reads a
``localstate-kafka`` stream) imports this package on its way to
:mod:`.sources`, and needs none of the runner's modules.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import Emitter, StatefulJob, StreamTask, TaskContext, spark_session

__all__ = ["Emitter", "StatefulJob", "StreamTask", "TaskContext", "spark_session"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(import_module(".runner", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
