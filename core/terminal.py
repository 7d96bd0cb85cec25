"""Terminal output shared by the commands: a console sized for logs, and a quiet fd 2
while a live progress display runs.

Two things break a rich spinner or progress bar: text printed through rich markup
(``pip install 'localstate[rocksdb]'`` loses ``[rocksdb]`` as a style tag, so every
user string goes through :func:`rich.markup.escape`), and writes to file descriptor 2
that bypass Python: the JVM behind PySpark and librdkafka's threads write there
directly, between the display's redraws. :func:`quiet_stderr` parks those writes in a
temporary file while a display runs and shows them only if the command fails.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["make_console", "quiet_stderr", "STDERR_TAIL_LINES"]

STDERR_TAIL_LINES = 60
"""Lines of the parked stderr shown when a command fails (the end holds the cause)."""


def make_console() -> Any:
    """A rich console; at least 120 columns wide when output is not a terminal (logs, CI)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 120))


@contextmanager
def quiet_stderr(enabled: bool = True, what: str = "output", *, show_after: bool = False) -> Iterator[Path | None]:
    """Send file descriptor 2 to a temporary file for the duration of the block.

    Child processes started inside the block (Spark's JVM) inherit the file, so their
    later writes stay out of the terminal too. If the block raises, the last
    :data:`STDERR_TAIL_LINES` lines are copied to the real stderr under a header naming
    ``what``; on success they are dropped, unless ``show_after`` (the lines are worth
    reading, e.g. a restore's warnings: shown once the display has stopped).
    ``enabled=False`` (output is not a terminal, so nothing is redrawn and the lines
    belong in the log) changes nothing.
    """
    if not enabled:
        yield None
        return
    sys.stderr.flush()
    fd, name = tempfile.mkstemp(prefix="localstate-stderr-", suffix=".log")
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    failed = False
    try:
        yield Path(name)
    except BaseException:
        failed = True
        raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        try:
            lines = Path(name).read_text(errors="replace").splitlines()
        finally:
            os.unlink(name)
        if (failed or show_after) and any(line.strip() for line in lines):
            tail = lines[-STDERR_TAIL_LINES:]
            skipped = f" (last {len(tail)} of {len(lines)} lines)" if len(tail) < len(lines) else ""
            sys.stderr.write(f"--- {what} written to stderr while the progress display ran{skipped} ---\n")
            sys.stderr.write("\n".join(tail) + "\n---\n")
            sys.stderr.flush()
