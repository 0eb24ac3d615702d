"""Rank function of the direct bridge TP load test: megatron-bridge's own HF → Megatron load at
TP>1 (``provide_distributed_model`` scattering the HF weights from TP rank 0), the path hpcrl
itself never takes (it converts at TP=1 and reshards). Lives outside the test module so that
spawned ranks import it by a stable path."""

from __future__ import annotations

import torch


def _full_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits over the whole vocabulary: the TP ranks' vocab shards gathered in rank order."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    seq_len = input_ids.shape[1]
    position_ids = torch.arange(seq_len).expand_as(input_ids)
    with torch.no_grad():
        # attention_mask=None: the local spec's causal attention builds its own mask.
        shard = model(input_ids, position_ids, attention_mask=None).float().contiguous()
    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, shard, group=group)
    return torch.cat(parts, dim=-1)


def load_through_bridge(
    rank: int, world_size: int, hf_path: str, input_ids: torch.Tensor, export_dir: str
) -> torch.Tensor | None:
    """Load ``hf_path`` with TP=``world_size`` through the bridge, return full logits (rank 0)
    and save the model back to HF format in ``export_dir`` (every rank takes part)."""
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from hpcrl.core.backends.megatron.bridge_compat import save_hf_pretrained
    from hpcrl.core.backends.megatron.provider import use_local_spec

    bridge = AutoBridge.from_hf_pretrained(hf_path)
    provider = bridge.to_megatron_provider(load_weights=True)
    use_local_spec(provider)
    provider.tensor_model_parallel_size = world_size
    provider.params_dtype = torch.float32
    provider.finalize()
    parallel_state.initialize_model_parallel(world_size, 1)
    model_parallel_cuda_manual_seed(0)
    (model,) = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None
    )
    model.eval()
    logits = _full_logits(model, input_ids)
    save_hf_pretrained(bridge, [model], export_dir)
    return logits if rank == 0 else None
