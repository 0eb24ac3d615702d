"""The Megatron backend on CPU: a scoped compatibility layer for megatron-core over gloo.

megatron-core is written for GPUs: a handful of code paths hard-code CUDA (device strings,
``torch.cuda.current_device()``, CUDA RNG state, ``Tensor.type()`` names). Everything else
(process groups, TP/PP/DP layers, DDP grad buffers, the distributed optimizer, the pipeline
schedules, dist_checkpointing) runs on CPU tensors over gloo once those few calls are
redirected. This module is the smallest such redirection. It is used only where the job's
device is CPU (``JobSpec.device``, handed to every rank as ``RankInfo.device``): the
Megatron worker enters it in ``setup`` and leaves it in ``close`` (``cpu_compat()``), and
the spawned HF→Megatron converter of a CPU job applies it for its short life
(``apply_for_process``). GPU jobs never touch it, and importing this module changes nothing.

Each patch is a ``CpuPatch`` that names the megatron-core code that needs it and the exact
source fragment it works around. Entering the layer first checks the installed versions
against ``SUPPORTED_PREFIXES`` and every fragment against the installed source, and stops
with ``CpuCompatError`` (what was found, what is supported, the fix) otherwise, so an
upgrade fails loudly instead of silently running unpatched (or needlessly patched) code.
Written and checked for megatron-core 0.16.x and 0.19.x (the lines CI and the GPU machine
run; their patched code is the same). The job's preflight refuses other versions for CPU
Megatron jobs before Ray starts (``hpcrl/plan/requirements.py``, same lines).

The TP>1 load fix of megatron-bridge lives here too (``bridge_contiguous_scatter``): a real
bug, not a CPU redirection, that only bites on gloo, in megatron-bridge 0.3.x (0.6.x makes the
pieces contiguous itself: the patch applies to 0.3.x only). Entering the layer imports the
bridge (with hpcrl's Transformer Engine placeholders, ``bridge_compat.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Release lines the patches were written and checked against ("0.16." matches 0.16.x):
# 0.16/0.3 install on Python 3.11 (CI), 0.19/0.6 need 3.12 (the GPU machine's stack).
# hpcrl/plan/requirements.py states the same lines for the preflight (a test holds them equal).
SUPPORTED_PREFIXES = {"megatron-core": ("0.16.", "0.19."), "megatron-bridge": ("0.3.", "0.6.")}
_PIP_LINES = {
    "megatron-core": "Python 3.11: `pip install 'megatron-core==0.16.*'`; Python 3.12: "
    "`pip install 'megatron-core==0.19.*'`",
    "megatron-bridge": "Python 3.11: `pip install --no-deps 'megatron-bridge==0.3.*'`; "
    "Python 3.12: `pip install --no-deps 'megatron-bridge==0.6.*'`",
}


@dataclasses.dataclass(frozen=True)
class CpuPatch:
    """One redirection: what it patches, why, and the upstream source it relies on."""

    name: str
    why: str
    # ("module:qualname", fragment): upstream code that must still contain the fragment this
    # patch works around, for the patch to be needed and correct.
    requires: tuple[tuple[str, str], ...]
    package: str = "megatron-core"
    # Release lines of ``package`` that need the patch (None: every supported line).
    lines: tuple[str, ...] | None = None

    def applies_to(self, versions: dict[str, str]) -> bool:
        return self.lines is None or versions[self.package].startswith(self.lines)


_RANDOM = "megatron.core.tensor_parallel.random"
_OPTIMIZER = "megatron.core.optimizer.optimizer"
_CLIP = "megatron.core.optimizer.clip_grads"
_BRIDGE_MAPPING = "megatron.bridge.models.conversion.param_mapping"

PATCHES = (
    CpuPatch(
        name="cpu_rng_tracker",
        why="CudaRNGStatesTracker.add/fork keep per-region RNG states with "
        "torch.cuda.get_rng_state/manual_seed; on CPU the states are the CPU generator's.",
        requires=(
            (f"{_RANDOM}:CudaRNGStatesTracker.add", "torch.cuda.get_rng_state()"),
            (f"{_RANDOM}:CudaRNGStatesTracker.add", "torch.cuda.manual_seed(seed)"),
            (f"{_RANDOM}:_get_cuda_rng_state", "torch.cuda.random.get_rng_state(device=device)"),
            (f"{_RANDOM}:_set_cuda_rng_state", "_C._cuda_setRNGState"),
        ),
    ),
    CpuPatch(
        name="current_device_is_cpu",
        why="RoPE moves inv_freq to torch.cuda.current_device(), DDP allocates grad/param "
        "buffers there, the pipeline p2p receive buffers too.",
        requires=(
            (
                "megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.get_emb",
                "self.inv_freq.to(device=torch.cuda.current_device())",
            ),
            (
                "megatron.core.distributed.param_and_grad_buffer:_ParamAndGradBuffer.__init__",
                "device=torch.cuda.current_device()",
            ),
            (
                "megatron.core.pipeline_parallel.p2p_communication:P2PCommunicator._communicate",
                "device=torch.cuda.current_device()",
            ),
        ),
    ),
    CpuPatch(
        name="cuda_synchronize_noop",
        why="The torch_dist checkpoint writer calls torch.cuda.synchronize() after staging "
        "tensors to host; CPU tensors need no synchronisation.",
        requires=(
            (
                "megatron.core.dist_checkpointing.strategies.filesystem_async:"
                "FileSystemWriterAsync.preload_tensors",
                "torch.cuda.synchronize()",
            ),
        ),
    ),
    CpuPatch(
        name="cuda_device_strings",
        why="Optimizer scalars (found_inf, loss scale) and grad-norm buffers are created "
        "with device='cuda'; a TorchFunctionMode maps that device to CPU.",
        requires=(
            (f"{_OPTIMIZER}:MixedPrecisionOptimizer.__init__", "device='cuda'"),
            (f"{_CLIP}:get_grad_norm_fp32", "device='cuda'"),
        ),
    ),
    CpuPatch(
        name="no_pinned_memory",
        why="Under context parallelism RoPE picks this rank's chunks with an index tensor "
        "made with pin_memory=True, which a CPU-only torch refuses; the mode drops the flag.",
        requires=(
            (
                "megatron.core.models.common.embeddings.rope_utils:get_pos_emb_on_this_cp_rank",
                "pin_memory=True",
            ),
        ),
        lines=("0.16.",),  # checked on 0.16 (CI); the mode drops the flag on any line
    ),
    CpuPatch(
        name="cuda_type_names",
        why="The optimizers accept params only if param.type() is a torch.cuda.*Tensor "
        "name; the mode reports CPU tensors under their CUDA type names.",
        requires=(
            (
                f"{_OPTIMIZER}:Float16OptimizerWithFloat16Params.__init__",
                "param.type() == 'torch.cuda.FloatTensor'",
            ),
            (
                "megatron.core.optimizer.distrib_optimizer:"
                "DistributedOptimizer._build_model_and_main_param_groups",
                "model_param.type() == 'torch.cuda.FloatTensor'",
            ),
            (
                f"{_CLIP}:clip_grad_by_total_norm_fp32",
                "param.grad.type() == 'torch.cuda.FloatTensor'",
            ),
        ),
    ),
    CpuPatch(
        name="cuda_current_stream_null",
        why="megatron-core 0.19's DDP grad sync first makes torch.cuda.current_stream() wait "
        "for CUDA-graph replay events; on CPU all work is synchronous, so a stream whose "
        "waits do nothing stands in.",
        requires=(
            (
                "megatron.core.distributed.param_and_grad_buffer:"
                "_ParamAndGradBucketGroup.start_grad_sync",
                "current_stream = torch.cuda.current_stream()",
            ),
        ),
        lines=("0.19.",),
    ),
    CpuPatch(
        name="bridge_contiguous_scatter",
        why="Loading HF weights at TP>1, the bridge splits each weight with torch.chunk and "
        "scatters the pieces from TP rank 0 as they are; pieces split along dim 1 (row-parallel "
        "weights: o_proj, down_proj) are non-contiguous views, and gloo's scatter sends such "
        "a view's storage as if it were contiguous: those ranks silently get wrong weights "
        "(torch 2.13). The patch hands the scatter contiguous copies; "
        "test_bridge_tp_load.py proves both the fix and that the bug is still there.",
        requires=(
            (
                f"{_BRIDGE_MAPPING}:MegatronParamMapping.scatter_to_tp_ranks",
                "scatter_list = [s.to(device=device, dtype=dtype) for s in splits]",
            ),
        ),
        package="megatron-bridge",
        lines=("0.3.",),
    ),
)


class CpuCompatError(RuntimeError):
    """The installed megatron-core/bridge is not what the layer was written for: the message
    says what was found, what is supported, and the fix."""


def _resolve(dotted: str) -> Any:
    module_name, _, qualname = dotted.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def installed_versions() -> dict[str, str]:
    """megatron-core and megatron-bridge versions (importing the bridge with the TE stand-in)."""
    import megatron.core

    from hpcrl.core.backends.megatron.bridge_compat import import_bridge

    bridge = import_bridge()
    return {"megatron-core": megatron.core.__version__, "megatron-bridge": bridge.__version__}


def check_versions(versions: dict[str, str]) -> None:
    """Only the versions the patches were checked against; the message says what to do."""
    for package, version in versions.items():
        prefixes = SUPPORTED_PREFIXES[package]
        if not version.startswith(prefixes):
            supported = " and ".join(f"{prefix}x" for prefix in prefixes)
            raise CpuCompatError(
                f"the Megatron backend runs on CPU through hpcrl's compatibility layer "
                f"(hpcrl/core/backends/megatron/cpu_compat.py), which supports {package} "
                f"{supported} only; this Python has {package} {version}. Fix: install a "
                f"supported version in the job's environment ({_PIP_LINES[package]}; "
                f"docs/megatron.md, Install), or run the job on GPUs (a profile with "
                f"device: gpu), where the layer is not used. To move the layer to {package} "
                f"{version} instead: for every patch in PATCHES with package={package!r}, "
                f"re-read each `requires` function in the new source, update the patch and "
                f"its fragments until check_patches_apply() passes and tests/megatron "
                f"passes, then set SUPPORTED_PREFIXES[{package!r}] in "
                f"hpcrl/core/backends/megatron/cpu_compat.py and the matching row of "
                f"hpcrl/plan/requirements.py."
            )


def bridge_needs_contiguous_scatter() -> bool:
    """Whether the installed megatron-bridge has the TP>1 gloo scatter bug (0.3.x)."""
    (patch,) = [p for p in PATCHES if p.name == "bridge_contiguous_scatter"]
    return patch.applies_to(installed_versions())


def check_patches_apply() -> None:
    """Fail loudly if the installed megatron-core/bridge is not the code the patches were made for."""
    versions = installed_versions()
    check_versions(versions)
    for patch in PATCHES:
        if not patch.applies_to(versions):
            continue
        version = f"{patch.package} {versions[patch.package]}"
        for consumer, fragment in patch.requires:
            try:
                source = inspect.getsource(_resolve(consumer))
            except (AttributeError, ImportError) as err:
                raise CpuCompatError(
                    f"patch {patch.name} no longer applies to {version}: {consumer} is gone ({err})"
                ) from err
            if fragment not in source:
                raise CpuCompatError(
                    f"patch {patch.name} no longer applies to {version}: "
                    f"{consumer} no longer contains {fragment!r}"
                )


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


class _CudaOnCpuMode(TorchFunctionMode):
    """device='cuda' → cpu, pin_memory → off, Tensor.cuda() → no-op, Tensor.type() →
    torch.cuda.* names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and args[1:2] and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name
        return func(*args, **kwargs)


