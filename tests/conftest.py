"""Suite-wide wiring: Slurm-marked tests need the real test cluster.

Locally, without the cluster, they skip with the command that starts it; in CI
(HPCRL_REQUIRE_SLURM=1) a missing cluster fails them instead.
"""

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slurm") is None:
        return
    from tests.slurm.harness import require_slurm

    require_slurm()
