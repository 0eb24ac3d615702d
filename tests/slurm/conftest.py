"""Every test in tests/slurm needs the real test cluster (see harness.require_slurm)."""

import pytest

from tests.slurm.harness import require_slurm


@pytest.fixture(autouse=True)
def slurm_cluster() -> None:
    require_slurm()
