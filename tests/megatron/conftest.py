"""Fixtures of the Megatron tests: hpcrl's CPU compatibility layer in the test process.

Every test here carries the ``megatron`` marker (added by tests/conftest.py), whose gate fails
it under CI when megatron-core/bridge are missing. Locally, without them, the whole folder
skips here, before its modules (some import megatron-core) are collected.

``converted`` (a tiny HF Llama and its Megatron conversion) is made once per session (once
per CI run, where .ci/test's pytest processes share it through HPCRL_TEST_MEGATRON_CONVERTED_DIR):
every test only reads it (workers train from it and save elsewhere), and a conversion costs
tens of seconds on the 2-core machine. tests/megatron/test_conversion.py tests converting itself.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.require import is_required, megatron_problem, unavailable

if megatron_problem() is not None and not is_required("deps"):
    unavailable("deps", megatron_problem(), module_level=True)


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """megatron-core on CPU in this process: TE placeholders for the bridge import + the
    product's CPU layer (hpcrl/core/backends/megatron/cpu_compat.py), left after the test."""
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge
    from hpcrl.core.backends.megatron.cpu_compat import cpu_compat

    import_bridge()
    with cpu_compat():
        yield


# Where CI's pytest processes that run parts of this folder share one ``converted`` (.ci/test
# splits tests/megatron over several processes; each would convert again, ~10 CPU-s).
SHARED_CONVERSION_ENV = "HPCRL_TEST_MEGATRON_CONVERTED_DIR"


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(HF model path, Megatron conversion root) of a tiny Llama, read-only for tests."""
    from tests.megatron.harness import build_converted

    shared = os.environ.get(SHARED_CONVERSION_ENV)
    if not shared:
        return build_converted(tmp_path_factory.mktemp("megatron"))
    return _converted_once(Path(shared))


def _converted_once(base: Path) -> tuple[str, str]:
    """``build_converted`` in ``base``, made by the first process to get there; the others
    wait on its lock and read it (the same files one session's tests share)."""
    from tests.megatron.harness import build_converted

    base.mkdir(parents=True, exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = base / "done.json"
        if not done.exists():
            paths = build_converted(base / "tiny-llama")
            done.write_text(json.dumps(paths))
        hf_path, root = json.loads(done.read_text())
    return hf_path, root
