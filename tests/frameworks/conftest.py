"""Session fixtures for tests under tests/frameworks/; elsewhere call ``corpus.get``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks import corpus


@pytest.fixture(scope="session")
def framework_run(tmp_path_factory: pytest.TempPathFactory) -> object:
    """``framework_run("hf_nan")`` is that run's folder, made once per session."""

    def get(name: str) -> Path:
        return corpus.get(name, tmp_path_factory)

    return get


@pytest.fixture(scope="session", params=corpus.NAMES)
def any_framework_run(request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus.get(str(request.param), tmp_path_factory)
