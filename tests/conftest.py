"""Suite-wide wiring: tests that need something this machine may lack go through one gate.

``tests/require.py`` decides: locally a missing piece skips with the command that provides it;
under CI (``HPCRL_REQUIRE_*=1`` or ``CI`` true) it fails with the same reason. Markers:
``slurm`` needs the real test cluster; ``megatron`` needs megatron-core and megatron-bridge
installed. This hook gives ``megatron`` to every test under tests/megatron, and only to them
(no test elsewhere marks itself; ``-m "not megatron"`` deselects exactly that folder).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.require import require_megatron

MEGATRON_DIR = Path(__file__).parent / "megatron"


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
