"""The dashboard on a bucket: the sample runs uploaded to a real S3 API server on loopback
(moto's server mode, started and stopped here), browsed as ``s3://runs/sample_runs`` and
compared with the same runs on disk."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.test_app import ENTRY, SAMPLES, TIMEOUT, no_error, texts

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from streamlit.testing.v1 import AppTest

from tests.s3server import S3Server

BUCKET = "runs"
NAMES = ("healthy_control", "sgd_lr_too_high", "nan_in_batch")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("remote") / "sample_runs"
    for name in NAMES:
        if not (SAMPLES / name).is_dir():
            pytest.skip(f"sample_runs/{name} is missing")
        shutil.copytree(SAMPLES / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def bucket(local: Path) -> Iterator[tuple[S3Server, str]]:
    server = S3Server().start()
    try:
        server.create_bucket(BUCKET)
        server.upload(str(local), f"s3://{BUCKET}/sample_runs")
        yield server, f"s3://{BUCKET}/sample_runs/"
    finally:
        server.stop()


def _open(root: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("FORENSICS_RUNS", root)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    no_error(at)
    return at


def _table(at: AppTest) -> Any:
    return at.dataframe[0].value.set_index("run").sort_index().astype(str).to_dict()


def _replayed(at: AppTest) -> AppTest:
    """The Runs page again once every capture below the root is replayed: its first paint
    shows the runs without their replays (app.data's fast path), then the replayed rows."""
    from app import data

    refs = data.list_runs(data.root())
    assert not isinstance(refs, str), refs
    data.replay_all(refs)
    at.run()
    no_error(at)
    return at


def test_regression_a_bucket_root_is_browsed_as_its_url(
        bucket: tuple[S3Server, str], local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The root was made absolute as a local path: s3://runs/x became <cwd>/s3:/runs/x,
    # "no such file or folder".
    from analyzer import api
    from app.rows import RunRow, run_row

    server, url = bucket
    before = server.snapshot(BUCKET)
    at = _replayed(_open(url, monkeypatch))
    assert sorted(at.dataframe[0].value["run"]) == sorted(NAMES)
    # What `forensics analyze` finds in the same bucket, replays included.
    analysed = pd.DataFrame([run_row(r.run.name, r, None).as_dict()
                             for r in api.analyze(url).results], columns=RunRow.columns())
    # As the Runs page shows it (app.tables: blank for missing, numbers shortened; the
    # columns it hides are kept as they are).
    from app.tables import display

    shown = display(analysed, keep=("first_step", "last_finite", "first_after", "first_unit"))[0]
    assert _table(at) == shown.set_index("run").sort_index().astype(str).to_dict()
    # And what the same runs give on disk, their captures' replays included.
    assert _table(at) == _table(_replayed(_open(str(local), monkeypatch)))
    assert server.snapshot(BUCKET) == before


def test_fleet_page_on_a_bucket(bucket: tuple[S3Server, str], local: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    server, url = bucket
    before = server.snapshot(BUCKET)
    at = _open(url, monkeypatch)
    at.switch_page("app_pages/fleet.py").run()
    no_error(at)
    remote = {m.label: m.value for m in at.metric}
    at = _open(str(local), monkeypatch)
    at.switch_page("app_pages/fleet.py").run()
    assert remote == {m.label: m.value for m in at.metric}
    assert remote["failed"] == "2"
    assert server.snapshot(BUCKET) == before


@pytest.mark.parametrize("page", ["run", "timeline", "layers", "findings", "replay", "logs"])
def test_every_run_page_reads_a_bucket(bucket: tuple[S3Server, str], page: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server, url = bucket
    before = server.snapshot(BUCKET)
    at = _open(url, monkeypatch)
    at.selectbox(key="run_picker").set_value("sgd_lr_too_high")
    at.switch_page(f"app_pages/{page}.py").run()
    no_error(at)
    assert "**sgd_lr_too_high**" in texts(at)
    if page == "logs":  # the log's lines, read through a ranged read of its object
        assert any(">" in c.value for c in at.code)
    assert server.snapshot(BUCKET) == before


def test_a_changed_object_is_analysed_again(bucket: tuple[S3Server, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    server, url = bucket
    from app import data

    at = _open(url, monkeypatch)
    sources = at.dataframe[0].value.set_index("run").loc["healthy_control", "sources"]
    saves = [k for k in server.snapshot(BUCKET)
             if k.startswith("sample_runs/healthy_control/") and k.endswith(".pt")]
    assert saves and f"{len(saves)} checkpoints" in sources
    server.client().delete_object(Bucket=BUCKET, Key=sorted(saves)[-1])
    try:
        data.list_runs.clear()  # a bucket's listing is trusted for a minute: do not wait
        data._remote_discovery.clear()
        at.run()
        no_error(at)
        after = at.dataframe[0].value.set_index("run").loc["healthy_control", "sources"]
        assert f"{len(saves) - 1} checkpoint" in after
    finally:
        server.upload(str(SAMPLES / "healthy_control"), f"s3://{BUCKET}/sample_runs/"
                      "healthy_control")
        data.list_runs.clear()
        data._remote_discovery.clear()


def test_launch_takes_a_bucket_url(bucket: tuple[S3Server, str]) -> None:
    from analyzer.dashboard import command, launch
    from analyzer.errors import UsageError

    _, url = bucket
    cmd = command(url, port=8765)
    assert cmd[-3:] == ["--", "--runs", url.rstrip("/")]
    with pytest.raises(UsageError, match="no such object"):
        launch(f"s3://{BUCKET}/nowhere", port=8765)


def test_regression_a_listing_refresh_asks_the_store_nothing_per_object(
        bucket: tuple[S3Server, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rerun past the few seconds a listing is trusted fingerprints every file of every
    # run again: a HEAD per object would be thousands of requests for a large fleet. The
    # bucket's own listing (re-made once a minute) holds every object's size and ETag.
    server, url = bucket
    from app import data

    at = _open(url, monkeypatch)
    server.clear()
    data.list_runs.clear()  # as the listing's few seconds running out does
    at.run()
    no_error(at)
    assert server.requests == []
    data._remote_discovery.clear()  # the bucket's minute running out
    data.list_runs.clear()
    at.run()
    no_error(at)
    listed = server.requests
    assert listed and all(r.is_list for r in listed), [(r.method, r.key) for r in listed]
