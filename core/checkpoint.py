"""The task checkpoint: the one record that makes a commit count."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptionError

__all__ = ["Checkpoint"]

_FORMAT = 1


@dataclass(frozen=True)
class Checkpoint:
    """``{version, input_position, changelog end offset per store}`` of one task.

    ``version`` counts commits (or is the Spark batch id); ``input_position`` is any
    JSON value telling where the task's input resumes; ``offsets[store]`` is the
    changelog offset ``C`` the store's committed state covers; ``epoch`` identifies the
    task instance that wrote it (fencing of zombie writers); ``stores[store]`` records
    how the store was configured when committed (``factory``, ``key.serde``,
    ``msg.serde``), so a change between deploys is detected instead of misread.

    A checkpoint with ``version < 0`` is a *genesis* record: the task (or a store of it)
    exists but has not committed yet. It is written before the first change-record is,
    so a changelog with data and no checkpoint naming it can only be damage.
    """

    version: int
    input_position: Any
    offsets: Mapping[str, int]
    epoch: int = 0
    written_at: float = field(default_factory=time.time)
    stores: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    event_time: int | None = None
    """The task's event-time clock (its watermark, ms) at this commit; ``None`` if never advanced."""

    @property
    def committed(self) -> bool:
        """False for a genesis record (no commit yet)."""
        return self.version >= 0

    def to_bytes(self) -> bytes:
        extra = {} if self.event_time is None else {"event_time": self.event_time}
        body = json.dumps(
            {
                **extra,
                "format": _FORMAT,
                "version": self.version,
                "input_position": self.input_position,
                "offsets": dict(self.offsets),
                "epoch": self.epoch,
                "written_at": self.written_at,
                "stores": {k: dict(v) for k, v in self.stores.items()},
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return b"%08x\n" % zlib.crc32(body) + body

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "checkpoint") -> Checkpoint:
        """Parse and verify; raises :class:`CorruptionError` naming ``where``."""
        try:
            crc, body = data[:8], data[9:]
            if data[8:9] != b"\n" or int(crc, 16) != zlib.crc32(body):
                raise ValueError("checksum mismatch")
            d = json.loads(body)
            if d.get("format") != _FORMAT:
                raise ValueError(f"unknown format {d.get('format')!r}")
            return cls(
                version=int(d["version"]),
                input_position=d["input_position"],
                offsets={str(k): int(v) for k, v in d["offsets"].items()},
                epoch=int(d.get("epoch", 0)),
                written_at=float(d.get("written_at", 0.0)),
                stores={str(k): {str(a): str(b) for a, b in v.items()} for k, v in d.get("stores", {}).items()},
                event_time=None if d.get("event_time") is None else int(d["event_time"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(f"{where} is corrupt ({e}); {len(data)} bytes") from e
