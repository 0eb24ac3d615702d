"""Node 0's GCS node-table reader (hpcrl.job.driver_process.GcsNodeTable) uses a private Ray API:
it must exist on the Ray at hand (2.60 here; 2.49 runs it in tests/slurm/test_container_jobs.py)
and, on a Ray where it moved, fail by name instead of deep inside the wait for the nodes."""

from __future__ import annotations

import pytest

from hpcrl.job.errors import BootstrapError
from tests.require import require_module

ray = require_module("ray")

from hpcrl.job.driver_process import GcsNodeTable  # noqa: E402


def test_the_reader_builds_on_this_ray_without_connecting():
    table = GcsNodeTable("127.0.0.1:1")  # nothing listens: the client connects on first use
    table.close()


def test_a_ray_without_that_client_fails_naming_its_version_and_the_fix(monkeypatch):
    import ray._raylet

    monkeypatch.delattr(ray._raylet, "GcsClientOptions")
    with pytest.raises(BootstrapError) as caught:
        GcsNodeTable("127.0.0.1:1")
    assert str(caught.value).startswith(
        f"ray {ray.__version__} lacks the GCS client hpcrl reads Ray's node table with ("
    )
    assert str(caught.value).endswith(
        "); use a Ray that hpcrl supports (hpcrl/plan/requirements.py)"
    )
