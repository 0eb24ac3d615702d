"""``gpu``-marked tests need an NVIDIA GPU: they skip without one, and fail instead when
HPCRL_REQUIRE_GPU=1 (the GPU machine's run, tests/gpu/device_run.sh), through the suite's one
gate (tests/require.py, kind ``gpu``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gpu.harness import OUT_ENV, gpu_count
from tests.require import unavailable

#: Names of the gpu tests that failed so far this session (device time is short: a test whose
#: prerequisite failed stops at once instead of failing the same way minutes later).
FAILED_GPU_TESTS = pytest.StashKey[set]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    if gpu_count() > 0:
        return
    unavailable(
        "gpu",
        "no NVIDIA GPU here (nvidia-smi -L lists none); the GPU machine runs tests/gpu/device_run.sh",
    )


@pytest.fixture(scope="session")
def gpu_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run folders of this session (HPCRL_GPU_TEST_OUT, else a pytest tmp folder)."""
    out = os.environ.get(OUT_ENV)
    path = Path(out) if out else tmp_path_factory.mktemp("gpu-runs")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models and Megatron conversions, shared by the session's jobs (kept out of gpu_out:
    the run folders are what comes back from the GPU machine)."""
    return tmp_path_factory.mktemp("gpu-cache")


@pytest.fixture(scope="session")
def hf_checkpoint(gpu_cache: Path) -> Path:
    """The Llama-shaped 1.1B of hpcrl/core/models/tiny.py, saved as an HF checkpoint
    (random init, tokenizer beside it): a local checkpoint as a user has one."""
    from hpcrl.core.models.tiny import ensure_tiny_model

    return Path(ensure_tiny_model("tiny:llama-1b", cache_dir=str(gpu_cache / "hf")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield  # old-style wrapper: the GPU machine's pytest version is not ours to pick
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("gpu") is not None:
        item.config.stash.setdefault(FAILED_GPU_TESTS, set()).add(item.name)


@pytest.fixture
def failed_gpu_tests(request: pytest.FixtureRequest) -> set:
    return request.config.stash.setdefault(FAILED_GPU_TESTS, set())
