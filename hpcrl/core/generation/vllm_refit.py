"""The trainer's current weights as HF-named tensors, for refitting a vLLM engine.

Runs on a training worker with its ``BackendWorker`` (called through ``TrainingWorker.run``
or directly). Every rank must call together: gathering sharded weights is a collective.

- Automodel (FSDP2 / HSDP / TP): the full, unsharded state dict of the HF model
  (``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
  ``full_state_dict=True``), names as Hugging Face writes them.
- Megatron: exported through megatron-bridge by the Megatron worker. The hook is a method
  ``export_hf_weights() -> Iterable[tuple[str, Tensor]]`` on the Megatron backend worker
  (HF names, full tensors, on every rank that hosts an engine); until it exists, refit from
  Megatron raises an error that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcrl.core.generation.vllm_engine import hf_named_tensors

if TYPE_CHECKING:
    import torch

# Name of the Megatron-side hook (see the module docstring and docs/vllm.md).
MEGATRON_EXPORT_HOOK = "export_hf_weights"


def gathered_hf_weights(backend: Any, *, cpu: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Full HF-named weights of ``backend``'s current model, on every rank."""
    hook = getattr(backend, MEGATRON_EXPORT_HOOK, None)
    if hook is not None:
        return [(name, t.cpu() if cpu else t) for name, t in hook()]
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "hf"):
        raise NotImplementedError(
            f"vLLM refit has no weight export for {type(backend).__name__}: a backend worker "
            f"needs an Automodel-style `model.hf` or a `{MEGATRON_EXPORT_HOOK}()` method "
            "returning (HF name, full tensor) pairs"
        )
    return automodel_hf_weights(model, cpu=cpu)


def automodel_hf_weights(model: Any, *, cpu: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Unsharded state dict of an Automodel root (``TokenLogprobModel``) with HF names.

    ``cpu_offload`` stays off: with it only rank 0 receives tensors, and in colocated mode
    every rank feeds its own engine.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=False)
    )
    pairs = hf_named_tensors(state)
    if cpu:
        pairs = [(name, tensor.detach().cpu()) for name, tensor in pairs]
    return pairs
