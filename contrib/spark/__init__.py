"""Stateful PySpark jobs on localstate: partition = task.

>>> from localstate.contrib.spark import StatefulJob, StreamTask, spark_session  # doctest: +SKIP
"""

from __future__ import annotations

from .runner import Emitter, StatefulJob, StreamTask, TaskContext, spark_session

__all__ = ["Emitter", "StatefulJob", "StreamTask", "TaskContext", "spark_session"]
