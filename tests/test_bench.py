"""``localstate bench`` end to end: quick run, JSON schema, charts, user engines, error
cells, bad input. Runs the real CLI group (lazy ``bench`` wiring included) on real files."""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from localstate.benchmarks import registry as bench_registry
from localstate.benchmarks.runner import ROW_KEYS, BenchParams, normalize_row, suite_rows
from localstate.benchmarks.workloads import run_generic
from localstate.cli import cli

GENERIC = {
    "sequential_put", "random_put", "put_all", "random_get_hit", "get_miss", "get_all", "range_scan",
    "full_scan", "mixed_zipf", "delete_heavy_scan", "commit_overhead", "changelog_append",
    "full_restore", "incremental_restore",
}


def _bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)
    return result.exit_code, result.output


def _check_row(row: dict) -> None:
    assert set(ROW_KEYS) <= set(row)
    assert isinstance(row["workload"], str) and isinstance(row["engine"], str)
    assert isinstance(row["params"], dict) and isinstance(row["unit"], str)
    assert isinstance(row["notes"], str)
    if row["error"] is None:
        assert row["runs"], row
        assert row["min"] <= row["median"] <= row["max"], row
        assert all(isinstance(x, float) for x in row["runs"])
    else:
        assert isinstance(row["error"], str) and row["median"] is None  # NaN → null in JSON
    if row["ratio"] is not None:
        assert row["baseline"] and row["ratio"] > 0


