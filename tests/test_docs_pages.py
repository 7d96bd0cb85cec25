"""What the pages say about the package itself is true: the extras table lists every
extra pyproject.toml declares, and a run time quoted for the demo or a quick benchmark
says on what machine it was measured (a figure without its machine is a promise the
reader's laptop, or a busy CI runner, does not keep)."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_extras_table_lists_every_extra() -> None:
    text = (ROOT / "docs" / "getting-started.md").read_text()
    listed: set[str] = set()
    for row in re.findall(r"^\| (`[^|]+) \|", text, re.M):
        listed |= set(re.findall(r"`([\w-]+)`", row))
    missing = sorted(set(EXTRAS) - listed)
    assert not missing, f"docs/getting-started.md's extras table lacks {missing} (pyproject.toml declares them)"
    unknown = sorted(listed - set(EXTRAS))
    assert not unknown, f"docs/getting-started.md's extras table lists extras pyproject.toml does not have: {unknown}"


DURATION = re.compile(r"\b\d+(?:[.–-]\d+)?\s*(?:s|seconds?|min|minutes?)\b")
RUNS = re.compile(r"\bthe demo\b|localstate demo|demo pipeline|bench --quick")
MACHINE = re.compile(r"\b\d+[- ](?:[a-z]+ )?cores?\b")  # "2 cores", "2-core", "2 idle cores"


def _user_pages() -> list[tuple[str, str]]:
    """(name, text) of README.md, every page of docs/, and the "How to run" section of
    benchmarks/RESULTS.md (the rest of it is a dated log of measurements, each with its
    machine and load)."""
    pages = [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in
             [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]]
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    how = re.search(r"^## How to run\n(.*?)(?=^## )", results, re.M | re.S)
    assert how, "benchmarks/RESULTS.md has no '## How to run' section"
    pages.append(("benchmarks/RESULTS.md (How to run)", how.group(1)))
    return pages


def test_quoted_run_times_of_the_demo_and_quick_benchmarks_name_the_machine() -> None:
    vague = []
    for name, text in _user_pages():
        for paragraph in re.split(r"\n\s*\n", text.strip("\n")):
            lines = paragraph.splitlines()
            tabular = all(line.startswith(("    ", "|")) for line in lines)  # code or a table: line by line
            for line in lines if tabular else [paragraph]:
                if RUNS.search(line) and DURATION.search(line) and not MACHINE.search(line):
                    vague.append(f"{name}: {' '.join(line.split())[:160]}")
    assert not vague, ("run times quoted without the machine they were measured on "
                       "(say e.g. 'on 2 cores'):\n" + "\n".join(vague))
