"""An object store that is not set up yet gives an error that names the setting to fix,
at open, without retries — never an opaque 404 page, and never an empty state built
from a bucket that does not exist (S3 answers a GET there with the 404 of a missing key).
On the moto S3 server: a missing bucket, and refused credentials (moto checking them)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import Config, TaskStorage
from localstate.changelog.objectstore.client import setup_problem
from localstate.cli import cli
from localstate.errors import ChangelogError
from localstate.reader import StateReader
from localstate.testing.changelog_conformance import task_values
from localstate.testing.s3 import MotoServer, objectstore_options

pytestmark = pytest.mark.s3


def _values(tmp_path, endpoint: str, bucket: str, **settings: Any) -> dict[str, Any]:
    where = objectstore_options(endpoint, bucket, **{"retries": 3, "retry.backoff.ms": 200, **settings})
    return task_values({"job.changelog.system": "s3", "job.checkpoint.system": "s3", **where}, tmp_path)


def test_a_bucket_that_does_not_exist_is_named_at_open(s3_server, tmp_path):
    values = _values(tmp_path, s3_server.endpoint, "no-such-bucket")
    config = Config.from_dict(values)
    t0 = time.monotonic()
    with pytest.raises(ChangelogError, match=r"bucket 'no-such-bucket' does not exist.*systems\.s3\.path"):
        TaskStorage(config)
    assert time.monotonic() - t0 < 2  # not retried
    with pytest.raises(ChangelogError, match="bucket 'no-such-bucket' does not exist"):
        with StateReader(config) as reader:
            _ = reader.checkpoint
    args = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(cli, ["verify", *args])
    assert result.exit_code != 0 and "does not exist" in result.output, result.output
    assert "<?xml" not in result.output


def test_refused_credentials_are_named_at_open(tmp_path):
    server = MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}).start()
    try:
        values = _values(tmp_path, server.endpoint, "some-bucket")
        t0 = time.monotonic()
        with pytest.raises(ChangelogError, match=r"refused the credentials.*systems\.s3\.config\.access_key_id"):
            TaskStorage(Config.from_dict(values))
        assert time.monotonic() - t0 < 2
    finally:
        server.stop()


def test_no_credentials_at_all_names_the_settings():
    """Test double: an error text as obstore gives it when no credentials are configured
    and the instance-metadata address does not answer. The tests never send traffic to
    that address, so the failure is described, not caused."""
    error = OSError("Generic S3 error: Error performing token request: Error after 0 retries: error sending "
                    "request for url (http://169.254.169.254/latest/api/token)")
    problem = setup_problem(error, "s3://bucket/prefix", "s3")
    assert problem is not None and "systems.s3.config.access_key_id" in problem
    assert setup_problem(OSError("connection reset"), "s3://bucket/prefix", "s3") is None
