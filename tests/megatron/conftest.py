"""Fixtures of the Megatron tests: skip without megatron-core/bridge, the CPU patch layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')"
)


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """megatron-core on CPU in this process: TE stand-in for the bridge import + patch layer."""
    from tests.megatron import cpu_patches, te_standin

    te_standin.import_bridge_without_te()
    with cpu_patches.cpu_patches():
        yield