def _active_on_this_thread() -> bool:
    from torch.overrides import _get_current_function_mode_stack

    return any(isinstance(mode, _CudaOnCpuMode) for mode in _get_current_function_mode_stack())


def _cpu_rng_add(self, name: str, seed: int) -> None:
    """CudaRNGStatesTracker.add on the CPU generator (same bookkeeping as upstream)."""
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    self.seeds_.add(seed)
    if name in self.states_:
        raise Exception(f"cuda rng state {name} already exists")
    original_state = torch.get_rng_state()
    torch.random.default_generator.manual_seed(seed)
    self.states_[name] = torch.get_rng_state()
    torch.set_rng_state(original_state)


def _cpu_get_rng_state(device="cuda", clone=False, graph_safe=False) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False) -> None:
    torch.set_rng_state(new_state)


class _NullStream:
    """``torch.cuda.current_stream()`` on CPU: work is synchronous, there is nothing to wait for."""

    def wait_event(self, event: object) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _contiguous_scatter(original: Callable) -> Callable:
    """``scatter_to_tp_ranks`` that hands gloo contiguous pieces (same values, own storage)."""

    def scatter_to_tp_ranks(self, splits, *args, **kwargs):
        if splits:
            splits = [split.contiguous() for split in splits]
        return original(self, splits, *args, **kwargs)

    return scatter_to_tp_ranks


