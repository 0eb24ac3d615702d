"""Nemotron-H (model_type nemotron_h: Mamba-2, attention and MLP or MoE blocks; NeMo RL's
Nemotron Nano 12B v2 and Nemotron 3 recipes) on the Automodel backend, with transformers 5's
own classes (their Mamba-2 mixer falls back to its PyTorch path without mamba_ssm).

- Loaded as the backend loads models, its chunked log-probs equal the model's own forward,
  padding included, for the dense hybrid and the MoE hybrid.
- The MoE experts train in the checkpoint's per-expert layout (``expert_layout``): the
  state dict is the checkpoint file, and the gradients equal transformers' fused experts'.
- FSDP2 over 2 gloo ranks (with activation checkpointing) and expert parallelism over
  them take the same steps as one process (the harness of tests/core/test_expert_parallel).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.core.test_expert_parallel import reference, run_ranks

SHAPE = dict(
    vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=48, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2,
    conv_kernel=4, chunk_size=8, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
    max_position_embeddings=64, tie_word_embeddings=False,
)  # fmt: skip
BLOCKS = {
    "dense": ["mamba", "mlp", "attention", "mamba"],
    "moe": ["mamba", "moe", "attention", "moe"],
}


def build(folder: Path, kind: str, **more: int) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    config = AutoConfig.for_model("nemotron_h", layers_block_type=BLOCKS[kind], **SHAPE, **more)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_backend_logprobs_equal_the_models_own_forward(tmp_path, kind):
    from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
    from hpcrl.core.backends.automodel.parallelize import decoder_layers

    hf = load_hf_model(build(tmp_path / kind, kind), "cpu").eval()
    assert hf.config.model_type == "nemotron_h" and hf.config._attn_implementation == "sdpa"
    assert len(decoder_layers(hf)) == len(BLOCKS[kind])
    ids = torch.randint(4, 64, (3, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # right padding, as the backend pads
    with torch.no_grad():
        got, _ = TokenLogprobModel(hf, chunk_tokens=8)(ids, mask)
        logits = hf(input_ids=ids, attention_mask=mask).logits.float()
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    real = mask[:, 1:].bool()
    torch.testing.assert_close(got[:, 1:][real], want[real], atol=1e-5, rtol=0)


def test_moe_experts_train_in_the_checkpoint_layout(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.expert_layout import (
        checkpoint_named_tensors,
        unfuse_experts,
    )
    from hpcrl.core.backends.automodel.model import load_hf_model

    path = build(tmp_path / "moe", "moe")
    backend = load_hf_model(path, "cpu")
    on_disk = load_file(str(Path(path) / "model.safetensors"))
    state = dict(backend.state_dict())
    assert "model.layers.1.mixer.experts.3.up_proj.weight" in state  # one module per expert
    # what refits hand vLLM: the checkpoint's names (Nemotron-H's files say backbone.)
    named = dict(checkpoint_named_tensors(backend, list(state.items())))
    assert sorted(named) == sorted(on_disk)
    for name, tensor in named.items():
        assert torch.equal(tensor, on_disk[name]), name

    ids = torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(2))
    grads = []
    for unfuse in (False, True):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if unfuse:
            assert unfuse_experts(model) == 2
        model(input_ids=ids, labels=ids).loss.backward()
        named = [(n, p.grad if p.grad is not None else torch.zeros_like(p))
                 for n, p in model.named_parameters()]  # fmt: skip
        grads.append(dict(checkpoint_named_tensors(model, named)))
    fused, unfused = grads
    assert sorted(fused) == sorted(unfused)
    for name, grad in unfused.items():
        torch.testing.assert_close(grad, fused[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("ep", "checkpointing", "latent"),
    [
        (1, True, None),  # FSDP2 alone, blocks recomputed in backward
        (2, False, None),
        (2, False, 16),  # experts in a latent space (moe_latent_size: fc1/fc2 around them)
    ],
)
def test_fsdp_and_expert_parallel_train_as_one_process(tmp_path, ep, checkpointing, latent):
    path = build(tmp_path / "moe", "moe", **({} if latent is None else {"moe_latent_size": latent}))
    want_losses, want_norms, want_weights = reference(path, world=2)
    for result in run_ranks(path, 2, ep, tmp_path / "result", checkpointing):
        assert result["losses"] == pytest.approx(want_losses, rel=1e-5)
        assert result["norms"] == pytest.approx(want_norms, rel=1e-5)
        assert sorted(result["weights"]) == sorted(want_weights)
        for name, tensor in want_weights.items():
            torch.testing.assert_close(result["weights"][name], tensor, atol=1e-4, rtol=1e-5)
