"""A capture read from a bucket replays a model of its training script from the script's
saved copy there, when the copy's hash is trusted, as the same capture on disk does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from analyzer.capture.code import SAVED_MAIN
from analyzer.trust import TrustPolicy, check, resolve_plan
from tests.s3server import BUCKET, S3Server
from tests.test_capture_code import GUARDED, _code, _train

pytest_plugins = ["tests.remote_fixtures"]


@pytest.fixture(autouse=True)
def own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv("FORENSICS_CONFIG_DIR", str(folder))
    return folder


def test_regression_the_saved_script_of_a_capture_in_a_bucket_is_found_and_replays(
        s3: S3Server, tmp_path: Path) -> None:
    step, script = _train(tmp_path, GUARDED)
    code = _code(step)
    url = f"s3://{BUCKET}/trust/run/capture/step_3"
    s3.upload(str(step), url)
    before = s3.snapshot(BUCKET)
    script.unlink()  # only the bucket's copy is left
    shutil.rmtree(step)
    plan = check("__main__:make_model", TrustPolicy(), run_folder=f"s3://{BUCKET}/trust/run",
                 code=code, capture_folder=url)
    assert plan.source == "main" and plan.file == f"{url}/{SAVED_MAIN}"
    model = resolve_plan(plan, TrustPolicy(), run_folder=None).obj(width=3)
    assert type(model).__name__ == "Net" and model.layer.in_features == 3
    assert not (tmp_path / "marker").exists()  # its training block did not run
    assert s3.snapshot(BUCKET) == before
