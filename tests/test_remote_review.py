"""A review of reading runs from a bucket: keys that are odd as paths, URLs that chain
filesystems, and credentials that must stay out of every message."""

from __future__ import annotations

from typing import Any

import pytest

from analyzer import api
from analyzer.errors import UsageError
from analyzer.ingest import storage
from tests.s3server import BUCKET, S3Server

pytest_plugins = ("tests.remote_fixtures",)  # the s3 fixture

NAN_LOG = b"step 1 loss 1.0\nstep 2 loss nan\n"


def _put(server: S3Server, blobs: dict[str, bytes]) -> None:
    client = server.client()
    for key, body in blobs.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)


def test_regression_a_key_with_an_empty_or_dot_part_hides_no_run_and_is_reported(
        s3: S3Server) -> None:
    # "odd/a//x/..." listed as a folder "odd/a/" that the URL "odd/a" also names: the
    # real run odd/a/real was lost and a folder odd/a/x reported missing from the listing
    _put(s3, {"odd/a/real/train.log": NAN_LOG, "odd/a//x/train.log": NAN_LOG,
              "odd/a/../b/train.log": NAN_LOG, "odd/c/./d/train.log": NAN_LOG})
    before = s3.snapshot(BUCKET)
    report = api.analyze([f"s3://{BUCKET}/odd"])
    assert [r.run.path for r in report.results] == [f"s3://{BUCKET}/odd/a/real"]
    assert report.results[0].status == "failed"
    messages = {(i.location.file, i.kind, i.message) for i in report.issues}
    assert all("not in the store's listing" not in m for _, _, m in messages)
    named = sorted(f for f, _, _ in messages)
    assert named == [f"s3://{BUCKET}/odd/a/../b/train.log", f"s3://{BUCKET}/odd/a//x/train.log",
                     f"s3://{BUCKET}/odd/c/./d/train.log"]
    assert all(k == "unreadable" and "empty, '.' or '..' part" in m for _, k, m in messages)
    assert s3.snapshot(BUCKET) == before


@pytest.mark.parametrize("url", [f"simplecache::s3://{BUCKET}/chain",
                                 f"zip://train.log::s3://{BUCKET}/chain/a.zip",
                                 f"blockcache::s3://{BUCKET}/chain/train.log"])
def test_regression_a_chained_url_is_refused_naming_the_chain(s3: S3Server, url: str) -> None:
    # simplecache:: was taken for a local path ("no such file or folder") and zip://...::
    # said "cannot be looked at: chain/a.zip"
    _put(s3, {"chain/train.log": NAN_LOG, "chain/a.zip": b"PK"})
    with pytest.raises(UsageError, match="chained") as caught:
        api.analyze([url])
    assert "s3://" in str(caught.value)


class _Leaky:
    """A filesystem whose every call fails with botocore's words for an endpoint that
    cannot be reached: the endpoint, credentials and all."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        if name in ("find", "info", "open", "ls"):
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError('Could not connect to the endpoint URL: '
                                   '"http://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@10.0.0.1:9000'
                                   '/runs?list-type=2" (key AKIAIOSFODNN7EXAMPLE)')
            return fail
        return getattr(self.real, name)


def test_regression_credentials_in_a_store_error_are_not_printed(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    real = storage.filesystem

    def leaky(url: str) -> tuple[Any, str]:
        fs, key = real(url)
        return _Leaky(fs), key

    monkeypatch.setattr(storage, "filesystem", leaky)
    with pytest.raises(UsageError) as caught:
        api.analyze([f"s3://{BUCKET}/chain"])
    text = str(caught.value)
    assert "wJalrXUtnFEMI" not in text and "AKIAIOSFODNN7EXAMPLE" not in text
    assert "10.0.0.1:9000" in text  # the endpoint itself still said


def test_regression_a_key_with_two_colons_is_read_as_itself(s3: S3Server) -> None:
    # fsspec's parser cut "s3://runs/colon/a::b/train.log" at "::" and read "colon/a"
    _put(s3, {"colon/a::b/train.log": NAN_LOG, "colon/a": b"not a run\n"})
    report = api.analyze([f"s3://{BUCKET}/colon/a::b"])
    assert [r.run.path for r in report.results] == [f"s3://{BUCKET}/colon/a::b"]
    assert report.results[0].status == "failed"
    assert report.results[0].run.logs[0].path == f"s3://{BUCKET}/colon/a::b/train.log"


def test_regression_an_object_that_is_also_a_folder_of_keys_is_reported(s3: S3Server) -> None:
    # the object shadow/run/train.log, also the folder of shadow/run/train.log/x, was
    # dropped without a word: the run was not found and nothing said why
    _put(s3, {"shadow/run/train.log": NAN_LOG, "shadow/run/train.log/x": b"hello\n",
              "shadow/ok/train.log": NAN_LOG})
    report = api.analyze([f"s3://{BUCKET}/shadow"])
    assert [r.run.path for r in report.results] == [f"s3://{BUCKET}/shadow/ok"]
    assert [(i.location.file, i.kind) for i in report.issues] == [
        (f"s3://{BUCKET}/shadow/run/train.log", "unreadable")]
    assert "also the folder of other keys" in report.issues[0].message


class _Timing:
    """An object's handle that gives ``piece`` bytes a read and times out once ``after``
    bytes came, as a store that stops answering mid-object."""

    def __init__(self, handle: Any, after: int, piece: int = 16384) -> None:
        self.handle, self.after, self.piece, self.came = handle, after, piece, 0

    def readinto(self, view: Any) -> int:
        if self.came >= self.after:
            raise TimeoutError("Read timeout on endpoint URL")
        n = int(self.handle.readinto(memoryview(view)[: self.piece]))
        self.came += n
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def test_regression_an_event_file_read_that_times_out_keeps_the_records_before_it(
        s3: S3Server, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the window (32 MB) that a read failed in was dropped whole: an event file smaller
    # than a window kept no point, and the issue said offset 0
    from analyzer.ingest.tb import read_event_file
    from tests.conftest import write_summary_run

    write_summary_run(str(tmp_path), {"loss": [float(i) for i in range(4000)]})
    (local,) = tmp_path.glob("events.out.tfevents.*")
    s3.upload(str(tmp_path), f"s3://{BUCKET}/slow")
    url = f"s3://{BUCKET}/slow/{local.name}"
    whole = read_event_file(url)
    real = storage.filesystem

    class Slow:
        def __init__(self, fs: Any) -> None:
            self.fs = fs

        def open(self, *args: Any, **kwargs: Any) -> Any:
            return _Timing(self.fs.open(*args, **kwargs), after=local.stat().st_size // 2)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fs, name)

    monkeypatch.setattr(storage, "filesystem", lambda u: (Slow(real(u)[0]), real(u)[1]))
    cut = read_event_file(url)
    (issue,) = [i for i in cut.issues if i.kind == "unreadable"]
    assert issue.location.file == url and "Read timeout" in issue.message
    offset = issue.location.offset or 0
    assert local.stat().st_size // 3 < offset <= local.stat().st_size // 2 + 16384
    (full,), (kept,) = whole.series, cut.series
    assert 0.3 * len(full.steps) < len(kept.steps) < 0.6 * len(full.steps)
    assert list(kept.steps) == list(full.steps[: len(kept.steps)])
    assert not [i for i in cut.issues if i.kind == "truncated"]
