"""Output: a terminal table (rich), JSON with the stable row schema, PNG charts.

JSON document::

    {"schema": 1, "command": str, "started": ISO-8601, "seconds": float,
     "machine": {...}, "params": {...}, "rows": [row, ...],
     "runs": [{"started", "command", "seconds", "machine", "params"}, ...]}

Each row's ``run`` is the ``started`` of the run that measured it: after ``--merge``
the document holds rows of several runs, each with its own machine and load line.

Charts (matplotlib, headless), each readable without the table: ``ops_per_engine.png``
(one small panel per generic workload, its own log scale, engines coloured by family),
``restore.png`` (every restore figure as a bar, records/s and MB/s, log scale) and
``overhead_vs_raw.png`` (ratio to the baseline: a workload × engine grid for the
generic suite, a panel per area suite; green better, red worse).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .runner import ROW_KEYS

__all__ = ["render_table", "render_summary", "summary_rows", "ratio_text", "with_variants", "RATIO_NOTE",
           "write_json", "write_charts", "write_markdown", "markdown_table", "format_value", "SCHEMA_VERSION"]

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
            escape(r["workload"]), escape(r["engine"]), escape(r["unit"]),
            format_value(r["median"], r["unit"]), format_value(r["min"], r["unit"]), format_value(r["max"], r["unit"]),
            escape(r.get("baseline") or ""),
            f"{ratio_text(ratio)}x" if ratio is not None else "",
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


def _cell(r: dict[str, Any], *, name: str | None = None) -> str:
    """``1.2M ×0.45`` (``name`` first when given); ``error`` for a failed cell."""
    if r.get("error"):
        text = "error"
    else:
        text = format_value(r["median"], r["unit"])
        if r.get("ratio") is not None:
            text += f" ×{ratio_text(r['ratio'])}"
    return f"{name} {text}" if name else text


def ratio_text(ratio: float) -> str:
    """``0.45``, ``1.02``; two significant digits below 0.1 (``0.0041``, not ``0.00``)."""
    return f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.2g}"


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
        others = [_cell(r, name=e) for e, r in cells.items() if e not in engines and not r.get("baseline")]
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
                 ", ".join(_cell(r, name=name) + (f" vs {r['baseline']}" if r.get("baseline") else "")
                           for name, r in with_variants(cells, lambda r: r["engine"])))
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
        with_other = any(row[-1] for row in generic)  # targets that are not engines (the changelog alone)
        if with_other:
            table.add_column("other", justify="left")
        for row in generic:
            table.add_row(*(escape(c) for c in (row if with_other else row[:-1])))
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
            f"{ratio_text(ratio)}x" if ratio is not None else "", text.replace("|", "\\|").replace("\n", " "),
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


_RAW_FAMILY = {"dict": "memory", "rocksdict": "rocksdb", "plyvel": "leveldb"}
"""Raw library → the engine built on it: drawn in that engine's colour family."""
_HIGHER_IS_WORSE = ("s", "bytes")
"""Units where a ratio above 1 is worse (slower, bigger); for rates above 1 is better."""


def _goodness(ratio: float, unit: str) -> float:
    """log10 of how much better than the baseline: > 0 better, < 0 worse, whatever the unit."""
    sign = -1.0 if unit in _HIGHER_IS_WORSE else 1.0
    return sign * math.log10(ratio) if ratio > 0 else 0.0


