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

_PROPERTIES_LINE = re.compile(r"^(\s*job\.partitions\s*[=:\s]\s*)(\S+)", re.M)
_TOML_TABLE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
_TOML_ROOT_KEY = re.compile(r'^(\s*(?:"job\.partitions"|job\s*\.\s*partitions)\s*=\s*)([^\s#]+)')
_TOML_JOB_KEY = re.compile(r'^(\s*(?:partitions|"partitions")\s*=\s*)([^\s#]+)')


def _toml_edit(text: str, to: int) -> tuple[str, str]:
    """``text`` with ``job.partitions = to`` (the line that sets it, in the root table or
    in ``[job]``; else a new line under ``[job]``, or at the top) and the edit, in words."""
    lines = text.splitlines(keepends=True)
    table, job_header = "", None
    for i, line in enumerate(lines):
        header = _TOML_TABLE.match(line)
        if header:
            table = header.group(1).replace('"', "").replace(" ", "")
            if table == "job":
                job_header = i
            continue
        key = _TOML_ROOT_KEY if table == "" else _TOML_JOB_KEY if table == "job" else None
        m = key.match(line) if key is not None else None
        if m:
            lines[i] = m.group(1) + str(to) + line[m.end():]
            return "".join(lines), f"line {i + 1}: {lines[i].strip()}"
    if job_header is not None:
        lines.insert(job_header + 1, f"partitions = {to}\n")
        return "".join(lines), f"line {job_header + 2} (under [job]): partitions = {to}"
    return f"job.partitions = {to}\n" + text, f"line 1: job.partitions = {to}"


def update_config_file(path: str | Path, to: int) -> str:
    """Set ``job.partitions = to`` in the config file at ``path`` (TOML or properties),
    atomically, and only if the file then loads to the same config with the new count;
    returns the edit in words. Otherwise raise :class:`ConfigError` naming the exact
    line to write (the file is unchanged)."""
    from localstate.locking import atomic_write

    p = Path(path)
    before = Config.load(p)
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".toml":
        new_text, edit = _toml_edit(text, to)
        by_hand = f"partitions = {to} in its [job] table (or job.partitions = {to} before any table)"
    else:
        new_text, n = _PROPERTIES_LINE.subn(lambda m: m.group(1) + str(to), text)
        edit = f"job.partitions = {to}"
        if n == 0:
            new_text = text + ("" if text.endswith("\n") or not text else "\n") + f"{edit}\n"
        by_hand = edit
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
            f"write {by_hand} in {p} by hand"
        )
    atomic_write(p, new_text.encode("utf-8"))
    return edit
