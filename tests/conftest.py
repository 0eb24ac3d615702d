"""Suite-wide wiring: tests that need something this machine may lack go through one gate.

``tests/require.py`` decides: locally a missing piece skips with the command that provides it;
under CI (``HPCRL_REQUIRE_*=1`` or ``CI`` true) it fails with the same reason. Markers:
``slurm`` needs the real test cluster; ``megatron`` needs megatron-core and megatron-bridge
installed. This hook gives ``megatron`` to every test under tests/megatron, and only to them
(no test elsewhere marks itself; ``-m "not megatron"`` deselects exactly that folder).

Fixtures more than one folder uses live here (pytest finds them by name: no test module
imports a fixture): ``ray_cluster`` (tests/core, tests/megatron, tests/vllm) and
``tiny_model_path``. They import Ray and hpcrl's job side lazily, inside the fixture, so that
collecting the login-side tests never loads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.require import require_megatron

MEGATRON_DIR = Path(__file__).parent / "megatron"
REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MEGATRON_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.megatron)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slurm") is not None:
        from tests.slurm.harness import require_slurm

        require_slurm()
    if item.get_closest_marker("megatron") is not None:
        require_megatron()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A fresh local Ray (never a stale cluster) for one test module."""
    import ray

    from hpcrl.core.ray_startup import local_ray_system_config

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Workers import test code (losses, diagnostic actors) by module path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        _system_config=local_ray_system_config(),  # hpcrl's own local Ray is started so too
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``tiny:qwen2`` model written once for a test module."""
    from hpcrl.core.models.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))
