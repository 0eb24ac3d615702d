"""Suite-wide wiring: tests that need something this machine may lack go through one gate.

``tests/require.py`` decides: locally a missing piece skips with the command that provides it;
under CI (``HPCRL_REQUIRE_*=1`` or ``CI`` true) it fails with the same reason. Markers:
``slurm`` needs the real test cluster; ``megatron`` needs megatron-core and megatron-bridge
installed. This hook gives ``megatron`` to every test under tests/megatron, and only to them
(no test elsewhere marks itself; ``-m "not megatron"`` deselects exactly that folder).

Fixtures more than one folder uses live here (pytest finds them by name: no test module
imports a fixture): ``ray_cluster`` (tests/core, tests/megatron, tests/vllm),
``two_node_cluster`` (tests/core, tests/vllm) and ``tiny_model_path``. They import Ray and hpcrl's job side lazily, inside the fixture, so that
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
    items[:] = local_ray_modules_together(items)


def uses_local_ray(item: pytest.Item) -> bool:
    return RAY_FIXTURE in getattr(item, "fixturenames", ())


def local_ray_modules_together(items: list[pytest.Item]) -> list[pytest.Item]:
    """Each folder's test modules in their order, those that use ``ray_cluster`` last, those
    whose first test does so at the very end: consecutive modules then share one local Ray
    (~7 CPU-s a start, issue 26). Tests keep their order within their module."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(Path(item.path), []).append(item)

    folder_order = {path.parent: index for index, path in reversed(list(enumerate(modules)))}

    def rank(path: Path) -> tuple[int, int]:
        tests = modules[path]
        if not any(uses_local_ray(t) for t in tests):
            return folder_order[path.parent], 0
        return folder_order[path.parent], 2 if uses_local_ray(tests[0]) else 1

    ordered = sorted(modules, key=rank)  # stable: modules of one rank keep their order
    return [item for path in ordered for item in modules[path]]


def pytest_runtest_setup(item: pytest.Item) -> None:
    shared_ray = item.config.stash.get(SHARED_RAY_KEY, None)
    if shared_ray is not None and not uses_local_ray(item):
        shared_ray.stop_unless_in(Path(item.path))
    if item.get_closest_marker("slurm") is not None:
        from tests.slurm.harness import require_slurm

        require_slurm()
    if item.get_closest_marker("megatron") is not None:
        require_megatron()


class SharedLocalRay:
    """One local Ray (never a stale cluster of another session) that consecutive test modules
    using ``ray_cluster`` share: each start and stop costs ~7 CPU-s (docs/ci-time.md), one per
    module was ~100 CPU-s of CI (issue 26). It is stopped before the first test outside the
    module that last asked for it, unless that test asks for it too: a test that does not
    use ``ray_cluster`` sees a live Ray only where it did when each module had its own (after
    its own module's first Ray test), and a test that starts a Ray itself finds none."""

    def __init__(self) -> None:
        self.running = False
        self.module: Path | None = None

    def start_for(self, module: Path) -> None:
        self.module = module
        if self.running:
            return
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
        self.running = True

    def stop_unless_in(self, module: Path | None) -> None:
        if self.running and module != self.module:
            import ray

            ray.shutdown()
            self.running = False


SHARED_RAY_KEY = pytest.StashKey[SharedLocalRay]()
RAY_FIXTURE = "ray_cluster"


@pytest.fixture(scope="session")
def _shared_local_ray(request: pytest.FixtureRequest) -> Iterator[SharedLocalRay]:
    shared_ray = SharedLocalRay()
    request.config.stash[SHARED_RAY_KEY] = shared_ray
    try:
        yield shared_ray
    finally:
        shared_ray.stop_unless_in(None)
        del request.config.stash[SHARED_RAY_KEY]


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest, _shared_local_ray: SharedLocalRay) -> None:
    """A local Ray for one test module: started fresh in this session (never a stale
    cluster), shared with the modules next to it that ask for it too (SharedLocalRay)."""
    _shared_local_ray.start_for(Path(request.path))
    import ray

    assert ray.is_initialized(), "the shared local Ray was shut down by someone else"


@pytest.fixture
def two_node_cluster(request: pytest.FixtureRequest) -> Iterator[object]:
    """A Ray cluster of two nodes on this machine (``ray.cluster_utils``), one CPU each, this
    process connected to it; for one test (it must not meet the shared local Ray). Another
    count of nodes: parametrize it indirectly (``request.param``)."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(getattr(request, "param", 2) - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``tiny:qwen2`` model written once for a test module."""
    from hpcrl.core.models.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))