def _replacements(skip: frozenset[str]) -> list[tuple[object, str, Callable]]:
    """(owner, attribute, replacement) per patch not in ``skip`` that the installed lines need."""
    from megatron.bridge.models.conversion import param_mapping
    from megatron.core.tensor_parallel import random as mcore_random

    mapping = param_mapping.MegatronParamMapping
    by_patch: dict[str, list[tuple[object, str, Callable]]] = {
        "cpu_rng_tracker": [
            (mcore_random.CudaRNGStatesTracker, "add", _cpu_rng_add),
            (mcore_random, "_get_cuda_rng_state", _cpu_get_rng_state),
            (mcore_random, "_set_cuda_rng_state", _cpu_set_rng_state),
        ],
        "current_device_is_cpu": [(torch.cuda, "current_device", lambda: torch.device("cpu"))],
        "cuda_synchronize_noop": [(torch.cuda, "synchronize", lambda device=None: None)],
        "cuda_current_stream_null": [
            (torch.cuda, "current_stream", lambda device=None: _NullStream())
        ],
        "bridge_contiguous_scatter": [
            (mapping, "scatter_to_tp_ranks", _contiguous_scatter(mapping.scatter_to_tp_ranks))
        ],
    }
    unknown = skip - {patch.name for patch in PATCHES}
    assert not unknown, f"no such patches: {sorted(unknown)}"
    versions = installed_versions()
    needed = {patch.name for patch in PATCHES if patch.applies_to(versions)} - skip
    return [entry for name, entries in by_patch.items() if name in needed for entry in entries]


