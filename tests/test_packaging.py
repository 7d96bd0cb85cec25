"""The wheel contains every module of the source tree (an unlisted subpackage is silently dropped)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"core": "localstate", "engines": "localstate/engines", "changelog": "localstate/changelog",
           "contrib": "localstate/contrib", "benchmarks": "localstate/benchmarks"}


def expected_modules() -> set[str]:
    out = set()
    for src, dest in MAPPING.items():
        for f in (ROOT / src).rglob("*.py"):
            rel = f.relative_to(ROOT / src)
            if "__pycache__" in rel.parts:
                continue
            out.add(f"{dest}/{rel.as_posix()}")
    return out


def test_wheel_contains_every_module(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("localstate-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_modules() - names)
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {missing}"
    assert any(n.endswith("entry_points.txt") for n in names)
    assert "localstate/py.typed" in names, "type checkers read the package only with its py.typed marker"
