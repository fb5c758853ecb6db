"""pytest fixtures over :mod:`tests.s3server`: one S3 server per test module.

A test module that wants them names this module in its ``pytest_plugins``; the server is
started once for the module and stopped after its last test.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3server import BUCKET, S3Server

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """A running S3 server on loopback with the bucket ``runs``; the environment set for
    s3fs while it runs."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = S3Server().start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote_samples(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A local copy of sample_runs/ and the URL of the same tree in the bucket."""
    local = tmp_path_factory.mktemp("local") / "sample_runs"
    shutil.copytree(ROOT / "sample_runs", local)
    url = f"s3://{BUCKET}/sample_runs"
    s3.upload(str(local), url)
    return local, url
