"""LoRA on the Automodel backend, in one process: which linears NeMo RL's keys select, the
adapter's forward against the merged weights, and a NeMo RL LoRA config's values reaching
the model. The FSDP training, checkpoint, refit and export tests are in test_lora_fsdp.py."""

from __future__ import annotations

import attrs
import pytest
import torch

from hpcrl.config.recipe import LoraCfg
from hpcrl.core.backends.automodel.lora import (
    LoraLinear,
    apply_lora,
    merge_adapters,
    selected_linears,
)
from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
from hpcrl.core.models.tiny import ensure_tiny_model
from tests.core.parallel_harness import make_batch

BLOCK = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))


def _names(num_layers: int, parts: tuple[str, ...]) -> list[str]:
    return [f"model.layers.{i}.{part}" for i in range(num_layers) for part in parts]


def test_selection_follows_nemo_rl_rules(model_path: str) -> None:
    model = load_hf_model(model_path, "cpu")
    layers = model.config.num_hidden_layers
    assert selected_linears(model, LoraCfg(enabled=True)) == _names(layers, BLOCK) + ["lm_head"]
    targets = LoraCfg(enabled=True, match_all_linear=False, target_modules=("*q_proj", "*.v_*"))
    assert selected_linears(model, targets) == _names(
        layers, ("self_attn.q_proj", "self_attn.v_proj")
    )
    # NeMo RL's nanov3 recipes exclude with a wildcard on both sides
    excludes = LoraCfg(enabled=True, match_all_linear=False, exclude_modules=("*mlp*", "lm_head"))
    assert selected_linears(model, excludes) == _names(layers, BLOCK[:4])
    exact = LoraCfg(enabled=True, match_all_linear=False, target_modules=("lm_head",))
    assert selected_linears(model, exact) == ["lm_head"]


def test_nothing_selected_names_the_key_and_the_models_linears(model_path: str) -> None:
    model = load_hf_model(model_path, "cpu")
    none = LoraCfg(enabled=True, match_all_linear=False, target_modules=("*linear_qkv",))
    with pytest.raises(ValueError, match=r"policy.automodel_cfg.lora_cfg: .*linear_qkv.*"
                       r"select no linear layer.*q_proj"):  # fmt: skip
        apply_lora(model, none)


def test_base_frozen_adapters_shaped_by_rank_and_b_starts_at_zero(model_path: str) -> None:
    model = load_hf_model(model_path, "cpu")
    names = apply_lora(model, LoraCfg(enabled=True, dim=4, alpha=12))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{ab}.weight" for n in names for ab in "AB"}
    q_proj = model.get_submodule("model.layers.0.self_attn.q_proj")
    assert isinstance(q_proj, LoraLinear)
    assert q_proj.lora_A.weight.shape == (4, q_proj.in_features)
    assert q_proj.lora_B.weight.shape == (q_proj.out_features, 4)
    assert q_proj.scale == 3.0
    assert torch.count_nonzero(q_proj.lora_B.weight) == 0
    # xavier as NeMo Automodel does it: U(0, 1); uniform: Kaiming, centred on zero
    assert float(q_proj.lora_A.weight.detach().min()) >= 0.0
    kaiming = load_hf_model(model_path, "cpu")
    apply_lora(kaiming, LoraCfg(enabled=True, dim=4, lora_A_init="uniform"))
    assert (
        float(kaiming.get_submodule("model.layers.0.self_attn.q_proj").lora_A.weight.detach().min())
        < 0
    )


def _randomize_adapters(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_A.weight.copy_(torch.randn(module.lora_A.weight.shape, generator=gen))
                module.lora_B.weight.copy_(
                    0.05 * torch.randn(module.lora_B.weight.shape, generator=gen)
                )


@pytest.mark.parametrize("position", ["pre", "post"])
def test_merged_forward_equals_adapter_forward(model_path: str, position: str) -> None:
    cfg = LoraCfg(enabled=True, dim=4, alpha=16, dropout=0.3, dropout_position=position)
    adapted = load_hf_model(model_path, "cpu")
    apply_lora(adapted, cfg)
    _randomize_adapters(adapted, seed=1)
    named = list(TokenLogprobModel(adapted).state_dict().items())
    merged_named = merge_adapters([(n.removeprefix("hf."), t) for n, t in named], cfg.scale)
    assert not [n for n, _ in merged_named if "lora_" in n]
    merged = load_hf_model(model_path, "cpu")
    merged.load_state_dict(dict(merged_named), strict=True)
    base = load_hf_model(model_path, "cpu")
    q_name = "model.layers.1.self_attn.q_proj"
    q = adapted.get_submodule(q_name)
    expected_q = base.get_submodule(q_name).weight + 4.0 * q.lora_B.weight @ q.lora_A.weight
    torch.testing.assert_close(merged.get_submodule(q_name).weight, expected_q, atol=1e-6, rtol=0)

    batch = make_batch(seed=3)
    adapter_model, merged_model = TokenLogprobModel(adapted).eval(), TokenLogprobModel(merged)
    with torch.no_grad():
        got, _ = adapter_model(batch["input_ids"], batch["attention_mask"])
        want, _ = merged_model.eval()(batch["input_ids"], batch["attention_mask"])
        plain, _ = TokenLogprobModel(base).eval()(batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-4, rtol=1e-5)
    assert float((got[mask] - plain[mask]).abs().max()) > 1e-2  # the adapters matter
    # dropout acts in training only, where it said
    adapter_model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        dropped, _ = adapter_model(batch["input_ids"], batch["attention_mask"])
    assert float((dropped[mask] - got[mask]).abs().max()) > 1e-3


def test_a_nemo_rl_lora_config_validates_and_its_values_reach_the_model(model_path: str) -> None:
    from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

    recipe = load_as_hpcrl(config_path("recipes/llm/sft-llama3.1-8b-1n8g-fsdp2tp1-lora.yaml"))
    lora = recipe.recipe.policy.automodel_cfg.lora_cfg
    assert (lora.enabled, lora.dim, lora.alpha, lora.match_all_linear) == (True, 128, 128, True)
    assert (lora.dropout, lora.dropout_position, lora.lora_A_init) == (0.0, "post", "xavier")
    model = load_hf_model(model_path, "cpu")
    names = apply_lora(model, lora)
    assert names == _names(model.config.num_hidden_layers, BLOCK) + ["lm_head"]
    head = model.get_submodule("lm_head")
    assert (head.lora_A.weight.shape[0], head.scale) == (128, 1.0)

    grpo = load_as_hpcrl(config_path("recipes/llm/grpo-qwen3-8B-base-1n8g-fsdp2-lora.yaml"))
    grpo_lora = grpo.recipe.policy.automodel_cfg.lora_cfg
    assert (grpo_lora.enabled, grpo_lora.dim, grpo_lora.scale) == (True, 128, 1.0)
    # the nanov3 recipes' selection: every linear but *out_proj*
    nano = attrs.evolve(grpo_lora, match_all_linear=False, exclude_modules=("*o_proj*",))
    assert "model.layers.0.self_attn.o_proj" not in selected_linears(model, nano)
