"""``FileLock`` records its holder's pid and state (``"<pid> active"`` / ``"<pid> parked"``, one
fixed-length record), rewriting the file only when it changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from localstate import StoreLockedError
from localstate.locking import FileLock


def test_a_longer_stale_holder_line_is_replaced_by_exactly_this_pid(tmp_path: Path) -> None:
    path = tmp_path / "task.lock"
    path.write_bytes(b"4294967295\ntrailing junk from an older writer\n")
    lock = FileLock(path, "task 0")
    try:
        assert path.read_bytes() == f"{os.getpid()} active\n".encode()
    finally:
        lock.release()


def test_the_same_holder_does_not_rewrite_the_file(tmp_path: Path) -> None:
    path = tmp_path / "task.lock"
    FileLock(path, "task 0").release()
    before = path.stat()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))  # a rewrite would move it
    stamped = path.stat().st_mtime_ns
    FileLock(path, "task 0").release()
    assert path.stat().st_mtime_ns == stamped
    assert path.read_bytes() == f"{os.getpid()} active\n".encode()


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    path = tmp_path / "task.lock"
    code = (f"import sys, time; from localstate.locking import FileLock; FileLock(__import__('pathlib').Path({str(path)!r}), 'x'); "
            "print('held', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockedError, match=rf"task 7 is locked by pid {proc.pid} "):
            FileLock(path, "task 7")
        assert path.read_bytes() == f"{proc.pid} active\n".encode()  # the refused open wrote nothing
    finally:
        proc.kill()
        proc.wait()
    FileLock(path, "task 7").release()
    assert path.read_bytes() == f"{os.getpid()} active\n".encode()
