"""The trainer's current weights as HF-named tensors, for refitting a vLLM engine.

Runs on a training worker with its ``BackendWorker`` (called through ``TrainingWorker.run``
or directly). Every rank must call together: gathering sharded weights is a collective.

- Automodel (FSDP2 / HSDP / TP): the full, unsharded state dict of the HF model
  (``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
  ``full_state_dict=True``), names as Hugging Face writes them.
- Megatron: megatron-bridge's ``export_hf_weights`` over the worker's ``model_chunks``
  (gathers TP/PP shards, HF names; the conversion ``export_hf`` writes to disk), with a bridge
  built once from the worker's ``model_path`` and kept on the worker.
- Any other backend: a method ``export_hf_weights() -> Iterable[tuple[str, Tensor]]`` (HF
  names, full tensors, on every rank), which also takes precedence over the two above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcrl.core.generation.vllm_engine import hf_named_tensors

if TYPE_CHECKING:
    import torch

# A backend method that exports its weights itself (see the module docstring).
EXPORT_HOOK = "export_hf_weights"
# Attribute of a Megatron worker that holds the megatron-bridge used for refits.
BRIDGE_ATTR = "_hpcrl_vllm_bridge"


def gathered_hf_weights(backend: Any, *, cpu: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Full HF-named weights of ``backend``'s current model, on every rank."""
    hook = getattr(backend, EXPORT_HOOK, None)
    if hook is not None:
        return [(name, (t.cpu() if cpu else t).detach()) for name, t in hook()]
    if hasattr(backend, "model_chunks"):
        return megatron_hf_weights(backend, cpu=cpu)
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "hf"):
        raise NotImplementedError(
            f"vLLM refit has no weight export for {type(backend).__name__}: a backend worker "
            "needs Automodel's `model.hf`, Megatron's `model_chunks` + `model_path`, or an "
            f"`{EXPORT_HOOK}()` method returning (HF name, full tensor) pairs"
        )
    return automodel_hf_weights(model, cpu=cpu)


def megatron_hf_weights(backend: Any, *, cpu: bool = True) -> list[tuple[str, torch.Tensor]]:
    """megatron-bridge export of the worker's current ``model_chunks`` (a collective)."""
    bridge = getattr(backend, BRIDGE_ATTR, None)
    if bridge is None:
        from hpcrl.core.backends.megatron.bridge_compat import import_bridge

        bridge = import_bridge().AutoBridge.from_hf_pretrained(backend.model_path)
        setattr(backend, BRIDGE_ATTR, bridge)
    import torch

    # Tensors that need no gather (norms, TP=1 weights) come back as the live parameters on
    # a CPU model; copy those, or the next optimizer step would change an export in place.
    live = {
        param.untyped_storage().data_ptr()
        for chunk in backend.model_chunks
        for param in chunk.parameters()
    }
    with torch.no_grad():  # the gathered tensors would otherwise carry autograd history
        exported = bridge.export_hf_weights(backend.model_chunks, cpu=cpu, show_progress=False)
        return [
            (name, tensor.detach().clone() if _storage(tensor) in live else tensor.detach())
            for name, tensor in exported
        ]


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


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
