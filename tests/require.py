"""The one gate for tests that need something a machine may lack.

Locally a missing piece (the Slurm test cluster, Ray, megatron-core, vLLM's environment, a GPU,
shellcheck) skips the tests that need it, with the command that provides it. Under CI it fails
them with the same reason, so a broken install can never turn into a green run of skips:

| kind    | required when                          | covers                                          |
|---------|----------------------------------------|-------------------------------------------------|
| `deps`  | `HPCRL_REQUIRE_DEPS=1` or `CI` is true | Python packages of the test env, shellcheck     |
| `slurm` | `HPCRL_REQUIRE_SLURM=1` or `CI`        | the 2-node test cluster, in netns mode          |
| `vllm`  | `HPCRL_REQUIRE_VLLM=1` or `CI`         | `.venv-vllm` (tests/vllm) and its link to .venv |
| `gpu`   | `HPCRL_REQUIRE_GPU=1` (never implied)  | an NVIDIA GPU (the `gpu` marker, tests/gpu)     |

`.ci/run` sets the first three flags; `.ci/test` sets `HPCRL_REQUIRE_VLLM=1` for its vLLM run.
A CI machine has no GPU, so `CI` never implies `gpu`; the GPU run (tests/gpu/device_run.sh)
sets its flag itself.
Nothing here imports the packages it checks until asked.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import NoReturn

import pytest

FLAGS = {
    "deps": "HPCRL_REQUIRE_DEPS",
    "slurm": "HPCRL_REQUIRE_SLURM",
    "vllm": "HPCRL_REQUIRE_VLLM",
    "gpu": "HPCRL_REQUIRE_GPU",
}
IMPLIED_BY_CI = frozenset({"deps", "slurm", "vllm"})
SETUP_HINT = "run `bash .ci/setup` (it builds .venv with every test dependency)"
VLLM_HINT = (
    "build .venv-vllm with `bash .ci/vllm-env`, then run "
    "`HPCRL_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest tests/vllm`"
)


def running_under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def under_ci() -> bool:
    """CI itself, or any run that set a require flag (the CI scripts and the GPU run do)."""
    return running_under_ci() or any(os.environ.get(flag) == "1" for flag in FLAGS.values())


def is_required(kind: str) -> bool:
    """Whether a missing ``kind`` must fail the tests rather than skip them."""
    if os.environ.get(FLAGS[kind]) == "1":
        return True
    return kind in IMPLIED_BY_CI and running_under_ci()


def why_required(kind: str) -> str:
    return f"{FLAGS[kind]}=1" if os.environ.get(FLAGS[kind]) == "1" else "CI is set"


def unavailable(kind: str, reason: str, *, module_level: bool = False) -> NoReturn:
    """Fail (required) or skip (local run): ``reason`` says what is missing and how to get it."""
    if is_required(kind):
        pytest.fail(f"{why_required(kind)} but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def require_module(name: str, kind: str = "deps", hint: str = SETUP_HINT) -> ModuleType:
    """Import ``name`` for a test module; missing → skip the module, or fail it under CI.

    ``kind``: whose environment is broken when it is missing (``vllm`` for tests/vllm)."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        unavailable(kind, f"{name} cannot be imported ({error}); {hint}", module_level=True)


def is_installed(name: str) -> bool:
    """Whether ``name`` can be found, without importing it (megatron-bridge needs a TE stand-in)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


MEGATRON_PACKAGES = ("megatron.core", "megatron.bridge")
MEGATRON_HINT = (
    "run `bash .ci/setup` (megatron extra + megatron-bridge without its CUDA dependencies, "
    "docs/megatron.md)"
)


def megatron_problem() -> str | None:
    missing = [name for name in MEGATRON_PACKAGES if not is_installed(name)]
    return f"{', '.join(missing)} not installed; {MEGATRON_HINT}" if missing else None


def require_megatron() -> None:
    """The gate of the ``megatron`` marker."""
    problem = megatron_problem()
    if problem is not None:
        unavailable("deps", problem)
