"""``policy.hf_config_overrides`` (NeMo RL's changes to the model's Hugging Face config, e.g.
``router_aux_loss_coef: 0.0`` in its nanov3 recipes, ``text_config: {...}`` in its qwen3.5
ones) reaches the model the Automodel backend trains, the torch sampler's model and vLLM's
``hf_overrides``; the Megatron backend, which cannot apply it yet, refuses it by key."""

from __future__ import annotations

import pytest
from transformers import LlavaConfig

from hpcrl.config import ConfigError
from hpcrl.core.backends.automodel.model import load_hf_model
from hpcrl.core.generation.engine import engine_spec
from hpcrl.core.generation.vllm_engine import engine_kwargs
from hpcrl.core.models.hf_config import apply_hf_config_overrides
from hpcrl.core.models.tiny import ensure_tiny_model
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

EPS = "policy.hf_config_overrides.rms_norm_eps=0.001"


def test_the_automodel_backend_builds_its_model_from_the_changed_config():
    path = ensure_tiny_model("tiny:qwen2")
    recipe = load_as_hpcrl(config_path("grpo_math_1B.yaml"), [EPS]).recipe
    assert recipe.policy.hf_config_overrides == {"rms_norm_eps": 0.001}
    model = load_hf_model(path, "cpu", recipe.policy.hf_config_overrides)
    # the modules are built with it, not only the config object
    assert model.model.norm.variance_epsilon == 0.001
    assert load_hf_model(path, "cpu").model.norm.variance_epsilon != 0.001


def test_the_samplers_get_the_same_overrides():
    recipe = load_as_hpcrl(config_path("grpo_math_1B.yaml"), [EPS]).recipe
    spec = engine_spec(recipe, "/models/m", "cuda")
    assert spec.hf_config_overrides == {"rms_norm_eps": 0.001}
    kwargs = engine_kwargs(
        spec.model_path,
        spec.vllm_cfg,
        device="cuda",
        seed=0,
        max_model_len=None,
        hf_overrides=spec.hf_config_overrides,
    )
    assert kwargs["hf_overrides"] == {"rms_norm_eps": 0.001}
    assert "hf_overrides" not in engine_kwargs(
        "/models/m", spec.vllm_cfg, device="cuda", seed=0, max_model_len=None
    )


def test_a_nested_mapping_changes_only_the_fields_it_names():
    config = LlavaConfig()
    vocab = config.text_config.vocab_size
    apply_hf_config_overrides(config, {"text_config": {"rms_norm_eps": 0.5}})
    assert (config.text_config.rms_norm_eps, config.text_config.vocab_size) == (0.5, vocab)


def test_a_field_the_config_does_not_have_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"policy\.hf_config_overrides\.text_config\.no_such"):
        apply_hf_config_overrides(LlavaConfig(), {"text_config": {"no_such": 1}})


def test_the_megatron_backend_refuses_them_by_key():
    with pytest.raises(ConfigError) as caught:
        load_as_hpcrl(
            config_path("grpo_math_1B_megatron.yaml"),
            ["policy.hf_config_overrides.router_aux_loss_coef=0.0"],
        )
    (problem,) = caught.value.errors
    assert problem.path == "policy.hf_config_overrides.router_aux_loss_coef"
    assert "Megatron backend" in problem.message and "Automodel" in problem.fix
