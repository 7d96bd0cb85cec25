"""The benchmark registry: workloads × engines, plus the named suites of area modules.

A **workload** is a function registered with :func:`workload` that prepares one timed
trial against a target (a localstate store, a raw engine or a baseline library) and
returns a :class:`Trial`. The runner calls it once for the warm-up and once per
repeat, timing only :meth:`Trial.run`, so setup (loading data before a get workload)
is never measured.

A **suite** is a module exposing ``run(quick: bool = False, repeats: int = 5) ->
list[dict]`` (rows in the schema of :mod:`localstate.benchmarks.runner`); suites are
imported only when selected, so a missing module or extra becomes an error cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from localstate.errors import ConfigError
from localstate.registry import did_you_mean

if TYPE_CHECKING:
    from .targets import Target

__all__ = [
    "Trial",
    "Workload",
    "workload",
    "WORKLOADS",
    "SUITES",
    "GENERIC_SUITE",
    "FOOTPRINT",
    "get_workloads",
    "load_workload_modules",
    "WORKLOAD_MODULES",
    "get_suites",
]


@dataclass
class Trial:
    """One prepared, timed unit of work.

    ``run()`` does the measured work; ``ops`` is how many operations (or records) it
    does, so the rate is ``ops / seconds``; ``nbytes`` (optional) turns the same time
    into MB/s. ``cleanup()`` runs after timing, even when ``run()`` fails.
    """

    run: Callable[[], Any]
    ops: int
    nbytes: int = 0
    cleanup: Callable[[], None] = lambda: None
    seconds: Callable[[], float] | None = None
    """Overrides the wall-clock time of ``run()`` (e.g. restore time reported by TaskStorage)."""


@dataclass(frozen=True)
class Workload:
    """A named workload: ``prepare(target, params)`` → :class:`Trial`."""

    name: str
    prepare: Callable[[Target, Any], Trial]
    unit: str
    description: str
    kinds: frozenset[str] = field(default_factory=lambda: frozenset({"store", "engine", "baseline"}))
    """Which target kinds it applies to: ``store`` (TaskStorage view), ``engine`` (raw
    engine), ``baseline`` (dict / rocksdict / plyvel)."""
    mb_per_s: bool = False
    """Also report MB/s (from ``Trial.nbytes``) in a second row."""
    read_only: bool = False
    """The timed run does not change the data: one prepared trial serves every repeat."""


_WORKLOADS: dict[str, Workload] = {}
WORKLOADS = MappingProxyType(_WORKLOADS)
"""Read-only view of the registered workloads, in registration order."""

GENERIC_SUITE = "generic"
FOOTPRINT = "footprint"
"""Pseudo-workload: on-disk bytes, RSS and peak RSS per engine after a load (own process)."""
SUITES: dict[str, tuple[str, str]] = {
    GENERIC_SUITE: ("", "generic key-value workloads over every selected engine and baseline"),
    "core": ("localstate.benchmarks.core_figures", "memory engine + file changelog: the core write and restore path"),
    "kv": ("localstate.benchmarks.kv_engines", "rocksdb / leveldb engine figures"),
    "special": ("localstate.benchmarks.special_engines", "topn / hyperloglog / bloom engines"),
    "search": ("localstate.benchmarks.search_engine", "full-text (tantivy) engine"),
    "kafka": ("localstate.benchmarks.kafka_changelog", "Kafka changelog (tansu broker)"),
    "restore": ("localstate.benchmarks.kafka_restore", "cold restore of a rocksdb store from Kafka vs the raw client"),
    "objectstore": ("localstate.benchmarks.objectstore_changelog", "objectstore changelog (moto S3) vs file"),
    "spark": ("localstate.benchmarks.spark_jobs", "Spark job vs Spark's RocksDB state store"),
    "cluster": ("localstate.benchmarks.spark_cluster", "a growing stream on local-cluster[3,1,1024] vs local[3]: "
                "micro-batch time, task moves, records replayed"),
    "moves": ("localstate.benchmarks.moves", "a task's first open on a machine without its state: shipped snapshot "
              "vs full replay, seconds per GB"),
    "reliability": ("localstate.benchmarks.reliability", "reopen after SIGKILL vs after a clean close"),
    "stateapi": ("localstate.benchmarks.state_api", "state-query read rate; metrics cost on put/get"),
    "keyed": ("localstate.benchmarks.keyed_state", "keyed state handles (value, map, reducing) vs the raw store "
              "calls they wrap, per record"),
    "ttl": ("localstate.benchmarks.ttl_timers", "TTL put/get vs no TTL; timers registered and fired per second"),
    "ticks": ("localstate.benchmarks.ticks", "timers without input on Spark: ms per tick micro-batch (no input, every "
              "task fires its timers and commits) and changelog bytes per tick, local[2]"),
    "windows": ("localstate.benchmarks.windows", "windowed page views on localstate.windows vs the hand-written "
                "job (streaming shape, no Spark); the window operator per kind"),
    "sinks": ("localstate.benchmarks.sinks", "exactly-once output (FileSink, KafkaSink on Apache Kafka) vs a plain "
              "write of the same rows"),
    "rescale": ("localstate.benchmarks.rescale", "localstate rescale 4 -> 6 vs a full restore of the same state"),
    "remote": ("localstate.benchmarks.remote_stores", "a stream-table join: profile lookups in local state vs Redis "
               "and PostgreSQL on 127.0.0.1 (started by the suite), per request and batched"),
    "serving": ("localstate.benchmarks.serving", "point lookups over HTTP and the Python API beside a running job "
                "(p50/p99, requests/s) and the job's throughput with and without the server"),
    "statesize": ("localstate.benchmarks.state_size", "write and read rates as the state grows (0.1M -> 3M keys, "
                  "10M with LOCALSTATE_FULL=1), rocksdb + file changelog vs raw rocksdict"),
}
"""``suite name → (module exposing run(quick, repeats), description)``."""


def workload(
    name: str,
    *,
    unit: str = "ops/s",
    kinds: tuple[str, ...] = ("store", "engine", "baseline"),
    mb_per_s: bool = False,
    read_only: bool = False,
) -> Callable[[Callable[[Target, Any], Trial]], Callable[[Target, Any], Trial]]:
    """Register the decorated ``prepare(target, params) -> Trial`` as workload ``name``.

    The docstring's first line becomes the description shown by ``--list``.
    Registering a taken name raises :class:`ConfigError`.
    """

    def register(prepare: Callable[[Target, Any], Trial]) -> Callable[[Target, Any], Trial]:
        if name in _WORKLOADS:
            raise ConfigError(f"benchmark workload {name!r} is already registered")
        doc = (prepare.__doc__ or "").strip().splitlines()
        _WORKLOADS[name] = Workload(name, prepare, unit, doc[0] if doc else "", frozenset(kinds), mb_per_s, read_only)
        return prepare

    return register


WORKLOAD_MODULES: tuple[str, ...] = ("localstate.benchmarks.workloads",)
"""Modules whose import registers workloads; imported only when workloads are asked for
(as suites are), so ``localstate bench --suite kv`` never pays for them."""


def load_workload_modules() -> None:
    """Import every module of :data:`WORKLOAD_MODULES` (each registers its workloads once)."""
    import importlib

    for module in WORKLOAD_MODULES:
        importlib.import_module(module)


def get_workloads(names: list[str] | tuple[str, ...] | None) -> list[Workload]:
    """The workloads called ``names`` (all when empty), or a :class:`ConfigError` listing valid ones.

    ``footprint`` is accepted and skipped here (the suite runs it separately).
    """
    load_workload_modules()

    if not names:
        return list(_WORKLOADS.values())
    out = []
    for n in names:
        if n == FOOTPRINT:
            continue
        if n not in _WORKLOADS:
            valid = [*_WORKLOADS, FOOTPRINT]
            hint = did_you_mean(n, valid)
            close = hint if hint.startswith(" Did you mean") else ""
            raise ConfigError(f"unknown benchmark workload {n!r}.{close} Valid workloads: {', '.join(valid)}.")
        out.append(_WORKLOADS[n])
    return out


def get_suites(spec: str | None) -> list[str]:
    """Parse ``"kv,special"`` / ``"all"``; unknown names raise :class:`ConfigError` listing valid ones."""
    if not spec or spec.strip() == "all":
        return list(SUITES)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        if n not in SUITES:
            raise ConfigError(
                f"unknown benchmark suite {n!r}.{did_you_mean(n, SUITES)} Valid suites: all, {', '.join(SUITES)}."
            )
    return list(dict.fromkeys(names))
