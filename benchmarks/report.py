"""Output: a terminal table (rich), JSON with the stable row schema, PNG charts.

JSON document::

    {"schema": 1, "command": str, "started": ISO-8601, "seconds": float,
     "machine": {...}, "params": {...}, "rows": [row, ...],
     "runs": [{"started", "command", "seconds", "machine", "params"}, ...]}

Each row's ``run`` is the ``started`` of the run that measured it: after ``--merge``
the document holds rows of several runs, each with its own machine and load line.

Charts (matplotlib, headless): ``ops_per_engine.png`` (rate per engine per workload,
log scale), ``restore.png`` (restore MB/s and records/s per engine) and
``overhead_vs_raw.png`` (ours / raw library per workload).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .runner import ROW_KEYS

__all__ = ["render_table", "render_summary", "summary_rows", "RATIO_NOTE", "write_json", "write_charts", "write_markdown", "markdown_table", "format_value", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
_RATE_UNITS = ("ops/s", "records/s", "commits/s", "delta records/s", "docs/s", "queries/s", "adds/s", "updates/s")


def format_value(x: float | None, unit: str = "") -> str:
    """Human-readable figure: ``1.23M``, ``45.6k``, ``789``; ``-`` for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if unit == "bytes":
        for div, suffix in ((1 << 30, " GiB"), (1 << 20, " MiB"), (1 << 10, " KiB")):
            if abs(x) >= div:
                return f"{x / div:.1f}{suffix}"
        return f"{x:.0f} B"
    if unit == "s":
        return f"{x:.3f}"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.0f}"


