"""One rank without FSDP (``apply_autocast``) computes as FSDP's bf16 mixed precision does: the
residual stream in bf16 from the embedding's output on, not in fp32 as autocast alone leaves
it (``parallelize.apply_autocast``; docs/performance.md, issue 25 item 1).

CPU's bf16 autocast casts linear weights as CUDA's does; FSDP2 runs at world 1 over gloo in a
forked process, its ``MixedPrecisionPolicy`` the one the worker gives it on several GPUs.
"""

from __future__ import annotations

import os
import socket

from tests.require import require_module

torch = require_module("torch")
require_module("transformers")

import torch.multiprocessing as mp  # noqa: E402


def _tiny_root():
    """A 2-layer Llama (fp32 weights; its norm weights perturbed away from 1.0 to values bf16
    holds exactly) in the backend's root module."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hpcrl.core.backends.automodel.model import TokenLogprobModel

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).float()
    hf.config.use_cache = False
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight"):
                # bf16 values: FSDP's bf16 copy of them is exact
                param.add_(torch.randn_like(param) * 0.1).copy_(param.bfloat16())
            else:
                param.mul_(4.0)  # larger activations: the fp32 / bf16 residual differ more
    return TokenLogprobModel(hf)


def _ids() -> torch.Tensor:
    return torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))


def _layer_input_dtypes(root) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    hooks = [
        layer.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(args[0].dtype),
                                        with_kwargs=True)  # fmt: skip
        for layer in root.hf.model.layers
    ]
    with torch.no_grad():
        root(_ids(), None)
    for hook in hooks:
        hook.remove()
    return seen


def test_one_rank_s_residual_stream_is_bf16_and_the_cast_can_be_removed():
    from hpcrl.core.backends.automodel.parallelize import apply_autocast

    root = _tiny_root()
    apply_autocast(root, torch.bfloat16)
    assert _layer_input_dtypes(root) == [torch.bfloat16, torch.bfloat16]
    root.residual_cast.remove()
    assert _layer_input_dtypes(root) == [torch.float32, torch.float32]
    fp32_root = _tiny_root()
    apply_autocast(fp32_root, None)  # no mixed precision: nothing cast
    assert fp32_root.residual_cast is None
    assert _layer_input_dtypes(fp32_root) == [torch.float32, torch.float32]


def _logprobs_under_fsdp(port: int, out: str) -> None:
    """World 1 over gloo: the root under FSDP2 with the worker's bf16 mixed precision."""
    import torch.distributed as dist

    from hpcrl.core.backends.automodel.parallelize import (
        MeshShape,
        apply_fsdp,
        build_mesh,
        data_parallel_mesh,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        shape = MeshShape.for_world(1, 1, 1)
        root = _tiny_root()
        mesh = data_parallel_mesh(build_mesh("cpu", shape), shape)
        apply_fsdp(root, root.hf, mesh, param_dtype=torch.bfloat16, cpu_offload=False)
        with torch.no_grad():
            logprobs, _ = root(_ids(), None)
        torch.save(logprobs.float(), out)
    finally:
        dist.destroy_process_group()


def _run_fsdp(out: str) -> torch.Tensor:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(
        lambda _rank: _logprobs_under_fsdp(port, out), nprocs=1, start_method="fork"
    )
    return torch.load(out)


def _one_rank_logprobs(cast: bool) -> torch.Tensor:
    from hpcrl.core.backends.automodel.parallelize import apply_autocast

    root = _tiny_root()
    apply_autocast(root, torch.bfloat16)
    if not cast:
        root.residual_cast.remove()
    with torch.no_grad():
        logprobs, _ = root(_ids(), None)
    return logprobs.float()


def test_one_rank_s_log_probs_are_fsdp_bf16_mixed_precision_s(tmp_path):
    under_fsdp = _run_fsdp(str(tmp_path / "fsdp.pt"))
    one_rank = _one_rank_logprobs(cast=True)
    fp32_residual = _one_rank_logprobs(cast=False)
    # Equal where the norm weights are bf16 values (random init's 1.0, or as here): the norm's
    # fp32 product is rounded once either way. With other norm weights one rank keeps them in
    # fp32, a rounding FSDP adds. The fp32 residual stream lacks every add's bf16 rounding.
    torch.testing.assert_close(one_rank, under_fsdp, atol=1e-6, rtol=0)
    assert (fp32_residual - under_fsdp).abs().max() > 1e-3
