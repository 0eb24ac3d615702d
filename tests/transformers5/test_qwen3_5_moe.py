"""Qwen3.5 MoE checkpoints (qwen3_5_moe: ``Qwen3_5MoeForConditionalGeneration``, transformers
>= 5 only; NeMo RL's grpo-qwen3.5-35ba3b automodel recipes) train on text through the
Automodel backend: the whole wrapper loaded, its text decoder (Gated DeltaNet linear-attention
layers beside full attention, routed experts beside a gated shared expert) run, the vision
tower frozen. Runs under .venv-vllm (transformers 5), where the Gated DeltaNet runs
transformers' pure-torch path (no flash-linear-attention, no causal-conv1d).

A tiny random checkpoint: one in-process worker's log-probs equal the wrapper's own forward,
steps lower the loss, refits and exports carry the checkpoint's key names (experts per
expert, as the hub's checkpoint stores them) with the vision weights untouched; FSDP2 over 2
gloo ranks, and expert parallelism 2 with activation checkpointing (as the recipes set
them), equal one process (tests/transformers5/ep_worker.py).
"""

from __future__ import annotations

import torch

from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.core.test_multimodal_text_models import (  # noqa: F401 -- worker_on: a fixture
    build_tiny,
    saved_tensors,
    worker_on,
    wrapper_logprobs,
)

#: one linear-attention and one full-attention layer; 4 experts of which 2 per token, and
#: linear-attention head counts unlike the expert count (the router's weight shape is its own)
TEXT = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, linear_conv_kernel_dim=4,
    linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    num_experts_per_tok=2, num_experts=4, layer_types=["linear_attention", "full_attention"],
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                         mrope_section=[1, 1, 0], mrope_interleaved=True),
)  # fmt: skip
#: special tokens above the ids make_batch draws
CONFIGS = {
    "qwen3_5_moe": dict(
        text_config=TEXT,
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=32, patch_size=4, num_position_embeddings=16),
        image_token_id=120, video_token_id=121, vision_start_token_id=122,
        vision_end_token_id=123,
    )
}  # fmt: skip
#: NeMo RL's recipes: no load-balancing loss (hpcrl's Automodel forward adds none either)
OVERRIDES = {"text_config": {"router_aux_loss_coef": 0.0}}


def test_the_worker_trains_qwen3_5_moes_text_decoder_and_refits_in_the_checkpoint_layout(
    worker_on,  # noqa: F811 -- the imported fixture
    tmp_path,
):
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.models.buildable import unbuildable_model
    from hpcrl.core.workers.sharding import split_micro_batches
    from tests.recipe_builder import tiny_automodel_recipe, with_policy

    worker, path = worker_on("qwen3_5_moe", CONFIGS)
    checkpoint = saved_tensors(path)
    # the job's own check as it starts: this Python's transformers builds it
    assert unbuildable_model(with_policy(tiny_automodel_recipe(), model_name=path), path) is None
    assert type(worker.model.hf).__name__ == "Qwen3_5MoeForConditionalGeneration"
    # the hub's layout: experts per expert, the text decoder under model.language_model
    assert "model.language_model.layers.0.mlp.experts.3.gate_proj.weight" in checkpoint
    batch = make_batch(seed=3, batch_size=4)
    mask = batch["attention_mask"].bool()
    got = worker.logprobs(batch)
    torch.testing.assert_close(got[mask], wrapper_logprobs(path, batch)[mask], atol=1e-5, rtol=0)

    tokens = float(batch["token_mask"].sum())
    losses = [
        worker.train_step(split_micro_batches(batch, 2), masked_nll_loss, tokens)["loss"]
        for _ in range(3)
    ]
    assert losses[-1] < losses[0]

    refit = dict(worker.export_hf_weights())
    assert set(refit) == set(checkpoint)
    vision = [name for name in checkpoint if name.startswith("model.visual.")]
    assert vision
    for name, saved in checkpoint.items():
        assert refit[name].shape == saved.shape, name
        if name in vision:
            torch.testing.assert_close(refit[name], saved, atol=0, rtol=0, msg=name)
    trained = ("embed_tokens.weight", "layers.0.linear_attn.A_log", "layers.1.mlp.gate.weight")
    for name in (f"model.language_model.{part}" for part in trained):
        assert not torch.equal(refit[name], checkpoint[name]), name  # the decoder did train

    worker.export_hf(str(tmp_path / "export"))
    exported = saved_tensors(str(tmp_path / "export"))
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in checkpoint.items()}
    # a DCP checkpoint exported as hpcrl export does: the same folder
    from hpcrl.core.backends.automodel.export import export_dcp_to_hf

    worker.save_checkpoint(str(tmp_path / "dcp"))
    export_dcp_to_hf(tmp_path / "dcp", tmp_path / "from_dcp", path, path)
    from_dcp = saved_tensors(str(tmp_path / "from_dcp"))
    assert set(from_dcp) == set(exported)
    for name, tensor in exported.items():
        torch.testing.assert_close(from_dcp[name], tensor, atol=0, rtol=0, msg=name)

    # the recipes' nested override reaches the text decoder's config
    overridden = load_hf_model(path, "cpu", OVERRIDES)
    assert overridden.config.text_config.router_aux_loss_coef == 0.0


def test_qwen3_5_moe_with_fsdp_over_2_ranks_equals_one_process(tmp_path):
    """FSDP2 alone (expert_parallel_size 1) over 2 gloo ranks: log-probs, one step's loss
    and gradient norm, and the weights refitted after it equal one process's."""
    from tests.transformers5.ep_worker import assert_ep_matches_one_process

    path = build_tiny(tmp_path / "qwen3_5_moe", "qwen3_5_moe", CONFIGS)
    checkpoint = saved_tensors(path)
    assert_ep_matches_one_process(path, str(tmp_path / "result"), checkpoint, False, ep=1)


def test_qwen3_5_moe_at_expert_parallel_2_equals_one_process(tmp_path):
    """Each of 2 gloo ranks keeps 2 of the 4 routed experts (the gated shared expert runs
    on each rank's own tokens), blocks recomputed in backward as NeMo RL's recipes set it:
    log-probs, loss, gradient norm and the refitted weights (per-expert checkpoint names,
    which vLLM loads) equal one process's."""
    from tests.transformers5.ep_worker import assert_ep_matches_one_process

    path = build_tiny(tmp_path / "qwen3_5_moe", "qwen3_5_moe", CONFIGS)
    checkpoint = saved_tensors(path)
    assert_ep_matches_one_process(path, str(tmp_path / "result"), checkpoint, checkpointing=True)


def test_a_pack_would_carry_the_linear_attention_state_into_the_next_sequence(tmp_path):
    """Why validate refuses sequence packing for qwen3_5_moe: in a row of two sequences
    whose positions restart (how the backend runs a pack), transformers' torch Gated DeltaNet
    runs its convolution and recurrent state across the boundary, so the second sequence's
    hidden states differ from its own. When this fails, the refusal can go."""
    from transformers import AutoModelForImageTextToText

    path = build_tiny(tmp_path / "qwen3_5_moe", "qwen3_5_moe", CONFIGS)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    first, second = torch.randint(4, 100, (1, 7)), torch.randint(4, 100, (1, 5))
    positions = torch.cat([torch.arange(7), torch.arange(5)])[None]
    with torch.no_grad():
        alone = model.get_decoder()(input_ids=second, use_cache=False).last_hidden_state
        packed = model.get_decoder()(
            input_ids=torch.cat([first, second], 1), position_ids=positions, use_cache=False
        ).last_hidden_state
    assert (packed[:, 7:] - alone).abs().max() > 1e-2