def render_table(rows: list[dict[str, Any]], console: Console | None = None, title: str = "localstate bench") -> None:
    """Print one table row per result, grouped by workload; errors in red."""
    console = console or _console()
    table = Table(title=title, show_lines=False, header_style="bold")
    for col, justify in (("workload", "left"), ("engine", "left"), ("unit", "left"), ("median", "right"),
                         ("min", "right"), ("max", "right"), ("vs", "left"), ("ratio", "right"),
                         ("error / notes", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            table.add_section()
        last = r["workload"]
        err = r.get("error")
        ratio = r.get("ratio")
        table.add_row(
            r["workload"], r["engine"], r["unit"],
            format_value(r["median"], r["unit"]), format_value(r["min"], r["unit"]), format_value(r["max"], r["unit"]),
            r.get("baseline") or "",
            f"{ratio:.2f}x" if ratio is not None else "",
            f"[red]{escape(err)}[/red]" if err else f"[dim]{escape(_short(r.get('notes') or ''))}[/dim]",
        )
    console.print(table)


RATIO_NOTE = (
    "×N = localstate's figure / its baseline's (the 'vs' column of the full table: the raw library, "
    "or the reference named there), measured in the same run. For rates (…/s) above 1 is faster and "
    "below 1 slower; for times (s) and sizes (bytes) above 1 is slower or bigger. <engine>/direct is "
    "the engine driven without the store layers (serdes, object cache, changelog): the gap between it "
    "and <engine> is what those layers cost."
)
"""How to read a ratio; printed under the summary and written into results.md."""


def _cell(r: dict[str, Any], *, with_engine: bool = False) -> str:
    if r.get("error"):
        text = "error"
    else:
        text = format_value(r["median"], r["unit"])
        if r.get("ratio") is not None:
            text += f" ×{r['ratio']:.2f}"
    return f"{r['engine']} {text}" if with_engine else text


def summary_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The compact summary: ``(engine columns, generic rows, area rows)``.

    Generic rows are one per workload (its first unit, so MB/s twins of records/s rows
    are left to the full table), a cell per localstate engine; figures of other targets
    (raw libraries, the changelog alone) go in the last cell. Area rows are one per
    suite and workload that compares localstate with a raw library, engines inline.
    """
    generic = [r for r in rows if (r.get("suite") or "generic") == "generic"]
    engines = list(dict.fromkeys(r["engine"] for r in generic if r.get("baseline")))
    by_workload: dict[str, dict[str, Any]] = {}
    units: dict[str, str] = {}
    for r in generic:
        unit = units.setdefault(r["workload"], r["unit"])
        if r["unit"] == unit:
            by_workload.setdefault(r["workload"], {}).setdefault(r["engine"], r)
    generic_out = []
    for workload, cells in by_workload.items():
        others = [_cell(r, with_engine=True) for e, r in cells.items() if e not in engines and not r.get("baseline")]
        if not any(e in cells for e in engines) and not others:
            continue
        generic_out.append((f"{workload} [{units[workload]}]",
                            *(_cell(cells[e]) if e in cells else "" for e in engines),
                            ", ".join(others) if not any(e in cells for e in engines) else ""))
    area: dict[tuple[str, str], list[dict[str, Any]]] = {}
    area_units: dict[tuple[str, str], str] = {}
    for r in rows:
        suite = r.get("suite") or "generic"
        if suite == "generic" or (r.get("ratio") is None and not r.get("error")):
            continue
        key = (suite, r["workload"])
        if area_units.setdefault(key, r["unit"]) == r["unit"]:
            area.setdefault(key, []).append(r)
    area_out = [(suite, f"{workload} [{area_units[(suite, workload)]}]",
                 ", ".join(f"{_cell(r, with_engine=True)}" + (f" vs {r['baseline']}" if r.get("baseline") else "")
                           for r in cells))
                for (suite, workload), cells in area.items()]
    return engines, generic_out, area_out


def render_summary(rows: list[dict[str, Any]], console: Console | None = None,
                   title: str = "localstate bench") -> None:
    """Print the compact summary (engine × workload, ratios explained), not every row."""
    console = console or _console()
    engines, generic, area = summary_rows(rows)
    if generic:
        table = Table(title=escape(title), header_style="bold", title_justify="left")
        table.add_column("workload [unit]")
        for e in engines:
            table.add_column(escape(e), justify="right")
        table.add_column("other", justify="left")
        for row in generic:
            table.add_row(*(escape(c) for c in row))
        console.print(table)
    if area:
        table = Table(title=escape(f"{title}: area suites"), header_style="bold",
                      title_justify="left")
        for col in ("suite", "workload [unit]", "localstate: median ×ratio vs baseline"):
            table.add_column(col)
        last = None
        for suite, workload, cells in area:
            if last is not None and suite != last:
                table.add_section()
            table.add_row(escape(suite if suite != last else ""), escape(workload), escape(cells))
            last = suite
        console.print(table)
    failed = [r for r in rows if r.get("error")]
    if failed:
        table = Table(title="failed cells", header_style="bold red", title_justify="left")
        for col in ("suite", "workload", "engine", "error"):
            table.add_column(col, overflow="fold")
        for r in failed:
            table.add_row(*(escape(str(r.get(k) or "generic" if k == "suite" else r.get(k) or ""))
                            for k in ("suite", "workload", "engine")), f"[red]{escape(_short(r['error'], 200))}[/red]")
        console.print(table)
    console.print(escape(RATIO_NOTE), style="dim")


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 180))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results as a GitHub-flavoured markdown table (for RESULTS.md)."""
    lines = [
        "| suite | workload | engine | unit | median | min | max | vs | ratio | notes / error |",
        "|---|---|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        ratio = r.get("ratio")
        text = f"**error:** {r['error']}" if r.get("error") else (r.get("notes") or "")
        lines.append("| " + " | ".join([
            str(r.get("suite") or ""), r["workload"], r["engine"], r["unit"],
            format_value(r["median"], r["unit"]), format_value(r["min"], r["unit"]),
            format_value(r["max"], r["unit"]), r.get("baseline") or "",
            f"{ratio:.2f}x" if ratio is not None else "", text.replace("|", "\\|").replace("\n", " "),
        ]) + " |")
    return "\n".join(lines) + "\n"


def _machine_line(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('cpu')}, {machine.get('cores')} cores, "
        f"{(machine.get('memory_bytes') or 0) / 2**30:.1f} GiB RAM, {machine.get('platform')}, "
        f"Python {machine.get('python')}; load average at start {machine.get('load_average')}"
    )


def write_markdown(path: Path, rows: list[dict[str, Any]], *, machine: dict[str, Any], command: str,
                   started: str, seconds: float, runs: list[dict[str, Any]] | None = None) -> Path:
    """``results.md``: command, machine and the table, ready to paste into RESULTS.md.

    With several ``runs`` (a merged document) each run gets its own line: when it
    started, its command and its machine's load, since rows of different runs were
    measured under different conditions.
    """
    libs = ", ".join(f"{k} {v}" for k, v in machine.get("libraries", {}).items() if v)
    if runs and len(runs) > 1:
        head = "Runs (each row's `run` in results.json names one):\n\n" + "".join(
            f"- {r.get('started')}: `{r.get('command')}`, {float(r.get('seconds') or 0):.0f} s; "
            f"{_machine_line(r.get('machine') or {})}\n" for r in runs
        ) + "\n"
    else:
        head = (
            f"Command: `{command}`  \n"
            f"Started {started}, took {seconds:.0f} s.  \n"
            f"Machine: {_machine_line(machine)}.  \n"
        )
    text = head + f"Libraries: {libs}.\n\n{RATIO_NOTE}\n\n" + markdown_table(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _short(text: str, limit: int = 70) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def write_json(path: Path, rows: list[dict[str, Any]], *, machine: dict[str, Any], command: str,
               params: dict[str, Any], started: str, seconds: float,
               runs: list[dict[str, Any]] | None = None) -> Path:
    """Write the results document; NaN figures of error cells become ``null``."""
    doc = {
        "schema": SCHEMA_VERSION,
        "command": command,
        "started": started,
        "seconds": round(seconds, 3),
        "machine": machine,
        "params": params,
        "rows": [{**{k: r.get(k) for k in ROW_KEYS}, "suite": r.get("suite"), "run": r.get("run", started)}
                 for r in rows],
        "runs": runs or [{"started": started, "command": command, "seconds": round(seconds, 3),
                          "machine": machine, "params": params}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(doc), indent=1) + "\n")
    return path


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r.get("error") and r["median"] is not None and not math.isnan(r["median"])]


def _grouped_bars(ax: Any, groups: list[str], series: dict[str, dict[str, float]], *, log: bool) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [values.get(g, 0.0) for g in groups]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=35, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)


def write_charts(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Write the PNG charts that have data; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    ok = _ok(rows)
    written: list[Path] = []

    rates = [r for r in ok if r["unit"] in _RATE_UNITS and r.get("suite", "generic") == "generic"]
    if rates:
        groups = list(dict.fromkeys(f"{r['workload']} ({r['unit']})" for r in rates))
        series: dict[str, dict[str, float]] = {}
        for r in rates:
            series.setdefault(r["engine"], {})[f"{r['workload']} ({r['unit']})"] = r["median"]
        fig, ax = plt.subplots(figsize=(max(8, len(groups) * 0.8), 5))
        _grouped_bars(ax, groups, series, log=True)
        ax.set_ylabel("rate (median, log scale)")
        ax.set_title("Throughput per engine per workload")
        fig.tight_layout()
        written.append(_save(fig, out / "ops_per_engine.png", plt))

    restore = [r for r in ok if "restore" in r["workload"] and r["unit"] in ("MB/s", "records/s")]
    if restore:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, unit in zip(axes, ("MB/s", "records/s")):
            sel = [r for r in restore if r["unit"] == unit]
            labels = [f"{r['engine']}\n{r['workload']}" for r in sel]
            ax.bar(range(len(sel)), [r["median"] for r in sel], color="tab:green")
            ax.errorbar(range(len(sel)), [r["median"] for r in sel],
                        yerr=[[r["median"] - r["min"] for r in sel], [r["max"] - r["median"] for r in sel]],
                        fmt="none", ecolor="black", capsize=3)
            ax.set_xticks(range(len(sel)))
            ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
            ax.set_title(f"Restore {unit} (median, min-max)")
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        written.append(_save(fig, out / "restore.png", plt))

    ratios = [r for r in ok if r.get("ratio") is not None and r["unit"] != "bytes"]
    if ratios:
        groups = list(dict.fromkeys(f"{r['workload']} ({r['unit']})" for r in ratios))
        series = {}
        for r in ratios:
            series.setdefault(f"{r['engine']} vs {r['baseline']}", {})[f"{r['workload']} ({r['unit']})"] = r["ratio"]
        fig, ax = plt.subplots(figsize=(max(8, len(groups) * 0.8), 5))
        _grouped_bars(ax, groups, series, log=True)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("ours / raw library (1 = parity; rates: < 1 is slower)")
        ax.set_title("Framework overhead vs the raw library")
        fig.tight_layout()
        written.append(_save(fig, out / "overhead_vs_raw.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
