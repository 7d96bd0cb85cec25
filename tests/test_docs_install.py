"""The install commands of README.md and docs/ work as written, and a type checker sees
localstate's types after either install.

localstate is not on a public index, so every ``pip install`` the docs show must be one
that works from a checkout today — the editable install (README's two commands) or the
wheel built from the checkout — or be marked "once published" in its own line
(``test_every_install_command_works_today_or_says_once_published``).

``test_documented_installs_type_check`` runs those commands as a new user would: in a
copy of the checkout (only the files git tracks: a fresh clone), the README's editable
install into a fresh virtualenv, then the documented wheel build and the documented
wheel install into a second one; after each, mypy and pyright check a typed example
against exactly that virtualenv (``--python-executable`` / ``--pythonpath``: the
checkers are the suite's own, the package is the fresh install's). Only the extras
change: none, as the example needs none (CI's first step runs the README's
``.[all,dev]`` literally, its third installs the wheel with extras). Packages come
from pip's cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"localstate-{VERSION}-py3-none-any.whl"

EDITABLE = re.compile(r"\.venv/bin/pip install -q -e '\.\[[\w<>,]+\]' --config-settings editable_mode=strict")
BUILD = ".venv/bin/pip install -q build && .venv/bin/python -m build"
WHEEL_INSTALL = re.compile(r"pip install '/path/to/localstate/dist/(?P<wheel>localstate-[^']+\.whl)(?:\[[\w<>,]+\])?'")
SCAFFOLD = "cd localstate-mine && pip install -e '.[test]'"
"""A generated engine project installed into the virtualenv that already has localstate."""

TYPED_EXAMPLE = '''\
from typing import assert_type

from localstate import Config, KeyValueStore, TaskStorage

config = Config.from_dict({"job.name": "typed", "stores.counts.factory": "memory",
                           "stores.counts.key.serde": "string", "stores.counts.msg.serde": "json"})
with TaskStorage(config, partition=0) as storage:
    counts = storage.store("counts", str, int)
    assert_type(counts, KeyValueStore[str, int])
    assert_type(counts.get("/home", 0), int)
    counts["/home"] = counts.get("/home", 0) + 1
    storage.commit(input_position=1)
'''
"""What a type checker must see: with ``localstate`` unresolved every name is ``Any``
and each ``assert_type`` fails."""


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _install_lines() -> list[tuple[str, str]]:
    """(where, line) for every line of README.md and docs/ that runs ``pip install``."""
    out = []
    for page in _pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if "pip install" in line:
                out.append((f"{page.relative_to(ROOT)}:{i + 1}", line))
    return out


def test_every_install_command_works_today_or_says_once_published() -> None:
    lines = _install_lines()
    assert len(lines) >= 5
    wrong = []
    for where, line in lines:
        if "once published" in line.lower():
            continue  # the index form, kept for the day the package is published
        for match in re.finditer(r"pip install[^`\n]*", line):
            command = match.group(0)
            wheel = WHEEL_INSTALL.search(command)
            if wheel and wheel.group("wheel") != WHEEL:
                wrong.append(f"{where}: names {wheel.group('wheel')}, but the build writes {WHEEL}")
            elif not (wheel or EDITABLE.search(line) or BUILD in line or SCAFFOLD in line):
                wrong.append(f"{where}: {command.strip()}")
    assert not wrong, (
        "install commands that do not work as documented today (localstate is not on a public index, "
        "and type checkers see only a strict editable install): use the checkout or wheel forms of "
        "docs/getting-started.md, or mark the line 'once published':\n"
        + "\n".join(wrong))


SUITE_COMMAND_END = "pytest -q -n 2 --dist loadfile"
"""How the README's test command (the one .ci/run runs) ends."""


def _readme_install() -> str:
    """The install part of the README's two commands (they must agree)."""
    readme = (ROOT / "README.md").read_text()
    commands = {line.strip().rsplit(" && ", 1)[0] for line in readme.splitlines()
                if line.startswith("    python3 -m venv .venv") and line.rstrip().endswith(("localstate demo", SUITE_COMMAND_END))}
    assert len(commands) == 1, f"the README's two commands install differently: {commands}"
    return commands.pop()


