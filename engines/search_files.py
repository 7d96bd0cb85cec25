"""The files of one ``search`` store beside its tantivy index, and the one translator of
tantivy and file-system errors into localstate errors.

Layout under the store directory::

    index/                    the tantivy index (its meta.json carries the commit opstamp)
    search-schema.txt         the schema the index was built with (canonical field specs)
    search-checkpoint.json    {version, offset, opstamp, num_docs, schema}: the changelog
                              offset the index covers, written after the tantivy commit

The side file is written atomically *after* the tantivy commit (the Python binding has
no commit payload to carry the offset). :meth:`SearchFiles.reusable_from` is the rule for
reusing the index at restore, replaying only ``[L, C)``: the side file is readable, its
opstamp equals the one in tantivy's ``meta.json`` (merges keep it; any later tantivy
commit bumps it), its document count matches, and ``min_valid <= L <= C``; the engine
also requires the schema file to equal the configured schema.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localstate.errors import CorruptionError, EngineError, LocalStateError, StoreLockedError
from localstate.faults import fault_point
from localstate.locking import fsync_dir, io_error

__all__ = ["SearchFiles"]

log = logging.getLogger("localstate")

_CHECKPOINT_FILE = "search-checkpoint.json"
_INDEX_DIR = "index"
_SCHEMA_FILE = "search-schema.txt"
_CHECKPOINT_VERSION = 1


class SearchFiles:
    """The index directory, schema file and checkpoint side file of store ``store``."""

    def __init__(self, directory: Path, store: str, schema_text: str) -> None:
        self.directory = directory
        self.store = store
        self.schema_text = schema_text
        self.index_dir = directory / _INDEX_DIR
        self.checkpoint_path = directory / _CHECKPOINT_FILE
        self.schema_path = directory / _SCHEMA_FILE

    # -- schema -------------------------------------------------------------------------------
    def built_with(self) -> str:
        """The schema the existing index was built with (a description if unknown)."""
        try:
            return self.schema_path.read_text().strip()
        except OSError:
            return f"(unknown: {_SCHEMA_FILE} is missing)"

    def write_schema(self) -> None:
        """Record the schema the (new, empty) index is built with, durably."""
        tmp = self.schema_path.with_name(_SCHEMA_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(self.schema_text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.schema_path)

    # -- tantivy's meta.json ------------------------------------------------------------------
    def meta_opstamp(self) -> int:
        """The opstamp of the index's last tantivy commit; CorruptionError if unreadable."""
        path = self.index_dir / "meta.json"
        try:
            return int(json.loads(path.read_bytes())["opstamp"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"store {self.store!r}: cannot read the opstamp of {path}: {e}") from e

    def meta_segments(self) -> int:
        """How many segments the index has (-1 if meta.json is unreadable)."""
        try:
            return len(json.loads((self.index_dir / "meta.json").read_bytes())["segments"])
        except (OSError, ValueError, KeyError):
            return -1

    # -- the checkpoint side file -------------------------------------------------------------
    def read_checkpoint(self) -> dict[str, Any] | None:
        """The side file, None if absent, or ``{"problem": ...}`` if unreadable."""
        try:
            data = json.loads(self.checkpoint_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("store %r: unreadable %s (%s); the index will be rebuilt", self.store, self.checkpoint_path, e)
            return {"problem": str(e), "schema": self.schema_text}
        return data if isinstance(data, dict) else {"problem": "not an object", "schema": self.schema_text}

    def write_checkpoint(self, offset: int, opstamp: int, num_docs: int) -> None:
        """Atomically record that the index at ``opstamp`` equals changelog ``[0, offset)``."""
        fault_point("snapshot.mid")
        data = {"version": _CHECKPOINT_VERSION, "offset": offset, "opstamp": opstamp, "num_docs": num_docs,
                "schema": self.schema_text}
        tmp = self.checkpoint_path.with_name(_CHECKPOINT_FILE + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(json.dumps(data).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.checkpoint_path)
            fsync_dir(self.directory)
        except OSError as e:
            raise self.translate(e, f"write {self.checkpoint_path.name}") from e

    def reusable_from(self, committed_offset: int, min_valid_offset: int, opstamp: int,
                      num_docs: Callable[[], int]) -> tuple[int, str | None]:
        """``(L, None)`` if the index may be kept and ``[L, C)`` replayed, else ``(L or -1,
        why not)``: the side file must be readable, of a known version, name the index's
        current opstamp and document count, and cover ``min_valid <= L <= C``."""
        saved = self.read_checkpoint()
        if saved is None:
            return -1, "it has no search-checkpoint.json (never committed)" if opstamp else None
        if "problem" in saved:
            return -1, f"{self.checkpoint_path} is unreadable ({saved['problem']})"
        if saved.get("version") != _CHECKPOINT_VERSION:
            return -1, f"{self.checkpoint_path} has unknown version {saved.get('version')!r}"
        offset = int(saved.get("offset", -1))
        if saved.get("opstamp") != opstamp:
            return offset, (
                f"its tantivy commit (opstamp {opstamp}) is not the one checkpointed at changelog "
                f"offset {offset} (opstamp {saved.get('opstamp')}): it holds writes that were never committed"
            )
        if not min_valid_offset <= offset <= committed_offset:
            return offset, f"it covers changelog offset {offset}, outside [{min_valid_offset}, {committed_offset}]"
        try:
            n = num_docs()
        except (ValueError, OSError) as e:
            return offset, f"it cannot be read ({e})"
        if n != saved.get("num_docs"):
            return offset, f"it has {n} documents where the checkpoint says {saved.get('num_docs')}"
        return offset, None

    # -- wiping -------------------------------------------------------------------------------
    def refuse_if_another_writer(self) -> None:
        """Raise StoreLockedError if another writer holds the index (tantivy's lock is a flock)."""
        lock = self.index_dir / ".tantivy-writer.lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            return  # no lock file: no writer
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(
                f"store {self.store!r}: the index at {self.index_dir} has a writer in this or another process; "
                "it was not wiped. Close the other engine/TaskStorage first"
            ) from None
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Delete the checkpoint side file and the index, leaving an empty index directory."""
        if self.checkpoint_path.exists():
            self.checkpoint_path.unlink()
        shutil.rmtree(self.index_dir, ignore_errors=True)
        self.index_dir.mkdir(parents=True, exist_ok=True)

    # -- errors -------------------------------------------------------------------------------
    def translate(self, e: BaseException, action: str) -> LocalStateError:
        """The one place tantivy and file-system errors become localstate errors."""
        if isinstance(e, LocalStateError):
            return e
        if "LockBusy" in str(e):
            return StoreLockedError(
                f"store {self.store!r}: the index at {self.index_dir} already has a writer (tantivy LockBusy) "
                "in this or another process; close the other engine/TaskStorage first"
            )
        if isinstance(e, OSError):
            return io_error(e, action + " in", self.index_dir, EngineError)
        return EngineError(
            f"store {self.store!r}: tantivy failed to {action} on the index at {self.index_dir}: {e}. If it is "
            "damaged, close the task, delete that directory and reopen: it is rebuilt from the changelog"
        )
