"""GLM-4.7-Flash's decoder (glm4_moe_lite: MLA attention, a dense first block, routed +
shared experts), which only transformers >= 5 builds, trains through the Automodel backend
with FSDP alone (``TRANSFORMERS_5_MODEL_TYPES`` in hpcrl.config.architectures). Runs under
.venv-vllm (transformers 5).

A tiny random checkpoint goes through one in-process worker (gloo, world size 1): its
log-probs equal the model's own forward, steps on one batch lower the loss, and the weights
it refits carry the checkpoint's key names and shapes. Expert parallelism (its MoE block is
DeepSeek-V3's under another name) over 2 gloo ranks equals one process (tests/transformers5/
ep_worker.py).
"""

from __future__ import annotations

import socket

import torch

from tests.core.parallel_harness import make_batch, masked_nll_loss, reference_logprobs

CONFIG = dict(
    vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    tie_word_embeddings=False, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
    moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1,
    q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
)  # fmt: skip


def build(path: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcrl.core.models.tiny import build_char_tokenizer

    torch.manual_seed(0)
    config = AutoConfig.for_model("glm4_moe_lite", **CONFIG)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


def test_glm4_moe_lite_loads_matches_its_forward_trains_and_refits_its_names(tmp_path):
    import torch.distributed as dist
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpcrl.core.backends.automodel.worker import AutomodelWorker
    from hpcrl.core.backends.base import RankInfo
    from hpcrl.core.models.buildable import unbuildable_model
    from hpcrl.core.workers.sharding import split_micro_batches
    from tests.recipe_builder import tiny_automodel_recipe, with_policy

    path = build(str(tmp_path / "glm"))
    checkpoint = load_file(f"{path}/model.safetensors")
    recipe = with_policy(tiny_automodel_recipe(micro_batch_size=2, lr=1e-2), model_name=path)
    assert unbuildable_model(recipe, path) is None  # this Python's transformers has it

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                    master_addr="127.0.0.1", master_port=port, device="cpu")  # fmt: skip
    worker = AutomodelWorker()
    try:
        worker.setup(recipe, info, path)
        batch = make_batch(seed=3, batch_size=4)
        mask = batch["attention_mask"].bool()
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = reference_logprobs(reference, batch)
        got = worker.logprobs(batch)
        torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=0)
        tokens = float(batch["token_mask"].sum())
        losses = [
            worker.train_step(split_micro_batches(batch, 2), masked_nll_loss, tokens)["loss"]
            for _ in range(3)
        ]
        assert losses[-1] < losses[0]
        refit = dict(worker.export_hf_weights())
    finally:
        worker.close()
        dist.destroy_process_group()
    assert {k: tuple(v.shape) for k, v in refit.items()} == {
        k: tuple(v.shape) for k, v in checkpoint.items()
    }


def test_glm4_moe_lite_at_expert_parallel_2_equals_one_process(tmp_path):
    """Each rank keeps 2 of the 4 routed experts; log-probs, one step's loss and gradient
    norm (blocks recomputed in backward), and the weights refitted after it (the checkpoint's
    per-expert names) are one process's."""
    from safetensors.torch import load_file

    from tests.transformers5.ep_worker import assert_ep_matches_one_process

    path = build(str(tmp_path / "glm"))
    checkpoint = load_file(f"{path}/model.safetensors")
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in checkpoint  # vLLM loads these
    # with activation checkpointing, as NeMo RL's GLM-4.7-Flash recipe (the exchange without
    # it: DeepSeek-V3's block, tests/core/test_expert_parallel.py)
    assert_ep_matches_one_process(path, str(tmp_path / "result"), checkpoint, checkpointing=True)
