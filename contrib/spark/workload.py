"""A seeded, realistic synthetic workload: page views, user profiles, settings, ads.

Everything is generated with numpy in a few vectorised passes (a million page views
in about two seconds) and returned as :class:`pyarrow.Table` objects, so a job can
feed them to Spark (``spark.createDataFrame(table)``) or straight to a task.

What is realistic about it:

* page popularity and user activity are heavy-tailed (Zipf-like), as on real sites;
* page views arrive roughly in time order, with a little disorder (up to
  ``max_disorder_s`` seconds), as events from many web servers do;
* profiles change over time (people move: a new ZIP code) and some accounts are
  deleted; settings are set by most users and changed by a few;
* ad impressions come from page views; a few percent are clicked, most clicks come
  within a minute or two, and a tail of clicks comes too late to be joined.

Identical arguments give identical tables (``seed``), so tests and the demo can check
results against a straightforward recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["Workload", "generate", "HOUR", "ZIP_CODES"]

HOUR = 3600
"""Seconds per hour: the page-view aggregation window."""

_FIRST = (
    "Ada Alan Alice Amir Ana Ben Bea Carlos Chen Chloe Dana David Elena Emma Farah Felix Grace Hana "
    "Hugo Ines Ivan Jamal Jana Jonas Kai Kenji Lara Leo Lina Luca Maya Mia Nadia Noah Nora Omar Olga "
    "Paul Priya Quinn Rafael Rosa Sam Sara Tariq Tom Uma Vera Wei Yara Yusuf Zoe"
).split()
_LAST = (
    "Adams Berg Costa Diaz Evans Fischer Garcia Hansen Ito Jensen Khan Kowalski Lopez Martin Nakamura "
    "Novak Okafor Patel Quist Rossi Silva Tanaka Uddin Varga Weber Xu Yilmaz Zhang"
).split()
ZIP_CODES: tuple[tuple[str, str], ...] = (
    ("10001", "New York"), ("10027", "New York"), ("02139", "Cambridge"), ("94103", "San Francisco"),
    ("94301", "Palo Alto"), ("98101", "Seattle"), ("60614", "Chicago"), ("73301", "Austin"),
    ("30303", "Atlanta"), ("80202", "Denver"), ("97205", "Portland"), ("33101", "Miami"),
    ("55401", "Minneapolis"), ("19103", "Philadelphia"), ("20001", "Washington"), ("85004", "Phoenix"),
    ("89101", "Las Vegas"), ("48201", "Detroit"), ("63101", "St. Louis"), ("37203", "Nashville"),
)
"""(ZIP code, city) pairs users live in."""
_INTERESTS = (
    "hiking cooking jazz chess cycling photography gardening football poetry astronomy running "
    "climbing painting robotics baking sailing skiing yoga pottery birdwatching gaming travel "
    "theatre knitting surfing"
).split()
_SECTIONS = ("products", "blog", "docs", "news", "help")
_TOP_PAGES = ("/", "/search", "/cart", "/checkout", "/login", "/pricing", "/about")
_LANGUAGES = ("en", "en", "en", "de", "es", "fr", "ja", "pt")
_THEMES = ("light", "dark", "system")


@dataclass(frozen=True)
class Workload:
    """The generated tables (``ts`` in epoch seconds; profiles, settings and clicks are
    sorted by ``ts``, page views and impressions are in time order up to
    ``max_disorder_s``).

    * ``profiles``: user_id, ts, name, zip, city, bio, deleted — an initial profile
      per user before the first view, then moves (new zip/city) and deletions.
    * ``settings``: user_id, ts, language, theme, notifications.
    * ``page_views``: ts, user_id, page, referrer, duration_ms.
    * ``impressions``: impression_id, ts, user_id, ad_id, page.
    * ``clicks``: impression_id, ts, user_id, ad_id.
    """

    profiles: pa.Table
    settings: pa.Table
    page_views: pa.Table
    impressions: pa.Table
    clicks: pa.Table
    start: int
    hours: int
    users: int
    seed: int

    @property
    def end(self) -> int:
        """One past the last second of the page-view period."""
        return self.start + self.hours * HOUR

    def sizes(self) -> dict[str, int]:
        """Row counts per table."""
        return {
            "profiles": self.profiles.num_rows,
            "settings": self.settings.num_rows,
            "page_views": self.page_views.num_rows,
            "impressions": self.impressions.num_rows,
            "clicks": self.clicks.num_rows,
        }


def _ids(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    if numbers.size == 0:  # np.char.zfill fails on an empty array (tiny workloads: --events 10)
        return pa.array([], pa.string())
    return pa.array(np.char.add(prefix, np.char.zfill(numbers.astype(str), width)).tolist(), pa.string())


def _zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _pages(rng: np.random.Generator, n: int) -> np.ndarray:
    words = np.array(_INTERESTS)
    sections = rng.choice(np.array(_SECTIONS), n)
    slugs = np.char.add(np.char.add(rng.choice(words, n), "-"), rng.integers(1, 999, n).astype(str))
    paths = np.char.add(np.char.add(np.char.add("/", sections), "/"), slugs)
    paths[: len(_TOP_PAGES)] = _TOP_PAGES
    return np.array(list(dict.fromkeys(paths.tolist())))  # unique, popularity order kept


def generate(
    events: int = 100_000,
    *,
    users: int | None = None,
    hours: int = 6,
    seed: int = 7,
    start: int = 1_767_225_600,
    max_disorder_s: int = 30,
    click_rate: float = 0.05,
) -> Workload:
    """Generate ``events`` page views and everything that goes with them.

    ``users`` defaults to ``max(50, events // 40)``; ``start`` is rounded down to an
    hour. Impressions are a quarter of the page views; ``click_rate`` of impressions
    are clicked. Deterministic for given arguments.
    """
    if events < 1:
        raise ValueError(f"events must be >= 1, got {events}")
    if hours < 1:
        raise ValueError(f"hours must be >= 1, got {hours}")
    rng = np.random.default_rng(seed)
    n_users = users if users is not None else max(50, events // 40)
    start -= start % HOUR
    end = start + hours * HOUR
    user_ids = np.char.add("u", np.char.zfill(np.arange(n_users).astype(str), 6))

    # -- profiles: one initial row per user, then ~15% move, ~2% delete their account --------
    first = rng.choice(np.array(_FIRST), n_users)
    last = rng.choice(np.array(_LAST), n_users)
    names = np.char.add(np.char.add(first, " "), last)
    zip_idx = rng.integers(0, len(ZIP_CODES), n_users)
    words = np.array(_INTERESTS)
    bios = np.char.add(
        np.char.add(np.char.add("likes ", rng.choice(words, n_users)), " and "), rng.choice(words, n_users)
    )
    init_ts = start - rng.integers(1, 30 * 24 * HOUR, n_users)
    movers = rng.choice(n_users, n_users * 15 // 100, replace=False)
    move_ts = rng.integers(start, end, movers.size)
    move_zip = (zip_idx[movers] + rng.integers(1, len(ZIP_CODES), movers.size)) % len(ZIP_CODES)
    stayers = np.setdiff1d(np.arange(n_users), movers)
    leavers = rng.choice(stayers, min(stayers.size, max(1, n_users // 50)), replace=False)
    leave_ts = rng.integers(start + HOUR // 2, end, leavers.size)
    p_user = np.concatenate([np.arange(n_users), movers, leavers])
    p_ts = np.concatenate([init_ts, move_ts, leave_ts])
    p_zip = np.concatenate([zip_idx, move_zip, zip_idx[leavers]])
    p_deleted = np.concatenate([np.zeros(n_users + movers.size, bool), np.ones(leavers.size, bool)])
    order = np.argsort(p_ts, kind="stable")
    p_user, p_ts, p_zip, p_deleted = p_user[order], p_ts[order], p_zip[order], p_deleted[order]
    zips = np.array([z for z, _ in ZIP_CODES])
    cities = np.array([c for _, c in ZIP_CODES])
    profiles = pa.table({
        "user_id": pa.array(user_ids[p_user].tolist(), pa.string()),
        "ts": pa.array(p_ts, pa.int64()),
        "name": pa.array(names[p_user].tolist(), pa.string()),
        "zip": pa.array(zips[p_zip].tolist(), pa.string()),
        "city": pa.array(cities[p_zip].tolist(), pa.string()),
        "bio": pa.array(bios[p_user].tolist(), pa.string()),
        "deleted": pa.array(p_deleted, pa.bool_()),
    })

    # -- settings: ~80% of users set them, ~10% change them later ----------------------------
    setters = rng.choice(n_users, n_users * 8 // 10, replace=False)
    changers = rng.choice(setters, setters.size // 8, replace=False)
    s_user = np.concatenate([setters, changers])
    s_ts = np.concatenate([start - rng.integers(1, 7 * 24 * HOUR, setters.size), rng.integers(start, end, changers.size)])
    order = np.argsort(s_ts, kind="stable")
    s_user, s_ts = s_user[order], s_ts[order]
    settings = pa.table({
        "user_id": pa.array(user_ids[s_user].tolist(), pa.string()),
        "ts": pa.array(s_ts, pa.int64()),
        "language": pa.array(rng.choice(np.array(_LANGUAGES), s_user.size).tolist(), pa.string()),
        "theme": pa.array(rng.choice(np.array(_THEMES), s_user.size).tolist(), pa.string()),
        "notifications": pa.array(rng.random(s_user.size) < 0.6, pa.bool_()),
    })

    # -- page views: heavy-tailed users and pages, near time order with some disorder --------
    pages = _pages(rng, max(20, min(5000, events // 20)))
    page_w = _zipf_weights(pages.size, 1.1)
    user_w = rng.permutation(_zipf_weights(n_users, 0.8))
    v_ts = np.sort(rng.integers(start, end, events))
    if max_disorder_s:
        v_ts = np.clip(v_ts + rng.integers(-max_disorder_s, max_disorder_s + 1, events), start, end - 1)
    v_user = rng.choice(n_users, events, p=user_w)
    v_page = rng.choice(pages.size, events, p=page_w)
    ref_choices = np.array(["", "google", "newsletter", "twitter", "direct"])
    page_views = pa.table({
        "ts": pa.array(v_ts, pa.int64()),
        "user_id": pa.array(user_ids[v_user].tolist(), pa.string()),
        "page": pa.array(pages[v_page].tolist(), pa.string()),
        "referrer": pa.array(rng.choice(ref_choices, events, p=[0.4, 0.3, 0.1, 0.1, 0.1]).tolist(), pa.string()),
        "duration_ms": pa.array(rng.lognormal(9.5, 1.0, events).astype(np.int64), pa.int64()),
    })

    # -- ads: impressions on a quarter of the views; clicks on a few, some too late -------------
    imp_rows = np.sort(rng.choice(events, max(1, events // 4), replace=False))
    n_imp = imp_rows.size
    i_ts = v_ts[imp_rows] + rng.integers(0, 3, n_imp)
    i_ids = np.array([f"imp-{i:08d}" for i in range(n_imp)], dtype=str)
    i_ad = rng.integers(1, 60, n_imp)
    impressions = pa.table({
        "impression_id": pa.array(i_ids.tolist(), pa.string()),
        "ts": pa.array(i_ts, pa.int64()),
        "user_id": pa.array(user_ids[v_user[imp_rows]].tolist(), pa.string()),
        "ad_id": _ids("ad-", i_ad, 3),
        "page": pa.array(pages[v_page[imp_rows]].tolist(), pa.string()),
    })
    clicked = np.flatnonzero(rng.random(n_imp) < click_rate)
    delay = rng.exponential(90.0, clicked.size).astype(np.int64) + 1
    late = rng.random(clicked.size) < 0.1
    delay[late] += rng.integers(15 * 60, 60 * 60, int(late.sum()))
    c_ts = i_ts[clicked] + delay
    order = np.argsort(c_ts, kind="stable")
    clicked, c_ts = clicked[order], c_ts[order]
    clicks = pa.table({
        "impression_id": pa.array(i_ids[clicked].tolist(), pa.string()),
        "ts": pa.array(c_ts, pa.int64()),
        "user_id": pa.array(user_ids[v_user[imp_rows[clicked]]].tolist(), pa.string()),
        "ad_id": _ids("ad-", i_ad[clicked], 3),
    })
    return Workload(profiles, settings, page_views, impressions, clicks, start, hours, n_users, seed)
