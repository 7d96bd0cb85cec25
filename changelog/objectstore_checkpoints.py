"""Task checkpoints of the objectstore changelog: create-only objects with increasing
sequence numbers under ``_checkpoints/<job>/partition-<p>/`` (``If-None-Match``), so
two attempts of one task can never both commit one version — a zombie is fenced."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from localstate.checkpoint import Checkpoint
from localstate.errors import (
    ChangelogError,
    CorruptionError,
    FencedError,
    LocalStateError,
)
from localstate.faults import fault_point

from .base import CheckpointStore
from .objectstore_client import EXISTS, MISSING

if TYPE_CHECKING:
    from .objectstore import ObjectStoreChangelogSystem

__all__ = ["ObjectStoreCheckpointStore"]

log = logging.getLogger("localstate.changelog.objectstore")

_CKPT_MAGIC = b"LSCKPT1\n"
_CLAIM_MAGIC = b"LSCLAIM1\n"
_TOKEN_LEN = 32


class ObjectStoreCheckpointStore(CheckpointStore):
    """Task checkpoints as create-only objects with increasing sequence numbers.

    :meth:`read` (for a task that will write) also claims the next number, which fences
    every older instance of the task: their next checkpoint create finds it taken.
    """

    def __init__(self, system: ObjectStoreChangelogSystem) -> None:
        self.system = system
        self.store = system.store
        self._token = uuid.uuid4().hex.encode()
        self._next: dict[tuple[str, int], int] = {}
        self._claimed: dict[tuple[str, int], int] = {}
        # per task: sequence numbers known to exist -> is it a checkpoint (False: a claim)
        self._known: dict[tuple[str, int], dict[int, bool | None]] = {}
        self._lock = threading.Lock()

    def prefix(self, job: str, partition: int) -> str:
        """Where the task's checkpoints and claims live (relative to the system's URL); in a
        rescaled job's generation ``n``, under ``<job>.gen<n>``."""
        if job == self.system.job:
            job = self.system.generation().job(job)
        return f"_checkpoints/{job}/partition-{partition}"

    def _list(self, job: str, partition: int) -> list[int]:
        prefix = self.prefix(job, partition)
        seqs = []
        for name, _ in self.store.list(prefix):
            if not name.isdigit():
                raise CorruptionError(f"unexpected object {self.store.where(prefix + '/' + name)} among the "
                                      "task checkpoints; nothing was changed. Move it away")
            seqs.append(int(name))
        return sorted(seqs)

    def _load(self, job: str, partition: int, seq: int) -> Checkpoint | None:
        """The checkpoint numbered ``seq``; None for a claim."""
        key = f"{self.prefix(job, partition)}/{seq:020d}"
        data = self.store.get(key)
        where = f"checkpoint {self.store.where(key)}"
        if data.startswith(_CLAIM_MAGIC):
            return None
        if not data.startswith(_CKPT_MAGIC) or len(data) < len(_CKPT_MAGIC) + _TOKEN_LEN + 1:
            raise CorruptionError(f"{where} is corrupt (not a localstate checkpoint object); {len(data)} bytes")
        return Checkpoint.from_bytes(data[len(_CKPT_MAGIC) + _TOKEN_LEN + 1:], where=where)

    def _recent(self, job: str, partition: int, want: int) -> tuple[list[int], list[tuple[int, Checkpoint]]]:
        """All sequence numbers, and the newest ``want`` checkpoints (claims skipped)."""
        for _ in range(3):
            seqs = self._list(job, partition)
            found: list[tuple[int, Checkpoint]] = []
            try:
                for seq in reversed(seqs):
                    ckpt = self._load(job, partition, seq)
                    if ckpt is not None:
                        found.append((seq, ckpt))
                        if len(found) == want:
                            break
                return seqs, found
            except MISSING:
                continue  # deleted by the writer's clean-up between the list and the get
            except CorruptionError as e:
                raise CorruptionError(
                    f"{e}. Nothing was changed. Restore the object from a backup or a bucket version; or go "
                    "back one commit with `localstate restore --use-previous-checkpoint`; or decide each "
                    "store's state with `localstate restore --accept-log-end STORE` or `--reset STORE`"
                ) from e
        raise ChangelogError(f"checkpoints under {self.store.where(self.prefix(job, partition))}/ kept "
                             "changing while being read; is another instance of the task running?")

    def read(self, job: str, partition: int, *, fence: bool = True) -> Checkpoint | None:
        """The latest checkpoint; with ``fence`` (a task that will write) also claim the next
        sequence number, so older instances can no longer commit."""
        with self._lock:
            while True:
                seqs, found = self._recent(job, partition, 1)
                if not fence or self._claim_after(job, partition, seqs, found):
                    return found[0][1] if found else None

    def claim(self, job: str, partition: int) -> int:
        """This instance's claim in the task's checkpoint sequence (made now if :meth:`read`
        did not): the writer epoch of the task's changelog objects."""
        task = (job, partition)
        with self._lock:
            while task not in self._claimed:
                self._claim_after(job, partition, self._list(job, partition), [])
            return self._claimed[task]

    def claim_above(self, job: str, partition: int, floor: int, *, why: str) -> int:
        """A new claim numbered ``floor`` or more, for a writer that found objects of epoch
        ``floor - 1`` (named by ``why``). :class:`FencedError` if a newer instance of the
        task claimed after this one: then those objects are its."""
        task = (job, partition)
        with self._lock:
            mine = self._claimed.get(task, -1)
            while True:
                seqs = self._list(job, partition)
                if seqs and seqs[-1] > mine >= 0:
                    raise FencedError(
                        f"{why} was written after this instance of task {job}/partition {partition} opened: a "
                        "newer instance took over (claim "
                        f"{self.store.where(self.prefix(job, partition))}/{seqs[-1]:020d}), so this one must "
                        "stop without committing. Nothing was changed"
                    )
                log.warning("%s: writer epoch %d is not older than this instance's claim %d: the task's "
                            "checkpoints were deleted, or another job writes this stream; claiming above it",
                            why, floor - 1, mine)
                if self._claim_after(job, partition, seqs, [], at_least=floor):
                    return self._claimed[task]

    def _claim_after(self, job: str, partition: int, seqs: list[int], found: list[tuple[int, Checkpoint]],
                     *, at_least: int = 0) -> bool:
        """Create a claim after the newest number in ``seqs`` (and at ``at_least`` or more);
        False if another instance took that number meanwhile (the caller reads again)."""
        n = max((seqs[-1] if seqs else -1) + 1, at_least)
        try:
            self.store.put(f"{self.prefix(job, partition)}/{n:020d}", _CLAIM_MAGIC + self._token, create=True)
        except EXISTS:
            return False
        known: dict[int, bool | None] = dict.fromkeys(seqs)
        known.update({seq: True for seq, _ in found})
        known[n] = False
        self._known[(job, partition)] = known
        self._next[(job, partition)] = n + 1
        self._claimed[(job, partition)] = n
        return True

    def previous(self, job: str, partition: int) -> Checkpoint | None:
        _, found = self._recent(job, partition, 2)
        return found[1][1] if len(found) == 2 else None

    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        """Create the next checkpoint object; :class:`FencedError` if a newer instance of the
        task took the number (the commit did not happen)."""
        task = (job, partition)
        prefix = self.prefix(job, partition)
        with self._lock:
            if task not in self._next:
                # a writer that never read (no fencing claim): append after what exists
                seqs = self._list(job, partition)
                self._next[task] = (seqs[-1] if seqs else -1) + 1
                self._known[task] = dict.fromkeys(seqs)
            seq = self._next[task]
            key = f"{prefix}/{seq:020d}"
            body = _CKPT_MAGIC + self._token + b"\n" + checkpoint.to_bytes()
            fault_point("checkpoint.before_rename")
            try:
                self.store.put(key, body, create=True)
            except EXISTS as e:
                try:
                    mine = self.store.get(key) == body  # our create, retried after a lost answer
                except MISSING:
                    mine = False
                if not mine:
                    raise FencedError(
                        f"checkpoint {self.store.where(key)} of task {job}/partition {partition} was already "
                        "written by a newer instance of the same task: this instance was fenced and must stop "
                        "without committing (its changes are discarded when the newer one restores)"
                    ) from e
            fault_point("checkpoint.after_rename")
            self._next[task] = seq + 1
            self._known.setdefault(task, {})[seq] = True
            self._clean(job, partition, seq)

    def _clean(self, job: str, partition: int, latest: int) -> None:
        """Delete the numbers below the previous checkpoint (best effort: what is left is
        only garbage). Kinds not known yet are read once."""
        known = self._known[(job, partition)]
        previous = None
        for seq in sorted((s for s in known if s < latest), reverse=True):
            if known[seq] is None:
                try:
                    known[seq] = self._load(job, partition, seq) is not None
                except (*MISSING, LocalStateError):
                    continue
            if known[seq]:
                previous = seq
                break
        if previous is None:
            return
        doomed = [s for s in known if s < previous]
        prefix = self.prefix(job, partition)
        try:
            self.store.delete([f"{prefix}/{s:020d}" for s in doomed])
        except ChangelogError as e:
            log.warning("old checkpoints under %s/ not deleted (%s)", self.store.where(prefix), e)
            return
        for s in doomed:
            del known[s]
