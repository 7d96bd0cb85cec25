"""Product code says what and why, not its history.

Comments and docstrings of the shipped packages (benchmarks included) carry no issue numbers, work-log
references ("session 4") or citations of a design document outside the repository; the
protocol they cite is docs/design/protocol.md, which is in it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "engines", "changelog", "contrib", "benchmarks")
HISTORY = re.compile(r"\b[Ii]ssue #?\d+|\b[Ss]ession \d+\b|\bthis session\b|\bDESIGN(\.md)? ?§")


def test_no_history_or_outside_references_in_product_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "history or outside references in code:\n" + "\n".join(found)


def test_the_protocol_the_code_cites_is_in_the_repository() -> None:
    cited = {
        match
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for match in re.findall(r"docs/design/[\w-]+\.md", path.read_text(encoding="utf-8"))
    }
    assert "docs/design/protocol.md" in cited
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"code cites design pages that do not exist: {missing}"
