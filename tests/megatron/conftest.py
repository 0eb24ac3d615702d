"""Fixtures of the Megatron tests: skip without megatron-core/bridge, the CPU patch layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')"
)


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """megatron-core on CPU in this process: TE placeholders for the bridge import + patch layer."""
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge
    from tests.megatron import cpu_patches

    import_bridge()
    with cpu_patches.cpu_patches():
        yield
