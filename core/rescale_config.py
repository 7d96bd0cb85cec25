"""``localstate rescale`` setting ``job.partitions`` in the job's config file (TOML or
properties) once the state is rescaled: edited in place only where the edit provably
loads to the same config with the new count."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .config import Config
from .errors import ConfigError

__all__ = ["update_config_file"]

_PARTITIONS_LINE = {
    ".toml": re.compile(r'^(\s*(?:"?job\.partitions"?|job\s*\.\s*partitions|partitions)\s*=\s*)(\S+)', re.M),
    ".properties": re.compile(r"^(\s*job\.partitions\s*[=:\s]\s*)(\S+)", re.M),
}


def update_config_file(path: str | Path, to: int) -> None:
    """Set ``job.partitions = to`` in the config file at ``path`` (TOML or properties),
    atomically, and only if the file then loads to the same config with the new count;
    otherwise raise :class:`ConfigError` asking for the edit by hand (the file is unchanged)."""
    from localstate.locking import atomic_write

    p = Path(path)
    before = Config.load(p)
    text = p.read_text(encoding="utf-8")
    kind = ".toml" if p.suffix == ".toml" else ".properties"
    new_text, n = _PARTITIONS_LINE[kind].subn(lambda m: m.group(1) + str(to), text)
    if n == 0:
        line = f"job.partitions = {to}\n"
        new_text = line + text if kind == ".toml" else text + ("" if text.endswith("\n") or not text else "\n") + line
    tmp = p.with_name(f".{p.stem}.rescale-check{p.suffix}")
    try:
        tmp.write_text(new_text, encoding="utf-8")
        try:
            after = Config.load(tmp)
        except ConfigError:
            after = None
    finally:
        tmp.unlink(missing_ok=True)

    def rest(c: Config) -> dict[str, Any]:
        return {k: str(v) for k, v in c.to_dict().items() if k != "job.partitions"}

    if after is None or after.partitions != to or rest(after) != rest(before):
        raise ConfigError(
            f"could not set job.partitions = {to} in {p} safely (its layout is unusual); the state is rescaled: "
            f"edit the file by hand to job.partitions = {to}"
        )
    atomic_write(p, new_text.encode("utf-8"))
