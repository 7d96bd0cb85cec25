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
    task instance that wrote it (fencing of zombie writers).
    """

    version: int
    input_position: Any
    offsets: Mapping[str, int]
    epoch: int = 0
    written_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        body = json.dumps(
            {
                "format": _FORMAT,
                "version": self.version,
                "input_position": self.input_position,
                "offsets": dict(self.offsets),
                "epoch": self.epoch,
                "written_at": self.written_at,
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
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(f"{where} is corrupt ({e}); {len(data)} bytes") from e
