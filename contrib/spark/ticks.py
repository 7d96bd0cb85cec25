"""Timers that fire without input: a micro-batch every interval, data or not.

Structured Streaming runs a micro-batch only when a source has new data, and a task's
due timers fire when one of its runs does (after each input batch and before
``window``). So with no new input a processing-time timer — a session's inactivity gap
— never fires. :meth:`StatefulJob.run_stream` with ``timer_interval_ms=T`` adds a tick
source to the query: Spark's built-in ``rate-micro-batch`` source, which has new
offsets at every trigger, so a ``processingTime`` trigger of ``T`` ms runs a micro-batch
every ``T`` ms even when the job's own input is idle.

The tick rows are filtered out before the job repartitions its input, so no task ever
sees one: a tick micro-batch runs every task over no rows — as any micro-batch runs
every task, whichever partitions its rows reach — and each task fires its due timers
(both domains), calls ``window`` and commits the micro-batch id as its version. A tick
micro-batch is an ordinary commit version: a re-run after a crash rolls back and runs
it again (:mod:`localstate.contrib.spark.streaming`), and its output goes to ``output``
under its batch id like any other.

What ticks do not do: move the watermark. Event time advances only with events (the
task's ``event_time_column``), so an event-time timer fires at a tick only when the
watermark already passed it (one registered in ``on_timer`` or ``window`` at or before
it); a session that should close on event time with no new events needs a
processing-time timer, as in Flink, where an idle source holds the watermark too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from localstate import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TICK_SOURCE", "check_timer_interval", "check_checkpoint_ticks", "log_batches", "tick_trigger", "with_ticks"]

TICK_SOURCE = "rate-micro-batch"
"""The built-in source (Spark >= 3.3) whose offsets advance at every trigger."""

_NO_TICKS = {
    "availableNow": "it processes the input available at the start and stops",
    "once": "it runs one micro-batch and stops",
    "continuous": "continuous processing runs no micro-batches",
}


def check_timer_interval(job: str, interval_ms: Any) -> int | None:
    """``interval_ms`` if it is None or an int >= 1 (milliseconds); else a
    :class:`ConfigError` naming the job and the value."""
    if interval_ms is None:
        return None
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 1:
        raise ConfigError(
            f"job {job!r}: timer_interval_ms must be an int >= 1 (milliseconds between micro-batches "
            f"that fire due timers without input), got {interval_ms!r} ({type(interval_ms).__name__})"
        )
    return interval_ms


def tick_trigger(job: str, interval_ms: int, trigger: dict[str, Any] | None) -> dict[str, Any]:
    """The trigger of a query that ticks every ``interval_ms``: ``processingTime`` of that
    interval. ``trigger`` must be None — the interval *is* the trigger — and a trigger
    that cannot tick (availableNow, once, continuous) is named in the error."""
    if trigger:
        kinds = [k for k in trigger if k in _NO_TICKS]
        why = f": {_NO_TICKS[kinds[0]]}, so no timer would fire without input" if kinds else ""
        raise ConfigError(
            f"job {job!r}: timer_interval_ms = {interval_ms} runs the query with the trigger "
            f"processingTime = {interval_ms} ms (one micro-batch per interval, with or without input), "
            f"so it cannot be combined with trigger = {trigger!r}{why}. Give one of the two: "
            "timer_interval_ms for timers that fire on their own, or the trigger without it"
        )
    return {"processingTime": f"{interval_ms} milliseconds"}


def log_batches(log: Path) -> set[int]:
    """The micro-batch ids in one of a local Spark checkpoint's logs (``offsets``: the
    batches started, ``commits``: those finished); empty when the log does not exist."""
    return {int(p.name) for p in log.glob("[0-9]*") if p.name.isdigit()} if log.is_dir() else set()


def _last_offsets(checkpoint_location: str) -> list[str] | None:
    """The source offsets (one JSON line per source) of the newest batch in a local
    checkpoint's offset log; None when there is none or the location is not local."""
    url = urlparse(checkpoint_location)
    if url.scheme not in ("", "file"):
        return None
    offsets = Path(url.path if url.scheme else checkpoint_location) / "offsets"
    batches = log_batches(offsets)
    if not batches:
        return None
    lines = (offsets / str(max(batches))).read_text().splitlines()
    return lines[2:]  # the log's version, the batch metadata, then one line per source


def check_checkpoint_ticks(job: str, checkpoint_location: str) -> None:
    """Refuse to add ticks to a query whose (local) checkpoint was written without them:
    the tick source would be a source the checkpoint does not have, which Spark refuses
    only once the query runs ("There are [1] sources in the checkpoint offsets and now
    there are [2]"). A tick source's offset, the last of a ticking query's, is
    ``{"offset": n, "timestamp": ms}``."""
    sources = _last_offsets(checkpoint_location)
    if not sources:
        return
    try:
        last = json.loads(sources[-1])
    except ValueError:
        last = None
    if isinstance(last, dict) and set(last) == {"offset", "timestamp"}:
        return
    raise ConfigError(
        f"job {job!r}: the checkpoint {checkpoint_location} was written by a query without ticks (its "
        f"{len(sources)} source(s) end with the offset {sources[-1]}), and timer_interval_ms adds a tick "
        "source, which Spark refuses for an existing checkpoint. Run it without timer_interval_ms, or "
        "start the ticking query on a new checkpoint location with a new job state (job.state.dir and "
        "changelog): the tasks' state is ahead of a new checkpoint's batch ids"
    )


def with_ticks(stream_df: DataFrame) -> DataFrame:
    """``stream_df`` united with a tick source that has a new micro-batch at every trigger
    and contributes no rows (its row is filtered out before the union). The tick source
    comes after ``stream_df``'s own sources in the query's checkpoint, so turning ticks on
    or off for an existing checkpoint changes its source count, which Spark refuses."""
    from pyspark.sql import functions as F

    ticks = (stream_df.sparkSession.readStream.format(TICK_SOURCE)
             .option("rowsPerBatch", 1).option("numPartitions", 1).load())
    # ``value`` counts from 0, so the predicate holds for no row; a literal false would
    # let the optimizer drop the source's scan from the plan.
    nothing = ticks.where(F.col("value") < 0)
    empty = nothing.select(*(F.lit(None).cast(f.dataType).alias(f.name) for f in stream_df.schema.fields))
    return stream_df.unionByName(empty)
