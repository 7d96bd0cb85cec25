"""``localstate inspect`` of an objectstore changelog: what a bucket prefix holds.

Read-only, like the file changelog's inspection (never claims, writes or deletes, so it
is safe beside live tasks): the latest checkpoint of every task of every job, every
stream's partitions (objects on the chain, garbage objects, end offset, records, bytes,
snapshot horizon) and every rescaled job's current generation. Rows have the shape
:func:`localstate.inspect.inspect_path` gives for a directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from localstate.errors import LocalStateError

from ..base import UNREADABLE, Generation
from .system import ObjectStoreChangelogPartition, ObjectStoreChangelogSystem

__all__ = ["inspect_objectstore"]


def inspect_objectstore(name: str, options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``{"checkpoints", "partitions", "stores", "generations"}`` of the objectstore
    system ``name`` with ``options`` (its ``systems.<name>.*`` keys, ``path`` a URL).
    Raises :class:`~localstate.errors.ConfigError` for bad options and
    :class:`~localstate.errors.ChangelogError` (naming the URL) if the store cannot be listed."""
    system = ObjectStoreChangelogSystem(name, options, job="")
    system.pin_generation(Generation())  # physical names as they are in the bucket
    store = system.store
    report: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "partitions": [], "stores": [], "generations": []}
    horizons: dict[str, list[int]] = {}  # physical stream of a current generation -> its horizons
    try:
        top, _ = store.children("")
        for job in sorted(store.children("_generations")[0]) if "_generations" in top else ():
            numbers = sorted(n for n, _ in store.list(f"_generations/{job}") if n.isdigit())
            if numbers:
                key = f"_generations/{job}/{numbers[-1]}"
                row: dict[str, Any] = {"job": job, "key": store.where(key)}
                try:
                    g = Generation.from_bytes(store.get(key), store.where(key))
                    row.update(generation=g.number, partitions=g.partitions, previous_partitions=g.previous_partitions,
                               checkpoints_of=g.job(job))
                    horizons.update({g.stream(s): list(h) for s, h in g.horizons.items()})
                except LocalStateError as e:
                    row["error"] = str(e)
                report["generations"].append(row)
        checkpoints = system.checkpoints()
        for job in sorted(store.children("_checkpoints")[0]) if "_checkpoints" in top else ():
            tasks = [t for t in store.children(f"_checkpoints/{job}")[0] if t.startswith("partition-")]
            for task in sorted(tasks, key=lambda t: int(t.split("-")[1]) if t.split("-")[1].isdigit() else -1):
                p = int(task.split("-")[1])
                row = {"job": job, "partition": p, "path": store.where(checkpoints.prefix(job, p)), "root": store.url}
                try:
                    c = checkpoints.read(job, p, fence=False)
                    if c is None:
                        row["error"] = "only claims, no checkpoint yet"
                    else:
                        row.update(version=c.version, input_position=c.input_position, offsets=dict(c.offsets),
                                   epoch=c.epoch, written_at=c.written_at)
                except LocalStateError as e:
                    row["error"] = str(e)
                report["checkpoints"].append(row)
        for stream in sorted(t for t in top if not t.startswith("_")):
            _, files = store.children(stream)
            if not any(f == "stream.json" for f, _ in files):
                continue
            try:
                partitions = int(json.loads(store.get(f"{stream}/stream.json"))["partitions"])
            except (LocalStateError, ValueError, KeyError, TypeError) as e:
                report["partitions"].append({"stream": stream, "partition": "?", "root": store.url,
                                             "path": store.where(f"{stream}/stream.json"), "error": f"corrupt: {e}",
                                             **UNREADABLE})
                continue
            for p in range(partitions):
                row = _partition_row(system, stream, p)
                rescaled = horizons.get(stream, [])
                if p < len(rescaled) and isinstance(row["tombstone_horizon"], int):
                    row["tombstone_horizon"] = max(row["tombstone_horizon"], rescaled[p])
                report["partitions"].append(row)
    finally:
        system.close()
    return report


def _partition_row(system: ObjectStoreChangelogSystem, stream: str, p: int) -> dict[str, Any]:
    row: dict[str, Any] = {"stream": stream, "partition": p, "root": system.store.url,
                           "path": system.store.where(f"{stream}/{p}"), "locked_by": None}
    try:
        part = ObjectStoreChangelogPartition(system, stream, p, readonly=True)
        try:
            v = part.verify()
            row.update(segments=v["objects"], garbage_objects=v["garbage_objects"], end_offset=v["end_offset"],
                       records=v["records"], bytes=v["bytes"], tombstone_horizon=part.min_valid_snapshot_offset())
            if v["problems"]:
                row["error"] = "; ".join(v["problems"])
        finally:
            part.close()
    except LocalStateError as e:
        row.update(UNREADABLE, error=str(e))
    return row
