"""Task checkpoints of the objectstore changelog: create-only objects with increasing
sequence numbers under ``_checkpoints/<job>/partition-<p>/`` (``If-None-Match``), so
two attempts of one task can never both commit one version — a zombie is fenced.

Each checkpoint names the sequence number of the checkpoint it follows, which the writer
keeps until a newer checkpoint is written. So a newest checkpoint that is gone (deleted by
hand, lost with a bucket version) shows: the newest one left names a predecessor that no
longer exists. Reading it is then an error, never a silent step back one commit (which
would also delete the lost commit's records as an uncommitted tail)."""

from __future__ import annotations

import logging
import threading
import time
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

from ..base import CheckpointStore
from .client import EXISTS, MISSING

if TYPE_CHECKING:
    from .system import ObjectStoreChangelogSystem

__all__ = ["ObjectStoreCheckpointStore"]

log = logging.getLogger("localstate.changelog.objectstore")

_CKPT_MAGIC = b"LSCKPT1\n"  # magic, writer token, "\n", checkpoint
_CKPT2_MAGIC = b"LSCKPT2\n"  # magic, writer token, " ", predecessor's number or "-" * 20, "\n", checkpoint
_CLAIM_MAGIC = b"LSCLAIM1\n"
_TOKEN_LEN = 32
_NO_PREVIOUS = b"-" * 20
_READ_ATTEMPTS = 10  # lists of the checkpoints while a writer's clean-up races the reads


def _encode(token: bytes, previous: int | None, checkpoint: Checkpoint) -> bytes:
    prev = _NO_PREVIOUS if previous is None else b"%020d" % previous
    return _CKPT2_MAGIC + token + b" " + prev + b"\n" + checkpoint.to_bytes()


