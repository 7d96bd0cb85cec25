"""docs/architecture.md is checked against the code: every module path it names exists,
and every module it puts in the "who owns what" table defines the names quoted beside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_the_map_names_exists() -> None:
    paths = set(re.findall(r"`((?:core|engines|changelog|contrib|benchmarks|tests)/[\w/]+\.py)`", DOC))
    paths |= {p for p in re.findall(r"`((?:engines|changelog)/\*\.py)`", DOC)}
    assert len(paths) >= 30, "the map names the modules it describes"
    missing = sorted(p for p in paths if "*" not in p and not (ROOT / p).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_names_quoted_beside_a_module_are_defined_there() -> None:
    rows = re.findall(r"`((?:core|engines|changelog|contrib)/[\w/]+\.py)` \(([^)]*)\)", DOC)
    assert rows
    for module, names in rows:
        source = (ROOT / module).read_text()
        for name in re.findall(r"`(\w+)`", names):
            assert re.search(rf"^\s*(def|class) {name}\b|^{name} = ", source, re.M), f"{name} not in {module}"
