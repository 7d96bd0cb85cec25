"""The protocol reads from its declared interfaces: core never probes a plug-in.

Every hook core calls on an engine, engine factory, changelog system, changelog
partition or checkpoint store is declared (with a default where it is optional) on
``StorageEngine``, ``StorageEngineFactory``, ``ChangelogSystem``, ``ChangelogPartition``
or ``CheckpointStore``. So core asks ``system.stream_exists(...)``, never
``getattr(system, "topic_exists", None)``, and a new plug-in learns the whole contract
from the abstract classes.
"""

from __future__ import annotations

import re
from pathlib import Path

from localstate.changelog.base import ChangelogPartition, ChangelogSystem, CheckpointStore
from localstate.engine import StorageEngine, StorageEngineFactory

ROOT = Path(__file__).resolve().parent.parent
PROBE = re.compile(r"\b(getattr|hasattr)\((.+?),\s*[\"'](\w+)[\"']")
INTERFACES = (StorageEngine, StorageEngineFactory, ChangelogSystem, ChangelogPartition, CheckpointStore)
# Names a probe may use although an interface has them too: generic Python attributes.
GENERIC = {"name", "__name__", "__module__", "__qualname__", "__abstractmethods__", "close"}


def _hook_names() -> set[str]:
    names: set[str] = set()
    for cls in INTERFACES:
        names |= {n for n in dir(cls) if not n.startswith("__")}
        names |= set(getattr(cls, "__annotations__", {}))
    return names - GENERIC


def _core_files() -> list[Path]:
    core = ROOT / "core"
    return sorted(p for p in core.rglob("*.py") if "testing" not in p.relative_to(core).parts)


def test_core_calls_plug_in_hooks_only_through_their_declaration() -> None:
    hooks = _hook_names()
    assert {"stream_exists", "read_readonly", "append_columns", "ensure_snapshot", "rescale_layout",
            "drop_generation", "upload_snapshot", "fetch_snapshot"} <= hooks
    probes = []
    for path in _core_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in PROBE.finditer(line):
                if match.group(3) in hooks:
                    probes.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not probes, "core probes plug-ins for hooks; declare them on the interface instead:\n" + "\n".join(probes)


def test_the_probe_pattern_finds_a_probe() -> None:
    line = 'exists = getattr(system, "topic_exists", None)'
    assert [m.group(3) for m in PROBE.finditer(line)] == ["topic_exists"]
    assert [m.group(3) for m in PROBE.finditer('hasattr(part, "append_columns")')] == ["append_columns"]


def test_core_imports_no_concrete_changelog_system() -> None:
    """Each changelog system owns its layout, rescale strategy and inspection; core reaches
    them through the declared hooks (``rescale_strategy``, ``inspect_partition``,
    ``inspect_location``, ``count_records``) or the registry (which names the built-ins
    as strings, imported on first use), so a new system is additive."""
    concrete = re.compile(r"^\s*(from|import) (localstate\.changelog|\.\.changelog)\.(file|kafka|objectstore|format|snapshots)\b"
                          r"|isinstance\(.*\b(File|Kafka|ObjectStore)Changelog(System|Partition)\b")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _core_files()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if concrete.search(line)]
    assert not found, "core names a concrete changelog system:\n" + "\n".join(found)
