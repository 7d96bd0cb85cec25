"""Stateful PySpark jobs on localstate: partition = task.

>>> from localstate.contrib.spark import StatefulJob, StreamTask, spark_session  # doctest: +SKIP

The names below are imported from :mod:`.runner` on first use, not with the package:
Spark's streaming-source runner (a fresh interpreter per query that reads a
``localstate-kafka`` stream) imports this package on its way to
:mod:`.sources`, and needs none of the runner's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localstate.lazy import lazy_exports

if TYPE_CHECKING:
    from .runner import Emitter, StatefulJob, StreamTask, TaskContext, spark_session

__all__ = ["Emitter", "StatefulJob", "StreamTask", "TaskContext", "spark_session"]


__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, ".runner"))