def _apply(skip: frozenset[str] = frozenset()) -> Callable[[], None]:
    """Apply every patch not in ``skip`` (checked first); returns the function that undoes them.

    ``skip`` exists for tests that prove a patch is still needed; the two patches served by
    the TorchFunctionMode (cuda_device_strings, cuda_type_names) cannot be skipped. Where the
    layer is already on (its mode is on this thread's stack: a worker set up inside a test
    rank that applied it, or a second worker in one process) nothing more is applied and the
    outer application, with its ``skip``, stays in charge."""
    if _active_on_this_thread():
        return lambda: None
    check_patches_apply()
    assert not skip & {"cuda_device_strings", "cuda_type_names"}, "mode patches are not skippable"
    replacements = _replacements(skip)
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in replacements]
    for owner, attr, new in replacements:
        setattr(owner, attr, new)
    mode = _CudaOnCpuMode()
    mode.__enter__()

    def undo() -> None:
        mode.__exit__(None, None, None)
        for owner, attr, old in originals:
            setattr(owner, attr, old)

    return undo


@contextlib.contextmanager
def cpu_compat(skip: frozenset[str] = frozenset()) -> Iterator[None]:
    """megatron-core on CPU for the duration of the block: every patch but ``skip`` (checked
    first, undone after). Enter and leave it on one thread: the TorchFunctionMode is the
    thread's."""
    undo = _apply(skip)
    try:
        yield
    finally:
        undo()


def apply_for_process(skip: frozenset[str] = frozenset()) -> None:
    """In a spawned child of a CPU job that exits after its work (the HF→Megatron converter, a
    test rank): imports the bridge, applies every patch but ``skip``, never undoes them."""
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge

    import_bridge()
    _apply(skip)