def _documented_build() -> str:
    for page in (ROOT / "docs" / "getting-started.md", ROOT / "README.md"):
        lines = [line.strip() for line in page.read_text().splitlines() if BUILD in line]
        assert lines, f"{page.name} shows no wheel build ({BUILD})"
    return lines[0]


def _documented_wheel_install() -> str:
    text = (ROOT / "docs" / "getting-started.md").read_text()
    found = [line.strip() for line in text.splitlines() if WHEEL_INSTALL.search(line)]
    assert found, "docs/getting-started.md shows no wheel install"
    return found[0]


def _copy_checkout(into: Path) -> Path:
    """The files git tracks, as a fresh clone has them (no .venv, build/ or caches)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        files = [f for f in listed.stdout.decode().split("\0") if f]
    else:  # a source archive: everything but what builds and runs leave behind
        skip = {".venv", "build", "dist", ".git", ".pytest_cache", ".ruff_cache", ".hypothesis", "site",
                ".api-packages", "__pycache__"}
        files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)]
    for name in files:
        source = ROOT / name
        if source.is_file():  # a file deleted in the working tree but not yet in git
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def _sh(command: str, cwd: Path, timeout: int = 600) -> float:
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")})
    assert result.returncode == 0, f"`{command}` failed in {cwd}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return time.monotonic() - started


def _type_check(example: Path, python: Path, install: str) -> None:
    """mypy and pyright on the example, with ``localstate`` from ``python``'s environment."""
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(python), "--python-version", "3.11",
         "--no-error-summary", "--cache-dir", str(example.parent / ".mypy_cache"), str(example)],
        capture_output=True, text=True, timeout=600)
    assert mypy.returncode == 0, f"mypy after the {install}:\n{mypy.stdout}{mypy.stderr}"
    pyright = subprocess.run(
        [str(Path(sys.executable).with_name("pyright")), "--pythonpath", str(python), "--pythonversion", "3.11",
         str(example)],
        capture_output=True, text=True, timeout=600, cwd=example.parent)
    assert pyright.returncode == 0, f"pyright after the {install}:\n{pyright.stdout}{pyright.stderr}"


def test_documented_installs_type_check(tmp_path: Path) -> None:
    checkers = {"mypy": shutil.which("mypy", path=str(Path(sys.executable).parent)),
                "pyright": shutil.which("pyright", path=str(Path(sys.executable).parent))}
    missing = sorted(name for name, found in checkers.items() if found is None)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} not installed: the dev extra brings them (.ci/run installs it)")
        pytest.skip(f"{missing} not installed (the dev extra brings them)")
    example = tmp_path / "example" / "typed_example.py"
    example.parent.mkdir()
    example.write_text(TYPED_EXAMPLE)
    checkout = _copy_checkout(tmp_path / "localstate")

    editable = _readme_install()
    assert "'.[all,dev]'" in editable, editable
    took = {"editable install": _sh(editable.replace("'.[all,dev]'", "'.'"), checkout)}
    _type_check(example, checkout / ".venv" / "bin" / "python", "README's editable install")

    took["wheel build"] = _sh(_documented_build(), checkout)
    assert (checkout / "dist" / WHEEL).is_file(), sorted(p.name for p in (checkout / "dist").iterdir())
    project = tmp_path / "project"
    project.mkdir()
    wheel_install = _documented_wheel_install().replace("/path/to/localstate", str(checkout))
    wheel_install = re.sub(r"\.whl\[[\w,]+\]'", ".whl'", wheel_install)  # no extras: the example needs none
    took["wheel install"] = _sh(f"python3 -m venv .venv && .venv/bin/{wheel_install}", project)
    _type_check(example, project / ".venv" / "bin" / "python", "documented wheel install")
    print("seconds:", {k: round(v, 1) for k, v in took.items()})
