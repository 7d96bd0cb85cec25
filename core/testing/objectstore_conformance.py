"""The damage hooks of the changelog conformance kit
(:class:`~localstate.testing.changelog_conformance.ChangelogSystemConformance`) for the
``objectstore`` changelog on any backend."""

from __future__ import annotations

import random
from typing import Any

from localstate.storage import TaskStorage

from .changelog_kit import records

__all__ = ["ObjectStoreConformanceHooks"]


class ObjectStoreConformanceHooks:
    """The damage hooks of :class:`ChangelogSystemConformance` for the ``objectstore``
    changelog on any backend (S3, GCS, Azure, ``file://``, HDFS): mix it in before the kit,
    ``class TestMine(ObjectStoreConformanceHooks, ChangelogSystemConformance)``. The
    system is the one ``job.changelog.system`` names in the job's values."""

    @staticmethod
    def objectstore_of(values: dict[str, Any]) -> Any:
        from localstate.changelog.objectstore import ObjectStoreChangelogSystem

        name = values["job.changelog.system"]
        pre = f"systems.{name}."
        options = {k[len(pre):]: v for k, v in values.items() if k.startswith(pre) and k != f"{pre}type"}
        return ObjectStoreChangelogSystem(name, options, values["job.name"])

    def lose_newest_checkpoint(self, values: dict[str, Any]) -> None:
        """The newest object under the task's checkpoint prefix deleted."""
        system = self.objectstore_of(values)
        try:
            prefix = system.checkpoints().prefix(values["job.name"], 0)
            newest = max(n for n, _ in system.store.list(prefix))
            system.store.delete([f"{prefix}/{newest}"])
        finally:
            system.close()

    def zombie_late_writes(self, zombie: TaskStorage, values: dict[str, Any]) -> None:
        """The zombie's uploads that no check can stop on a store without an atomic
        check-and-write: one more object past its end, and a roll-up of everything it
        wrote into one object under its epoch, with its small objects deleted."""
        from localstate.changelog.objectstore import ObjectName

        part: Any = zombie.changelog("kv")
        part.append(records(0, 3, b"zombie"))
        part.flush()
        mine = sorted(o for o in (ObjectName.parse(n) for n, _ in part.store.list(part.log_prefix))
                      if o is not None and o.epoch == part.epoch)
        data = b"".join(part.store.get(f"{part.log_prefix}/{o.name}") for o in mine)
        part.store.put(f"{part.log_prefix}/{ObjectName(0, mine[-1].end, part.epoch).name}", data)
        part.store.delete([f"{part.log_prefix}/{o.name}" for o in mine])

    def storage_snapshot(self, values: dict[str, Any]) -> Any:
        """Every object of the job's changelog stream and checkpoints, with its bytes."""
        system = self.objectstore_of(values)
        try:
            store = system.store
            prefixes = [f"{values['job.name']}-kv", f"_checkpoints/{values['job.name']}"]
            return sorted((f"{p}/{n}", store.get(f"{p}/{n}")) for p in prefixes for n, _ in store.list(p))
        finally:
            system.close()

    def lose_stream(self, values: dict[str, Any], stream: str) -> None:
        self._delete_objects(values, stream)

    def damage_shipped_snapshots(self, values: dict[str, Any]) -> int:
        """Every snapshot file object of the job's stream overwritten with garbage."""
        system = self.objectstore_of(values)
        try:
            client, stream = system.store, values["stores.kv.changelog"].split(".", 1)[1]
            keys = [f"{stream}/{n}" for n, _ in client.list(stream) if "/sst/" in n]
            for key in keys:
                client.put(key, random.Random(key).randbytes(len(client.get(key))))
            return len(keys)
        finally:
            system.close()

    def lose_everything(self, values: dict[str, Any]) -> None:
        self._delete_objects(values, "")

    def _delete_objects(self, values: dict[str, Any], prefix: str) -> None:
        """Delete every object under ``prefix`` ("" for everything) of the job's store."""
        system = self.objectstore_of(values)
        try:
            client = system.store
            dirs, files = client.children("") if not prefix else ([prefix], [])
            client.delete([name for name, _ in files] + [f"{d}/{n}" for d in dirs for n, _ in client.list(d)])
            assert not any(client.list(d) for d in dirs)
        finally:
            system.close()
