"""Clean-close claims: what a store's local files equal, left at a clean close.

A store closed cleanly can tell its next open "my files equal this" (the rocksdb engine:
the changelog prefix its live database equals; the file changelog: the state of its
active segment), so the open skips a rebuild or a scan. Every such claim follows one
rule, here: it is written atomically and durably (fsync) at close, while the writer still
holds its lock, so an opener sees it whole or not at all; the next open **takes** it — reads
it and durably removes it before anything can write — so a crash, a write or any other
open in between leaves no claim behind; and a claim that cannot be read, removed or parsed
is never used (the store takes its slow, exact path).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .locking import atomic_write, fsync_dir

__all__ = ["ClaimDamaged", "leave_claim", "take_claim"]


class ClaimDamaged(ValueError):
    """A claim file that does not parse or has a field of the wrong type (already removed)."""


def leave_claim(path: Path, claim: Mapping[str, Any]) -> None:
    """Write ``claim`` (JSON values) to ``path`` atomically and durably; ``OSError`` on
    failure (the caller logs it: a missing claim only costs the next open its slow path)."""
    atomic_write(path, json.dumps(dict(claim), sort_keys=True).encode())


def take_claim(path: Path, fields: Mapping[str, tuple[type, ...]]) -> dict[str, Any] | None:
    """The claim at ``path``, removed durably now; None when there is none.

    ``fields`` gives each field's allowed types (an ``int`` must be >= 0; ``type(None)``
    allows null). Raises ``OSError`` when the claim cannot be read or removed (a claim
    left on disk could outlive this open: the caller must not rely on it, or must stop)
    and :class:`ClaimDamaged` when it does not parse (it was removed)."""
    for leftover in path.parent.glob(f"{path.name}.*.tmp"):  # a close that died before its rename
        leftover.unlink(missing_ok=True)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    path.unlink()
    fsync_dir(path.parent)
    try:
        data = json.loads(raw)
        claim = {name: data[name] for name in fields}
    except (ValueError, KeyError, TypeError) as e:
        raise ClaimDamaged(f"{path} is damaged ({e}): {raw[:80]!r}") from e
    for name, allowed in fields.items():
        value = claim[name]
        if type(value) not in allowed or (type(value) is int and value < 0):
            raise ClaimDamaged(f"{path}: field {name!r} is {value!r}")
    return claim