def _style(engine: str, palette: dict[str, Any]) -> dict[str, Any]:
    """Bar style by engine family: the store solid, ``/direct`` light and hatched, the raw
    library dark and cross-hatched, so variants of one engine read as one family."""
    import matplotlib.colors as mcolors

    family, _, variant = engine.partition("/")
    raw = family in _RAW_FAMILY
    family = _RAW_FAMILY.get(family, family)
    if family not in palette:
        palette[family] = _PALETTE[len(palette) % len(_PALETTE)]
    rgb = mcolors.to_rgb(palette[family])
    if variant == "direct":
        return {"color": tuple(c + (1 - c) * 0.45 for c in rgb), "hatch": "///", "edgecolor": "white"}
    if raw:
        return {"color": tuple(c * 0.55 for c in rgb), "hatch": "xx", "edgecolor": "white"}
    return {"color": rgb, "edgecolor": "white"}


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _label(text: str, width: int = 46, *, keep_end: bool = False) -> str:
    """A tick label wrapped onto at most two lines (long engine names stay distinct).
    ``keep_end``: a name longer than two lines keeps its end instead of its start (a user
    engine's module path differs from its ``/direct`` variant only there)."""
    import textwrap

    if keep_end and len(text) > 2 * width:
        text = "…" + text[-(2 * width - 1):]
    lines = textwrap.wrap(text, width) or [""]
    return "\n".join(lines[:1] + [_short(" ".join(lines[1:]), width)] if len(lines) > 1 else lines)