def _decode(data: bytes, where: str) -> tuple[Checkpoint, int | None]:
    """A checkpoint object's checkpoint and its predecessor's number (None: not recorded)."""
    if data.startswith(_CKPT2_MAGIC):
        head = len(_CKPT2_MAGIC) + _TOKEN_LEN
        prev = data[head + 1:head + 21]
        if len(data) > head + 22 and data[head:head + 1] == b" " and data[head + 21:head + 22] == b"\n" and (
                prev == _NO_PREVIOUS or prev.isdigit()):
            ckpt = Checkpoint.from_bytes(data[head + 22:], where=where)
            return ckpt, None if prev == _NO_PREVIOUS else int(prev)
    elif data.startswith(_CKPT_MAGIC) and len(data) >= len(_CKPT_MAGIC) + _TOKEN_LEN + 1:
        return Checkpoint.from_bytes(data[len(_CKPT_MAGIC) + _TOKEN_LEN + 1:], where=where), None
    raise CorruptionError(f"{where} is corrupt (not a localstate checkpoint object); {len(data)} bytes")


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
        # per task: the newest checkpoint's number this instance knows of (its next one's predecessor)
        self._latest: dict[tuple[str, int], int | None] = {}
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

    def _load(self, job: str, partition: int, seq: int) -> tuple[Checkpoint, int | None] | None:
        """The checkpoint numbered ``seq`` and its predecessor's number; None for a claim."""
        key = f"{self.prefix(job, partition)}/{seq:020d}"
        data = self.store.get(key)
        if data.startswith(_CLAIM_MAGIC):
            return None
        return _decode(data, f"checkpoint {self.store.where(key)}")

    def _recent(self, job: str, partition: int, want: int
                ) -> tuple[list[int], list[tuple[int, Checkpoint]], str | None]:
        """All sequence numbers, the newest ``want`` checkpoints (claims skipped), and
        whether a newer checkpoint than those was lost (a message naming the keys), see
        the module docstring."""
        lost: str | None = None
        for attempt in range(_READ_ATTEMPTS):
            if attempt:
                time.sleep(0.01 * attempt)  # a writer committing meanwhile: let it finish
            seqs = self._list(job, partition)
            found: list[tuple[int, Checkpoint]] = []
            try:
                lost = None
                for seq in reversed(seqs):
                    entry = self._load(job, partition, seq)
                    if entry is not None:
                        ckpt, previous = entry
                        if not found and previous is not None and previous not in seqs:
                            lost = self._lost_message(job, partition, seq, ckpt, previous, seqs)
                        found.append((seq, ckpt))
                        if len(found) == want:
                            break
                if lost is not None:
                    continue  # listed again: a commit landing between the list and the reads
                return seqs, found, None
            except MISSING:
                continue  # deleted by the writer's clean-up between the list and the get
            except CorruptionError as e:
                raise CorruptionError(
                    f"{e}. Nothing was changed. Restore the object from a backup or a bucket version; or go "
                    "back one commit with `localstate restore --use-previous-checkpoint`; or decide each "
                    "store's state with `localstate restore --accept-log-end STORE` or `--reset STORE`"
                ) from e
        if lost is not None:
            return seqs, found, lost
        newer = self.newer_claim(job, partition)
        if newer is not None:  # this instance was fenced: that is the error to report
            raise FencedError(f"checkpoints under {self.store.where(self.prefix(job, partition))}/ keep changing: a "
                              f"newer instance of task {job}/partition {partition} took over (claim {newer}), so "
                              "this one must stop without committing")
        raise ChangelogError(f"checkpoints under {self.store.where(self.prefix(job, partition))}/ kept "
                             "changing while being read; is another instance of the task running?")

    def _lost_message(self, job: str, partition: int, seq: int, ckpt: Checkpoint, previous: int,
                      seqs: list[int]) -> str:
        prefix = self.prefix(job, partition)
        later = [s for s in seqs if s > seq]
        claims = f" (objects after it: {', '.join(f'{s:020d}' for s in later)}, claims only)" if later else ""
        return (
            f"the newest checkpoint of task {job}/partition {partition} is missing: the newest one left, "
            f"{self.store.where(f'{prefix}/{seq:020d}')} (version {ckpt.version}), follows checkpoint "
            f"{previous:020d}, which is gone — a writer deletes it only after writing a newer checkpoint, so a "
            f"newer checkpoint existed and was deleted or lost{claims}. Nothing was changed (the lost commit's "
            "changelog records are kept). Restore the deleted object under "
            f"{self.store.where(prefix)}/ from a backup or a bucket version; or go back to version "
            f"{ckpt.version} with `localstate restore --use-previous-checkpoint` (the lost commit is undone and "
            "its input processed again); or decide each store's state with `localstate restore --accept-log-end "
            "STORE` (keep every record the changelog holds) or `--reset STORE`"
        )

    def read_readonly(self, job: str, partition: int) -> Checkpoint | None:
        return self.read(job, partition, fence=False)

    def read(self, job: str, partition: int, *, fence: bool = True) -> Checkpoint | None:
        """The latest checkpoint; with ``fence`` (a task that will write) also claim the next
        sequence number, so older instances can no longer commit. A lost newest checkpoint
        is a :class:`CorruptionError` (see the module docstring)."""
        with self._lock:
            while True:
                seqs, found, lost = self._recent(job, partition, 1)
                if lost is not None:
                    raise CorruptionError(lost)
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
        self._latest[(job, partition)] = found[0][0] if found else None
        self._next[(job, partition)] = n + 1
        self._claimed[(job, partition)] = n
        return True

    def previous(self, job: str, partition: int) -> Checkpoint | None:
        """The checkpoint the latest one replaced; when the latest was lost, the newest one
        left (going back to it is the explicit recovery the error offers)."""
        _, found, lost = self._recent(job, partition, 2)
        if lost is not None:
            return found[0][1]
        return found[1][1] if len(found) == 2 else None

    def newer_claim(self, job: str, partition: int) -> str | None:
        """The key of a claim or checkpoint numbered after this instance's own (one LIST):
        a newer instance of the task took over. None if there is none, or this instance
        never claimed (it is no writer of the task)."""
        mine = self._next.get((job, partition))
        if mine is None:
            return None
        newer = [s for s in self._list(job, partition) if s >= mine]
        return self.store.where(f"{self.prefix(job, partition)}/{newer[-1]:020d}") if newer else None

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
            previous = self._latest.get(task)
            if previous is None:
                # not read at the claim: the newest checkpoint known to exist, if any
                previous = max((s for s, kind in self._known[task].items() if kind), default=None)
            body = _encode(self._token, previous, checkpoint)
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
            self._latest[task] = seq
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
