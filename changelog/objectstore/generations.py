"""A rescaled job's generations in an object store: ``_generations/<job>/<n:010d>`` records
the job's current generation (create-only: the commit point of a rescale) and
``<n:010d>.writing`` reserves a number for one rescale (:class:`~localstate.changelog.base.Generation`)."""

from __future__ import annotations

import logging
import re

from localstate.errors import ChangelogError, CorruptionError, LocalStateError

from ..base import Generation
from .client import EXISTS, ObjectStoreClient

__all__ = ["ObjectStoreGenerations"]

log = logging.getLogger("localstate.changelog.objectstore")

_GENERATION_NAME = re.compile(r"^\d{10}$")
_GENERATION_CLAIM = re.compile(r"^\d{10}\.writing$")


class ObjectStoreGenerations:
    """The generations of job ``job`` in ``store``; the current one is listed once, when
    first needed, and kept until :meth:`pin` or :meth:`write` replace it."""

    def __init__(self, store: ObjectStoreClient, job: str) -> None:
        self.store = store
        self.job = job
        self.prefix = f"_generations/{job}"
        self._current: Generation | None = None

    def current(self) -> Generation:
        """The job's current generation: the highest ``_generations/<job>/<n>`` (one LIST
        when first needed; 0 when there is none)."""
        if self._current is None:
            names = [n for n, _ in self.store.list(self.prefix)]
            numbers = sorted(n for n in names if _GENERATION_NAME.match(n))
            if not numbers:
                current = Generation()
            else:
                key = f"{self.prefix}/{numbers[-1]}"
                current = Generation.from_bytes(self.store.get(key), self.store.where(key))
            started = [int(n[:10]) for n in names if _GENERATION_CLAIM.match(n)]
            if started and max(started) > current.number:
                self._check_record_not_lost(current, max(started))
            self._current = current
        return self._current

    def _check_record_not_lost(self, current: Generation, started: int) -> None:
        """A rescale to generation ``started`` claimed its number but no record of it is
        left. A rescale that crashed before its record leaves the current generation whole;
        one whose record was deleted afterwards left the current generation's checkpoints
        deleted (a finished rescale drops them) and its own written: then falling back to
        ``current`` would open every task empty — an error instead."""
        mine, theirs = (f"_checkpoints/{g.job(self.job)}" for g in (current, Generation(started)))
        if self.store.list(mine) or not self.store.list(theirs):
            return
        key = f"{self.prefix}/{started:010d}"
        raise CorruptionError(
            f"the generation record {self.store.where(key)} of job {self.job!r} is missing: a rescale to "
            f"generation {started} finished (its checkpoints are under {self.store.where(theirs)}/) and the "
            f"generation before it has no checkpoints left, so the job's state would open empty. Nothing was "
            "changed. Restore the record from a backup or a bucket version"
        )

    def _prefixes(self, generation: Generation, streams: list[str]) -> list[str]:
        return [generation.stream(s) for s in streams] + [f"_checkpoints/{generation.job(self.job)}"]

    def drop(self, generation: Generation, streams: list[str]) -> None:
        """Delete ``generation``'s streams and checkpoints; best effort (what is left is garbage)."""
        prefixes = self._prefixes(generation, streams)
        try:
            for prefix in prefixes:
                keys = [f"{prefix}/{name}" for name, _ in self.store.list(prefix)]
                for i in range(0, len(keys), 1000):
                    self.store.delete(keys[i:i + 1000])
        except LocalStateError as e:
            log.warning("job %r: the old generation's objects under %s were not all deleted (%s); they are garbage",
                        self.job, ", ".join(self.store.where(p) for p in prefixes), e)

    def pin(self, generation: Generation) -> None:
        """Take ``generation`` as the current one from here on."""
        self._current = generation

    def used(self, generation: Generation, streams: list[str]) -> bool:
        """Whether anything of ``generation`` exists already (a crashed earlier attempt)."""
        return any(self.store.list(p) for p in self._prefixes(generation, streams))

    def claim(self, number: int) -> bool:
        """Reserve generation ``number`` for one rescale (create-only ``<n>.writing``): False
        if another rescale (running, or crashed) took it, so two never write one prefix."""
        try:
            self.store.put(f"{self.prefix}/{number:010d}.writing", b"", create=True)
        except EXISTS:
            return False
        return True

    def write(self, generation: Generation) -> None:
        """Record ``generation`` as the job's current one (create-only): the commit point of
        a rescale. :class:`ChangelogError` if another rescale recorded that number first."""
        key = f"{self.prefix}/{generation.number:010d}"
        try:
            self.store.put(key, generation.to_bytes(), create=True)
        except EXISTS as e:
            raise ChangelogError(f"{self.store.where(key)} exists: another rescale of job {self.job!r} "
                                 "committed first; nothing of this one counts") from e
        self._current = generation