def with_variants(rows: list[dict[str, Any]], name: Callable[[dict[str, Any]], str]
                  ) -> list[tuple[str, dict[str, Any]]]:
    """``(label, row)`` with ``name(row)`` as the label, plus the parameters that tell
    rows of the same label apart (e.g. ``partitions=4``), so no two labels are equal."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(name(r), []).append(r)
    out = []
    for r in rows:
        label = name(r)
        same = groups[label]
        if len(same) > 1:
            keys = sorted({k for o in same for k in (o.get("params") or {})})
            differ = [k for k in keys if len({json.dumps((o.get("params") or {}).get(k), default=str) for o in same}) > 1]
            if differ:
                label += " (" + ", ".join(f"{k}={(r.get('params') or {}).get(k)}" for k in differ) + ")"
        out.append((label, r))
    return out


def _without_mb_twins(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop MB/s rows whose records/s twin (same suite, workload, engine, params) is
    there: one timing gives both, so their ratios are equal."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("suite"), r["workload"], r["engine"], json.dumps(r.get("params"), sort_keys=True, default=str))

    have = {key(r) for r in rows if r["unit"] == "records/s"}
    return [r for r in rows if not (r["unit"] == "MB/s" and key(r) in have)]


_NICE = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def _ratio_axis(ax: Any, lo: float, hi: float) -> None:
    """A log x axis from ``lo`` to ``hi`` with a few ``0.5×`` labels (no 10^x minor labels)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ticks = [t for t in _NICE if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
    ax.xaxis.set_minor_locator(NullLocator())


def _tick(value: float) -> str:
    """``100k``, ``1M``, ``10``: axis labels of powers of ten, without the table's decimals."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _rate_axis(ax: Any) -> None:
    """A log x axis labelled like the table (``1.2M``), without 10^x minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _tick(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _ops_chart(plt: Any, rates: list[dict[str, Any]], path: Path) -> Path:
    """Generic rates: one small panel per workload (its own log scale), engines as bars."""
    groups = list(dict.fromkeys((r["workload"], r["unit"]) for r in rates))
    engines = list(dict.fromkeys(r["engine"] for r in rates))
    palette: dict[str, Any] = {}
    styles = {e: _style(e, palette) for e in engines}
    cols = 4
    nrows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(13, 2.3 * nrows + 1.0), squeeze=False)
    for ax, (workload, unit) in zip(axes.flat, groups):
        sel = [r for r in rates if (r["workload"], r["unit"]) == (workload, unit)]
        ys = range(len(sel))
        for y, r in zip(ys, sel):
            ax.barh(y, r["median"], **styles[r["engine"]])
            ax.text(r["median"], y, " " + format_value(r["median"], unit), va="center", fontsize=7)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([_label(r["engine"], 28, keep_end=True) for r in sel], fontsize=7)
        ax.invert_yaxis()
        _rate_axis(ax)
        lo = min(r["median"] for r in sel)
        hi = max(r["median"] for r in sel)
        ax.set_xlim(lo / 3, hi * 8)  # room for the value labels
        ax.set_title(f"{workload} [{unit}]", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle("Generic workloads: median rate per engine (log scale; longer is faster)\n"
                 "solid: localstate store · light hatched: <engine>/direct (no store layers) · "
                 "dark cross-hatched: the raw library", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)


def _family(engine: str) -> str:
    """``"localstate rocksdb+file, 4 partitions"`` → ``"rocksdb"``: the colour family."""
    name = engine.removeprefix("localstate ")
    for sep in ("+", "/", " ", ","):
        name = name.split(sep)[0]
    return name


def _restore_chart(plt: Any, restore: list[dict[str, Any]], path: Path) -> Path:
    """Every restore figure as a horizontal bar (log scale: rates span decades), records/s
    and MB/s side by side, localstate in its engine's colour and references grey."""
    per_unit = {unit: [r for r in restore if r["unit"] == unit] for unit in ("records/s", "MB/s")}
    labelled = with_variants(per_unit["records/s"] or per_unit["MB/s"],
                             lambda r: f"{r.get('suite') or 'generic'} · {r['workload']} · {r['engine']}")
    keys = [(r.get("suite"), r["workload"], r["engine"], json.dumps(r.get("params"), sort_keys=True, default=str))
            for _label_text, r in labelled]
    baselines = {r.get("baseline") for r in restore}
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.36 * len(keys) + 1.4), sharey=True,
                             gridspec_kw={"width_ratios": (1.15, 1)})
    palette: dict[str, Any] = {}
    for ax, unit in zip(axes, ("records/s", "MB/s")):
        by = {(r.get("suite"), r["workload"], r["engine"], json.dumps(r.get("params"), sort_keys=True, default=str)): r
              for r in per_unit[unit]}
        values = []
        last_suite = None
        for y, key in enumerate(keys):
            if last_suite is not None and key[0] != last_suite:
                ax.axhline(y - 0.5, color="grey", linewidth=0.6)
            last_suite = key[0]
            r = by.get(key)
            if r is None:
                continue
            engine = key[2]
            is_ref = engine in baselines or engine.startswith("raw") or key[1] == "restore_baseline"
            color = "#9a9a9a" if is_ref else _style(_family(engine), palette)["color"]
            ax.barh(y, r["median"], color=color, edgecolor="white")
            top = r["median"]
            if r.get("min") is not None and r.get("max") is not None and not math.isnan(r["max"]):
                ax.plot([r["min"], r["max"]], [y, y], color="black", linewidth=0.8)
                top = max(top, r["max"])
            ax.text(top * 1.08, y, format_value(r["median"], unit), va="center", fontsize=7)
            values.append(r["median"])
        _rate_axis(ax)
        if values:
            ax.set_xlim(min(values) / 2, max(values) * 6)
        ax.set_title(f"restore {unit} (median; black line: min-max of the runs)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(range(len(keys)))
    axes[0].set_yticklabels([_label(text) for text, _r in labelled], fontsize=7)
    axes[0].set_ylim(len(keys) - 0.5, -0.5)
    fig.suptitle("Restore speed, log scale (rates span decades). Colour: localstate by engine; grey: the raw "
                 "library or reference measured in the same run", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)


def _overhead_chart(plt: Any, ratios: list[dict[str, Any]], path: Path) -> Path:
    """Ratios to the baseline: the generic suite as a workload × engine grid, each area
    suite as its own panel of bars; green is better than the baseline, red worse."""
    import matplotlib.colors as mcolors

    cmap = plt.get_cmap("RdYlGn")
    norm = mcolors.TwoSlopeNorm(vmin=-1.5, vcenter=0.0, vmax=1.5)
    ratios = _without_mb_twins(ratios)
    generic = [r for r in ratios if (r.get("suite") or "generic") == "generic"]
    suites = list(dict.fromkeys(r.get("suite") for r in ratios if (r.get("suite") or "generic") != "generic"))
    area = {s: [r for r in ratios if r.get("suite") == s] for s in suites}
    workloads = list(dict.fromkeys((r["workload"], r["unit"]) for r in generic))
    engines = list(dict.fromkeys(r["engine"] for r in generic))
    heights = ([0.32 * len(workloads) + 1.0] if generic else []) + [0.24 * len(area[s]) + 0.6 for s in suites]
    fig, axes = plt.subplots(len(heights), 1, figsize=(11, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    panels = list(axes[:, 0])
    if generic:
        ax = panels.pop(0)
        grid = [[math.nan] * len(engines) for _ in workloads]
        for r in generic:
            grid[workloads.index((r["workload"], r["unit"]))][engines.index(r["engine"])] = r["ratio"]
        colors = [[cmap(norm(_goodness(v, u))) if not math.isnan(v) else (1, 1, 1, 1) for v in row]
                  for row, (_w, u) in zip(grid, workloads)]
        ax.imshow(colors, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{ratio_text(v)}×", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(engines)))
        ax.set_xticklabels(engines, fontsize=8)
        ax.xaxis.tick_top()
        ax.set_yticks(range(len(workloads)))
        ax.set_yticklabels([f"{w} [{u}]" for w, u in workloads], fontsize=8)
        ax.set_title("generic suite: engine / raw library (memory: dict, rocksdb: rocksdict, leveldb: plyvel)",
                     fontsize=9, pad=20)
    for ax, suite in zip(panels, suites):
        labelled = with_variants(area[suite], lambda r: f"{r['workload']} [{r['unit']}] · {r['engine']} "
                                                        f"vs {r['baseline']}")
        sel = [r for _text, r in labelled]
        ys = range(len(sel))
        for y, r in zip(ys, sel):  # bars grow from parity (1×) towards the ratio, left or right
            ratio = r["ratio"]
            ax.barh(y, ratio - 1.0, left=1.0, color=cmap(norm(_goodness(ratio, r["unit"]))), edgecolor="grey",
                    linewidth=0.5)
            ax.text(ratio * (1.06 if ratio >= 1 else 1 / 1.06), y, f"{ratio_text(ratio)}×", va="center", fontsize=7,
                    ha="left" if ratio >= 1 else "right")
        ax.axvline(1.0, color="black", linewidth=0.8)
        lo = min(min(r["ratio"] for r in sel), 1.0)
        hi = max(max(r["ratio"] for r in sel), 1.0)
        _ratio_axis(ax, lo / 3, hi * 3)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([_label(text, 70) for text, _r in labelled], fontsize=7)
        ax.set_ylim(len(sel) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{suite} suite: localstate / baseline (log scale; the line is parity)", fontsize=9)
    fig.suptitle("Overhead vs the raw library, measured in the same run. Rates: above 1× is faster; "
                 "seconds and bytes: above 1× is slower or bigger.\nGreen: better than the baseline, "
                 "red: worse. <engine>/direct: the engine without the store layers.", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (sum(heights) + 1.0)))
    return _save(fig, path, plt)


def write_charts(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Write the PNG charts that have data; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    ok = _ok(rows)
    written: list[Path] = []
    rates = [r for r in ok if r["unit"] in _RATE_UNITS and (r.get("suite") or "generic") == "generic"]
    if rates:
        written.append(_ops_chart(plt, rates, out / "ops_per_engine.png"))
    restore = [r for r in ok if "restore" in r["workload"] and r["unit"] in ("MB/s", "records/s")]
    if restore:
        written.append(_restore_chart(plt, restore, out / "restore.png"))
    ratios = [r for r in ok if r.get("ratio") is not None and r["ratio"] > 0]
    if ratios:
        written.append(_overhead_chart(plt, ratios, out / "overhead_vs_raw.png"))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
