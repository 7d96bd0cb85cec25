"""The one clean-close claim mechanism (localstate.claims) that the rocksdb engine's
``db.clean`` and the file changelog's ``clean.json`` share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from localstate import claims
from localstate.changelog.file import FileChangelogPartition
from localstate.changelog.file.clean import CLAIM_NAME

FIELDS = {"offset": (int,), "note": (str, type(None))}


def test_a_claim_is_taken_once_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "x.clean"
    claims.leave_claim(path, {"offset": 7, "note": None})
    assert claims.take_claim(path, FIELDS) == {"offset": 7, "note": None}
    assert not path.exists()
    assert claims.take_claim(path, FIELDS) is None  # taken: a second open finds nothing


@pytest.mark.parametrize("raw", [b"{", b'{"offset": -1, "note": null}', b'{"offset": 1.5, "note": null}',
                                 b'{"offset": 1}', b'{"offset": true, "note": null}', b"[]"])
def test_a_damaged_claim_is_refused_and_removed(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "x.clean"
    path.write_bytes(raw)
    with pytest.raises(claims.ClaimDamaged):
        claims.take_claim(path, FIELDS)
    assert not path.exists()


def test_a_claim_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.clean"
    path.mkdir()  # something that is not a claim file where the claim should be
    with pytest.raises(OSError):
        claims.take_claim(path, FIELDS)
    assert path.exists()  # not removed: the caller must not rely on it (nor on what it hides)


def test_a_close_that_died_before_its_rename_leaves_nothing_usable(tmp_path: Path) -> None:
    path = tmp_path / "x.clean"
    (tmp_path / "x.clean.4242.tmp").write_bytes(b'{"offset": 3')
    assert claims.take_claim(path, FIELDS) is None
    assert not list(tmp_path.iterdir())


def test_the_file_changelog_claim_is_written_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file log's claim goes through the shared, fsynced write (os.fsync observed:
    a lost fsync cannot be caused here without a machine crash)."""
    part = FileChangelogPartition(tmp_path / "p")
    part.append([(b"k", b"v")])
    part.flush()
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    part.close()
    assert (tmp_path / "p" / CLAIM_NAME).is_file()
    assert synced, "the clean-close claim was written without fsync"
