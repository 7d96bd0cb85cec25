"""Use cases 2–4: table-table, stream-table and stream-stream joins.

* :class:`ProfileSettingsJoin` — profiles ⋈ settings by user id. Both inputs are
  tables (changelogs of rows keyed by user id); the task keeps both sides and the
  joined row per user in stores. The ``joined`` store's changelog **is** the join's
  output stream: every change of a joined row is a change record there (a tombstone
  when a side disappears), which is what a downstream consumer reads.
* :class:`PageViewEnrich` — a stream-table join: every page view is enriched with the
  viewer's ZIP code from the profile stream (a left join: no profile → null ZIP).
* :class:`AdClickJoin` — a stream-stream join of ad clicks with impressions by
  impression id within :data:`JOIN_WINDOW_S`; both sides are buffered in stores and
  unmatched entries expire through event-time timers fired at each commit boundary.

Each class documents its input columns; ``input_table(workload)`` builds that input
from a :class:`~localstate.contrib.spark.workload.Workload`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from localstate.timers import EVENT_TIME, Timers

from .runner import Emitter, StreamTask, TaskContext
from .workload import Workload

__all__ = ["ProfileSettingsJoin", "PageViewEnrich", "AdClickJoin", "JOIN_WINDOW_S"]

JOIN_WINDOW_S = 600
"""A click joins an impression when ``0 <= click.ts - impression.ts <= JOIN_WINDOW_S``."""


def _sorted_by_ts(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("ts", "ascending")]))


# -- 2. table-table join --------------------------------------------------------------------------
class ProfileSettingsJoin(StreamTask):
    """Profiles ⋈ settings by ``user_id`` (inner join of two tables).

    Input: ``table`` ("profile" or "settings"), ``user_id``, ``ts`` and the columns of
    both tables (``name zip city deleted`` / ``language theme notifications``); keyed by
    ``user_id``. Each side is last-writer-wins **by ``ts``**, so the result does not
    depend on the order Spark delivers rows in. A profile row with ``deleted`` removes
    the user: the joined row is deleted (a tombstone in the ``joined`` changelog).

    Output rows, one per change of a joined row: ``op`` ("upsert"/"delete"), ``user_id``,
    ``name``, ``zip``, ``city``, ``language``, ``theme``, ``notifications``, ``ts`` (the
    later of the two sides).
    """

    NAME = "profile-settings-join"
    KEY = "user_id"
    OUTPUT_SCHEMA = (
        "op string, user_id string, name string, zip string, city string, "
        "language string, theme string, notifications boolean, ts long"
    )
    STORES: dict[str, dict[str, Any]] = {
        name: {"factory": "kv", "key.serde": "string", "msg.serde": "msgpack",
               "object.cache.size": 20_000, "write.batch.size": 5_000}
        for name in ("profiles", "settings", "joined")
    }
    _PROFILE = ("name", "zip", "city")
    _SETTINGS = ("language", "theme", "notifications")
    _DELETED_ROW: dict[str, Any] = {"op": "delete", **dict.fromkeys(_PROFILE + _SETTINGS)}

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        profiles = workload.profiles.drop_columns(["bio"]).append_column(
            "table", pa.array(["profile"] * workload.profiles.num_rows, pa.string()))
        settings = workload.settings.append_column(
            "table", pa.array(["settings"] * workload.settings.num_rows, pa.string()))
        return _sorted_by_ts(pa.concat_tables([profiles, settings], promote_options="default"))

    def init(self, context: TaskContext) -> None:
        self.profiles = context.store("profiles")
        self.settings = context.store("settings")
        self.joined = context.store("joined")

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        # Collapse the batch to the newest row per (side, user) first: one store read and
        # one write per touched user, however many updates the batch holds.
        newest: dict[str, dict[str, dict[str, Any]]] = {"profile": {}, "settings": {}}
        for row in batch.to_pylist():
            side = newest[row["table"]]
            old = side.get(row["user_id"])
            if old is None or row["ts"] >= old["ts"]:
                side[row["user_id"]] = row
        users = list(newest["profile"].keys() | newest["settings"].keys())
        state = {"profile": self.profiles.get_all(users), "settings": self.settings.get_all(users)}
        for side_name, store, fields in (
            ("profile", self.profiles, self._PROFILE + ("deleted",)),
            ("settings", self.settings, self._SETTINGS),
        ):
            current = state[side_name]
            updates = []
            for user, row in newest[side_name].items():
                old = current.get(user)
                if old is None or row["ts"] >= old["ts"]:
                    value = {f: row[f] for f in fields}
                    value["ts"] = row["ts"]
                    current[user] = value
                    updates.append((user, value))
            store.put_all(updates)
        joined_before = self.joined.get_all(users)
        puts, deletes, out = [], [], []
        for user in users:
            p, s = state["profile"].get(user), state["settings"].get(user)
            if p is not None and s is not None and not p.get("deleted"):
                value = {f: p[f] for f in self._PROFILE}
                value.update({f: s[f] for f in self._SETTINGS})
                value["ts"] = max(p["ts"], s["ts"])
                if joined_before.get(user) != value:
                    puts.append((user, value))
                    out.append({"op": "upsert", "user_id": user, **value})
            elif user in joined_before:
                deletes.append(user)
                out.append({**self._DELETED_ROW, "user_id": user, "ts": p["ts"] if p else None})
        self.joined.put_all(puts)
        self.joined.delete_all(deletes)
        emit.rows(out)


# -- 3. stream-table join -------------------------------------------------------------------------
class PageViewEnrich(StreamTask):
    """Page views enriched with the viewer's ZIP code (stream ⋈ table, left join).

    Input: ``kind`` ("profile" or "view"), ``user_id``, ``ts``, ``zip``, ``deleted``
    (profiles), ``page`` (views); keyed by ``user_id``. Rows are processed in arrival
    order, each Arrow batch in ``ts`` order: a view gets the ZIP of the newest profile
    row processed before it. Vectorised: within a batch the "latest profile before this
    view" is a forward fill over the rows grouped by user; only distinct users touch the
    store.

    Output rows: ``ts``, ``user_id``, ``page``, ``zip`` (null when the user has no
    profile, e.g. a deleted account).
    """

    NAME = "pageview-zip-enrich"
    KEY = "user_id"
    OUTPUT_SCHEMA = "ts long, user_id string, page string, zip string"
    STORES: dict[str, dict[str, Any]] = {
        "zips": {"factory": "kv", "key.serde": "string", "msg.serde": "string",
                 "object.cache.size": 50_000, "write.batch.size": 10_000},
    }

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        p = workload.profiles
        profiles = pa.table({
            "kind": pa.array(["profile"] * p.num_rows, pa.string()),
            "user_id": p["user_id"], "ts": p["ts"], "zip": p["zip"], "deleted": p["deleted"],
        })
        v = workload.page_views
        views = pa.table({
            "kind": pa.array(["view"] * v.num_rows, pa.string()),
            "user_id": v["user_id"], "ts": v["ts"], "page": v["page"],
        })
        return _sorted_by_ts(pa.concat_tables([profiles, views], promote_options="default"))

    def init(self, context: TaskContext) -> None:
        self.zips = context.store("zips")

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        n = batch.num_rows
        if n == 0:
            return
        batch = batch.take(pc.sort_indices(batch, [("ts", "ascending")]))
        is_profile = pc.equal(batch.column("kind"), "profile").to_numpy(zero_copy_only=False)
        encoded = pc.dictionary_encode(batch.column("user_id"))
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        users = encoded.dictionary.to_pylist()
        # Row order within each user: stable sort by user code keeps the ts order.
        order = np.argsort(codes, kind="stable")
        codes_s = codes[order]
        positions = np.arange(n)
        group_start = np.maximum.accumulate(np.where(np.r_[True, codes_s[1:] != codes_s[:-1]], positions, 0))
        last_profile = np.maximum.accumulate(np.where(is_profile[order], positions, -1))
        has_profile = last_profile >= group_start

        profile_zip = batch.column("zip")
        deleted = batch.column("deleted").fill_null(False)
        profile_zip = pc.if_else(deleted, pa.scalar(None, pa.string()), profile_zip)
        zip_sorted = profile_zip.take(pa.array(order))
        stored = self.zips.get_all(users)
        stored_zip = pa.array([stored.get(u) for u in users], pa.string())
        from_batch = zip_sorted.take(pa.array(np.where(has_profile, last_profile, 0)))
        from_store = stored_zip.take(pa.array(codes_s))
        zip_for_sorted = pc.if_else(pa.array(has_profile), from_batch, from_store)
        # Back to ts order for the output.
        inverse = np.empty(n, np.int64)
        inverse[order] = positions
        zip_per_row = zip_for_sorted.take(pa.array(inverse))

        views = pa.array(~is_profile)
        if not is_profile.all():
            emit.arrow(pa.RecordBatch.from_arrays(
                [batch.column("ts").filter(views), batch.column("user_id").filter(views),
                 batch.column("page").filter(views), zip_per_row.filter(views)],
                names=["ts", "user_id", "page", "zip"],
            ))
        if is_profile.any():
            # The newest profile row per user decides the stored ZIP.
            last_in_group = np.r_[codes_s[1:] != codes_s[:-1], True]
            ends = np.flatnonzero(last_in_group & has_profile)
            new_zip = zip_sorted.take(pa.array(last_profile[ends])).to_pylist()
            changed_users = [users[c] for c in codes_s[ends]]
            self.zips.put_all([(u, z) for u, z in zip(changed_users, new_zip) if z is not None])
            self.zips.delete_all([u for u, z in zip(changed_users, new_zip) if z is None])


# -- 4. stream-stream join --------------------------------------------------------------------------
class AdClickJoin(StreamTask):
    """Ad clicks ⋈ impressions by ``impression_id`` within :data:`JOIN_WINDOW_S`.

    Input: ``kind`` ("impression" or "click"), ``impression_id``, ``ts``, ``user_id``,
    ``ad_id``, ``page`` (impressions); keyed by ``impression_id``. Either side may come
    first; the one that waits is kept in a store (``impressions`` / ``clicks``) with an
    event-time timer (:class:`~localstate.timers.Timers` on the ``expiry`` store) at its
    ``ts``, keyed by side + impression id. The first click within the window matches
    (and deletes the waiting side's timer); later duplicates are dropped.

    At each window/commit boundary the timers below ``watermark - JOIN_WINDOW_S`` fire
    (one range scan, in timestamp order): an unmatched impression is emitted with
    ``clicked = false`` (so the output is complete for click-through rates), a waiting
    click is dropped. The task fires them itself in :meth:`window` rather than through
    ``on_timer`` after every input batch, so a late click still matches within the run,
    as a join over the whole batch would.

    Output rows: ``impression_id``, ``user_id``, ``ad_id``, ``page``,
    ``impression_ts``, ``click_ts`` (null if not clicked), ``clicked``.
    """

    NAME = "ad-click-join"
    KEY = "impression_id"
    OUTPUT_SCHEMA = (
        "impression_id string, user_id string, ad_id string, page string, "
        "impression_ts long, click_ts long, clicked boolean"
    )
    STORES: dict[str, dict[str, Any]] = {
        "impressions": {"factory": "kv", "key.serde": "string", "msg.serde": "msgpack",
                        "object.cache.size": 0, "write.batch.size": 5_000},
        "clicks": {"factory": "kv", "key.serde": "string", "msg.serde": "long", "object.cache.size": 0},
        "expiry": {"factory": "kv", "object.cache.size": 0, "write.batch.size": 5_000},  # timers
        "clock": {"factory": "kv", "key.serde": "string", "msg.serde": "long"},
    }
    _IMPRESSION, _CLICK = "i", "c"

    dropped_clicks = 0
    """Clicks that could not match (too late, duplicate, or expired) in this attempt."""

    @staticmethod
    def input_table(workload: Workload) -> pa.Table:
        i, c = workload.impressions, workload.clicks
        imps = i.append_column("kind", pa.array(["impression"] * i.num_rows, pa.string()))
        clicks = c.append_column("kind", pa.array(["click"] * c.num_rows, pa.string()))
        return _sorted_by_ts(pa.concat_tables([imps, clicks], promote_options="default"))

    def init(self, context: TaskContext) -> None:
        self.impressions = context.store("impressions")
        self.clicks = context.store("clicks")
        self.clock = context.store("clock")
        self.watermark: int = self.clock.get("watermark") or 0
        self.expiry = Timers(context.store("expiry"), EVENT_TIME, lambda: self.watermark)
        self.dropped_clicks = 0

    @staticmethod
    def _match(imp_id: str, imp: list[Any], click_ts: int | None) -> dict[str, Any]:
        ts, user, ad, page = imp
        return {
            "impression_id": imp_id, "user_id": user, "ad_id": ad, "page": page,
            "impression_ts": ts, "click_ts": click_ts, "clicked": click_ts is not None,
        }

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.take(pc.sort_indices(batch, [("ts", "ascending")]))
        cols = {name: batch.column(name).to_pylist()
                for name in ("kind", "impression_id", "ts", "user_id", "ad_id", "page")}
        ids = list(set(cols["impression_id"]))
        imps = self.impressions.get_all(ids)
        clicks = self.clicks.get_all(ids)
        dirty_imps: set[str] = set()
        dirty_clicks: set[str] = set()
        expiry_put: list[tuple[str, int]] = []  # (side + impression id, ts) timers
        expiry_del: list[tuple[str, int]] = []
        out: list[dict[str, Any]] = []
        window = JOIN_WINDOW_S
        for kind, imp_id, ts, user, ad, page in zip(
            cols["kind"], cols["impression_id"], cols["ts"], cols["user_id"], cols["ad_id"], cols["page"]
        ):
            if kind == "impression":
                click_ts = clicks.get(imp_id)
                if click_ts is not None and 0 <= click_ts - ts <= window:
                    out.append(self._match(imp_id, [ts, user, ad, page], click_ts))
                    del clicks[imp_id]
                    dirty_clicks.add(imp_id)
                    expiry_del.append((self._CLICK + imp_id, click_ts))
                else:
                    imps[imp_id] = [ts, user, ad, page]
                    dirty_imps.add(imp_id)
                    expiry_put.append((self._IMPRESSION + imp_id, ts))
            else:
                imp = imps.get(imp_id)
                if imp is not None and 0 <= ts - imp[0] <= window:
                    out.append(self._match(imp_id, imp, ts))
                    del imps[imp_id]
                    dirty_imps.add(imp_id)
                    expiry_del.append((self._IMPRESSION + imp_id, imp[0]))
                elif imp is None and imp_id not in clicks:
                    clicks[imp_id] = ts
                    dirty_clicks.add(imp_id)
                    expiry_put.append((self._CLICK + imp_id, ts))
                else:
                    self.dropped_clicks += 1
        self.impressions.put_all([(k, imps[k]) for k in dirty_imps if k in imps])
        self.impressions.delete_all([k for k in dirty_imps if k not in imps])
        self.clicks.put_all([(k, clicks[k]) for k in dirty_clicks if k in clicks])
        self.clicks.delete_all([k for k in dirty_clicks if k not in clicks])
        self.expiry.register_all([k for k, _ in expiry_put], [t for _, t in expiry_put])
        self.expiry.delete_all([k for k, _ in expiry_del], [t for _, t in expiry_del])
        self.watermark = max(self.watermark, cols["ts"][-1])
        emit.rows(out)

    def window(self, emit: Emitter) -> None:
        self.expiry.fire_batch(lambda keys, _stamps: self._expire(keys, emit),
                               up_to=self.watermark - JOIN_WINDOW_S - 1)
        if self.watermark:
            self.clock["watermark"] = self.watermark

    def _expire(self, keys: list[str], emit: Emitter) -> None:
        """Timers of entries that can no longer match, in timestamp order: emit the
        waiting impressions unclicked, drop the waiting clicks."""
        imp_ids = [k[1:] for k in keys if k[0] == self._IMPRESSION]
        click_ids = [k[1:] for k in keys if k[0] == self._CLICK]
        waiting = self.impressions.get_all(imp_ids)
        emit.rows([self._match(i, waiting[i], None) for i in imp_ids if i in waiting])
        self.impressions.delete_all(imp_ids)
        self.clicks.delete_all(click_ids)
        self.dropped_clicks += len(click_ids)