def test_quick_run_end_to_end_writes_schema_json_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = _bench("--quick", "--suite", "generic,core", "--engine", "memory", "--out", str(out),
                          "--workdir", str(tmp_path / "work"), "--strict")
    assert code == 0, output
    assert "sequential_put" in output and "core_restore" in output  # the table
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == 1 and doc["command"].startswith("localstate bench")
    m = doc["machine"]
    assert m["cores"] >= 1 and m["python"] and m["cpu"] and "rocksdict" in m["libraries"]
    rows = doc["rows"]
    for row in rows:
        _check_row(row)
    assert not [r for r in rows if r["error"]]
    generic = {r["workload"] for r in rows if r["suite"] == "generic"}
    assert GENERIC <= generic
    by = {(r["workload"], r["engine"], r["unit"]): r for r in rows}
    # stores and raw engines are compared with the plain-dict baseline measured in the same run
    hit = by[("random_get_hit", "memory", "ops/s")]
    assert hit["baseline"] == "dict" and hit["ratio"] == pytest.approx(
        hit["median"] / by[("random_get_hit", "dict", "ops/s")]["median"])
    assert by[("full_restore", "memory", "MB/s")]["ratio"] is not None
    assert by[("disk_bytes", "memory", "bytes")]["median"] > 0
    assert len(hit["runs"]) == 2 and hit["params"]["records"] == 2000
    assert {("core_write", "ops/s"), ("core_restore", "records/s"), ("core_restore", "MB/s")} <= {
        (r["workload"], r["unit"]) for r in rows if r["engine"] == "memory+file"}
    for chart in ("ops_per_engine.png", "restore.png", "overhead_vs_raw.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "work").iterdir())  # every trial cleaned up after itself


USER_ENGINES = textwrap.dedent('''
    """A user's engines for the benchmark tests: a working one and one that breaks mid-run."""
    from localstate.engines.memory import MemoryEngine, MemoryEngineFactory
    from localstate.errors import EngineError


    class TinyFactory(MemoryEngineFactory):
        description = "a user's engine"


    class FlakyEngine(MemoryEngine):
        """Test double: fails on the 1500th put, a fault a real engine cannot be made to have."""

        def put(self, key, value):
            self.puts = getattr(self, "puts", 0) + 1
            if self.puts == 1500:
                raise EngineError("disk on fire")
            super().put(key, value)


    class FlakyFactory(MemoryEngineFactory):
        def create(self, spec, context):
            return FlakyEngine(spec.name)
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "bench_user_engines.py").write_text(USER_ENGINES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bench_user_engines"
    sys.modules.pop("bench_user_engines", None)


def test_user_engine_by_module_path_and_failing_engine_gets_error_cells(tmp_path: Path, user_module: str) -> None:
    out = tmp_path / "out"
    code, output = _bench(
        "--quick", "--engine", f"{user_module}:TinyFactory", "--engine", f"{user_module}:FlakyFactory",
        "--engine", "localstate.contrib.sqlite_engine:SQLiteEngineFactory",
        "--workload", "sequential_put", "--workload", "random_get_hit", "--workload", "full_scan",
        "--out", str(out), "--workdir", str(tmp_path / "work"),
    )
    assert code == 0, output  # failed cells are reported, not fatal without --strict
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["workload"] for r in rows} == {"sequential_put", "random_get_hit", "full_scan"}
    by = {(r["workload"], r["engine"]): r for r in rows}
    tiny = f"{user_module}:TinyFactory"
    flaky = f"{user_module}:FlakyFactory"
    sqlite = "localstate.contrib.sqlite_engine:SQLiteEngineFactory"
    assert by[("sequential_put", tiny)]["error"] is None and by[("sequential_put", tiny)]["median"] > 0
    assert by[("sequential_put", f"{sqlite}/direct")]["error"] is None
    assert by[("full_scan", sqlite)]["median"] > 0
    # the flaky engine fails where it writes 1500 single puts, and every other cell still ran
    err = by[("sequential_put", f"{flaky}/direct")]["error"]
    assert "disk on fire" in err and "EngineError" in err
    assert by[("random_get_hit", f"{flaky}/direct")]["error"] is None  # loaded with put_all
    assert "cell(s) failed" in output
    code, _ = _bench("--quick", "--engine", flaky, "--workload", "sequential_put", "--strict",
                     "--workdir", str(tmp_path / "work"))
    assert code == 1


def test_suites_that_are_missing_fail_or_return_junk_become_error_cells(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "bench_broken_suite.py").write_text(
        "def run(quick=False, repeats=5):\n    raise RuntimeError('broker down')\n")
    (tmp_path / "bench_junk_suite.py").write_text(
        "def run(quick=False, repeats=5):\n    return [{'workload': 'w', 'engine': 'e'}, 42]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    [missing] = suite_rows("localstate.benchmarks.no_such_area", "nope", True, 1)
    assert "unavailable" in missing["error"] and math.isnan(missing["median"])
    [broken] = suite_rows("bench_broken_suite", "broken", True, 1)
    assert "broker down" in broken["error"] and "RuntimeError" in broken["error"]
    junk = suite_rows("bench_junk_suite", "junk", True, 1)
    assert "without" in junk[0]["error"] and "not a row dict" in junk[1]["error"]
    ok = normalize_row({k: None for k in ROW_KEYS} | {"workload": "w", "engine": "e", "runs": [1, 2],
                                                       "median": 1.5, "params": {}, "unit": "s"}, "s")
    assert ok["error"] is None and ok["runs"] == [1.0, 2.0] and ok["suite"] == "s"
    monkeypatch.setitem(bench_registry.SUITES, "broken", ("bench_broken_suite", "always fails"))
    code, output = _bench("--suite", "broken", "--quick")
    assert code == 0 and "broker down" in output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--engine", "rocksbd"], "Did you mean 'rocksdb'"),
        (["--engine", "nosuch"], "Registered engines: "),
        (["--engine", "nosuchmodule_xyz:Factory"], "nosuchmodule_xyz"),
        (["--workload", "random_gets"], "Valid workloads: sequential_put"),
        (["--suite", "kv,sparky"], "Did you mean 'spark'"),
        (["--engine", "memory", "--records", str(10**12)], "GB of"),
        (["--engine", "memory", "--value-size", str(10**9), "--records", "100000"], "Lower --records"),
        (["--engine", "memory", "--cache-size", "10", "--batch-size", "100"], "--cache-size 10 is smaller"),
        (["--engine", "memory", "--key-size", "2"], "'--key-size': 2 is not in the range x>=4"),
        (["--engine", "memory", "--option", "nonsense"], "expected KEY=VALUE"),
        (["--engine", "memory", "--option", "rocksdb.block.cache.size.bytes=1"], "unknown config key"),
    ],
)
def test_bad_input_is_refused_up_front_with_the_fix(args: list[str], expected: str) -> None:
    code, output = _bench("--quick", *args)
    assert code == 2, output
    assert expected in output


def test_list_shows_suites_workloads_and_engines() -> None:
    code, output = _bench("--list")
    assert code == 0
    for name in ("generic", "core", "kv", "spark", "mixed_zipf", "full_restore", "memory", "rocksdb"):
        assert name in output


def test_generic_rows_are_consistent_across_store_engine_and_baseline(tmp_path: Path) -> None:
    params = BenchParams(records=500, repeats=1, distribution="zipf", changelog="none", cache_size=0,
                         workdir=str(tmp_path))
    rows = run_generic(["memory"], ["random_put", "range_scan", "full_restore", "changelog_append"], params)
    engines = {(r["workload"], r["engine"]) for r in rows}
    # restore and changelog workloads do not apply without a changelog; dict has no range scans;
    # full_restore brings its raw-library baseline along
    assert engines == {("random_put", "memory"), ("random_put", "memory/direct"), ("random_put", "dict"),
                       ("range_scan", "memory"), ("range_scan", "memory/direct"), ("restore_baseline", "dict")}
    assert all(r["params"]["distribution"] == "zipf" for r in rows)


@pytest.mark.parametrize("library", ["rocksdict", "plyvel"])
def test_raw_library_baselines_run_every_baseline_workload(library: str, tmp_path: Path) -> None:
    pytest.importorskip(library)
    from localstate.benchmarks.registry import get_workloads
    from localstate.benchmarks.workloads import Target, footprint_rows, run_cell

    params = BenchParams(records=400, repeats=1, workdir=str(tmp_path))
    target = Target(library, "baseline", library)
    rows = [r for w in get_workloads(None) if "baseline" in w.kinds for r in run_cell(w, target, params)]
    rows += footprint_rows(target, params)
    assert not [r for r in rows if r["error"]], rows
    names = {r["workload"] for r in rows}
    assert {"range_scan", "delete_heavy_scan", "restore_baseline", "disk_bytes"} <= names
    assert next(r for r in rows if r["workload"] == "disk_bytes")["median"] > 0
    assert not list(tmp_path.iterdir())


@pytest.mark.kafka
def test_kafka_changelog_starts_a_local_broker_when_none_is_given(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = _bench("--quick", "--repeats", "1", "--engine", "memory", "--changelog", "kafka",
                          "--workload", "full_restore", "--workload", "changelog_append", "--out", str(out),
                          "--strict")
    assert code == 0, output
    doc = json.loads((out / "results.json").read_text())
    assert "--changelog kafka" in doc["command"]
    rows = {(r["workload"], r["engine"], r["unit"]): r for r in doc["rows"]}
    assert rows[("full_restore", "memory", "records/s")]["median"] > 0
    assert rows[("changelog_append", "kafka changelog", "MB/s")]["params"]["changelog"] == "kafka"


def test_merge_keeps_rows_of_suites_not_rerun(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _bench("--quick", "--repeats", "1", "--engine", "memory", "--workload", "get_miss", "--out", str(out))[0] == 0
    code, output = _bench("--quick", "--repeats", "1", "--suite", "core", "--out", str(out), "--merge")
    assert code == 0, output
    doc = json.loads((out / "results.json").read_text())
    assert {r["suite"] for r in doc["rows"]} == {"generic", "core"}
    assert doc["command"].count("localstate bench") == 2
    assert "| core | core_restore |" in (out / "results.md").read_text()
    # generic cells are replaced one by one: re-measuring get_all keeps get_miss
    code, output = _bench("--quick", "--repeats", "1", "--engine", "memory", "--workload", "get_all",
                          "--out", str(out), "--merge")
    assert code == 0, output
    rows = json.loads((out / "results.json").read_text())["rows"]
    cells = [(r["suite"], r["workload"], r["engine"], r["unit"]) for r in rows]
    assert len(cells) == len(set(cells))
    assert {("generic", "get_miss", "memory", "ops/s"), ("generic", "get_all", "memory", "ops/s"),
            ("core", "core_write", "memory+file", "ops/s")} <= set(cells)
    # every row names the run that measured it, and each run keeps its own machine line
    doc = json.loads((out / "results.json").read_text())
    runs = {r["started"]: r for r in doc["runs"]}
    assert len(runs) == 3 and {r["run"] for r in doc["rows"]} == set(runs)
    assert all("load_average" in r["machine"] and r["command"].startswith("localstate bench") for r in runs.values())
    assert {r["run"] for r in doc["rows"] if r["suite"] == "core"} != {r["run"] for r in doc["rows"]
                                                                      if r["workload"] == "get_all"}
    assert (out / "results.md").read_text().count("load average at start") == 3


def test_every_area_suite_that_exists_exposes_run_quick_repeats() -> None:
    import importlib
    import importlib.util
    import inspect

    present = 0
    for name, (module, _desc) in bench_registry.SUITES.items():
        if not module or importlib.util.find_spec(module) is None:
            continue
        present += 1
        run = importlib.import_module(module).run
        params = inspect.signature(run).parameters
        assert {"quick", "repeats"} <= set(params), name
        assert params["quick"].default is False and params["repeats"].default == 5, name
    assert present >= 1  # core_figures at least


@pytest.mark.slow
def test_area_suites_run_quick_through_the_cli_without_error_cells(tmp_path: Path) -> None:
    """Every area suite that exists (Spark's has its own Spark-session tests) runs its quick
    form through ``localstate bench``, so none of them can rot unnoticed."""
    import importlib.util

    suites = [name for name, (module, _d) in bench_registry.SUITES.items()
              if module and name not in ("core", "spark") and importlib.util.find_spec(module) is not None]
    if not suites:
        pytest.fail("no area suite module is present")
    out = tmp_path / "out"
    code, output = _bench("--quick", "--repeats", "1", "--suite", ",".join(suites), "--out", str(out))
    assert code == 0, output
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert not [r for r in rows if r["error"]], [r["error"] for r in rows if r["error"]]
    assert {r["suite"] for r in rows} == set(suites)
    for row in rows:
        _check_row(row)


# -- readable output: the summary, the help, the charts ----------------------------------------
RESULTS = Path(__file__).parent.parent / "benchmarks" / "results" / "results.json"


def _committed_rows() -> list[dict]:
    import json

    rows = json.loads(RESULTS.read_text())["rows"]
    for r in rows:  # error cells are stored with null figures
        for k in ("median", "min", "max"):
            if r.get(k) is None:
                r[k] = float("nan")
    return rows


def test_quick_runs_only_the_in_process_suites_unless_told_otherwise() -> None:
    from localstate.benchmarks.cli import QUICK_SUITES, selected_suites

    assert selected_suites(None, quick=True, generic_only=False) == list(QUICK_SUITES)
    assert not {"kafka", "spark"} & set(QUICK_SUITES)
    assert selected_suites("kafka", quick=True, generic_only=False) == ["kafka"]
    assert selected_suites(None, quick=True, generic_only=True) == ["generic"]
    assert "spark" in selected_suites(None, quick=False, generic_only=False)


def test_summary_is_compact_explains_ratios_and_keeps_every_engine() -> None:
    import io

    from localstate.benchmarks.report import render_summary, summary_rows
    from rich.console import Console

    rows = _committed_rows()
    engines, generic, area = summary_rows(rows)
    assert engines == ["memory", "memory/direct", "rocksdb", "rocksdb/direct", "leveldb", "leveldb/direct"]
    buf = io.StringIO()
    render_summary(rows, Console(file=buf, width=200))
    text = buf.getvalue()
    assert len(text.splitlines()) < 100 < len(rows)  # the full table is one line per row (and more)
    assert "above 1 is faster" in text and "above 1 is slower" in text and "<engine>/direct" in text
    for e in ("memory", "rocksdb", "leveldb", "dict", "rocksdict", "plyvel", "tantivy", "hyperloglog"):
        assert e in text, e
    kafka = [cells for suite, _w, cells in area if suite == "kafka"]
    assert kafka and all("partitions=4" in c for c in kafka if c.count("localstate kafka") > 1)


def test_help_and_list_have_no_phantom_options_or_issue_numbers() -> None:
    for args in (["bench", "--help"], ["bench", "--list"]):
        text = CliRunner().invoke(cli, args).output
        assert "--scan-length" not in text and not re.search(r"\bissue \d", text, re.I), text
    for args in (["bench", "--help"], ["bench", "--list"]):
        text = " ".join(CliRunner().invoke(cli, args).output.split())
        assert "<engine>/direct the engine alone" in text, args
    assert "about 15 s" in " ".join(CliRunner().invoke(cli, ["bench", "--help"]).output.split())


def test_charts_from_the_committed_results_fit_and_label_every_bar(tmp_path: Path) -> None:
    import matplotlib.image as mpimg
    from localstate.benchmarks.report import with_variants, write_charts

    rows = _committed_rows()
    for chart in write_charts(tmp_path, rows):
        height, width = mpimg.imread(chart).shape[:2]
        assert width <= 1400 and height <= 2400, (chart.name, width, height)
    restore = [r for r in rows if "restore" in r["workload"] and r["unit"] == "records/s" and not r.get("error")]
    labels = [text for text, _r in with_variants(restore, lambda r: f"{r['suite']} · {r['workload']} · {r['engine']}")]
    assert len(labels) == len(set(labels))  # the two kafka.restore runs differ by partitions


def test_the_engine_chart_fits_long_user_engine_names(tmp_path: Path) -> None:
    """A user engine named by its module path gets a two-line label that keeps the name's
    end (where it differs from its ``/direct`` variant), and the chart lays out without
    matplotlib's "tight layout not applied" warning."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from localstate.benchmarks.report import _label, _ops_chart

    user = f"{tmp_path}/popen-gw1/test_user_engine_by_module_pa0/usermod.py:TinyFactory"
    engines = [user, f"{user}/direct", "localstate.contrib.sqlite_engine:SQLiteEngineFactory"]
    labels = [_label(e, 28, keep_end=True) for e in engines]
    assert len(set(labels)) == 3 and all(len(line) <= 28 for lab in labels for line in lab.split("\n"))
    assert labels[1].replace("\n", "").endswith("usermod.py:TinyFactory/direct")
    rates = [{"workload": w, "unit": "ops/s", "engine": e, "median": 1000.0 * (i + 1)}
             for w in ("sequential_put", "random_get_hit", "full_scan") for i, e in enumerate(engines)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chart = _ops_chart(plt, rates, tmp_path / "ops.png")
    assert chart.stat().st_size > 0
