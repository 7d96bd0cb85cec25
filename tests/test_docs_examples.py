"""Every Python example in README.md and docs/**/*.md runs in CI, so an example can never
drift from the API (a reader copies it literally).

Each ```python block runs as a fresh process in an empty directory, and then once more
in the same directory, as a reader who runs it again would: a block that writes
``./state`` and asserts on what it finds there, or creates a folder that exists the
second time, fails. A block that leaves files in the directory it runs in must say so
in its first line (a comment naming the "current directory"); the others work in a
fresh directory of their own (``tempfile.mkdtemp()``). A block preceded by
``<!-- example: fragment ... -->`` (it needs a broker or names the reader's own code)
is compiled instead; fragments are kept few on purpose.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(?P<marker><!-- example: fragment[^>]*-->\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks() -> list:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text[: m.start("code")].count("\n")
            code = m.group("code")
            marks = [pytest.mark.spark] if "spark_session" in code and not m.group("marker") else []
            if "ApacheKafkaBroker" in code and not m.group("marker"):
                marks.append(pytest.mark.kafka)  # starts a throwaway Apache Kafka node
            out.append(pytest.param(doc.name, line, code, bool(m.group("marker")), marks=marks,
                                    id=f"{doc.relative_to(ROOT)}:{line}"))
    return out


BLOCKS = _blocks()


def test_the_readme_and_docs_have_examples():
    assert len(BLOCKS) >= 8
    assert sum(1 for b in BLOCKS if b.values[3]) <= 2, "fragments must stay the exception"


@pytest.mark.parametrize(("doc", "line", "code", "fragment"), BLOCKS)
def test_example_runs_twice(doc: str, line: int, code: str, fragment: bool, tmp_path: Path) -> None:
    if fragment:
        compile(code, f"{doc}:{line}", "exec")
        return
    for attempt in ("first", "second"):
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, (
            f"{doc}:{line} failed on its {attempt} run in the same directory:\n{result.stderr[-3000:]}")
    left = sorted(p.name for p in tmp_path.iterdir())
    first = code.lstrip().splitlines()[0]
    assert not left or (first.startswith("#") and "current directory" in first), (
        f"{doc}:{line} leaves {left} in the directory it runs in without saying so: give it a fresh "
        "directory of its own (tempfile.mkdtemp()), or say so in its first line "
        "('# ... in the current directory')")
