"""``policy.dequantize_base_checkpoint`` (NeMo RL's gpt-oss recipes): an MXFP4 checkpoint
(``tests/core/mxfp4_checkpoint.py`` writes a tiny one, its expected weights computed from the
e2m1 codes and e8m0 scales) loads through transformers' own dequantization, exactly to the
expected values; without the setting it is refused by name (validate, the driver, the
loader); on an unquantized checkpoint the setting changes nothing; the Megatron backend,
which NeMo RL never passes it to, refuses it. Training from the dequantized checkpoint:
tests/core/test_gpt_oss.py."""

from __future__ import annotations

import attrs
import pytest
import torch

from hpcrl.config.architectures import architecture_problem, read_hf_config
from hpcrl.config.recipe import GenerationCfg
from hpcrl.config.rules import check_recipe
from tests.core.mxfp4_checkpoint import write_mxfp4_checkpoint
from tests.core.test_gpt_oss import build_tiny_gpt_oss
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy


def sft_recipe(model_name: str, **policy: object):
    """An SFT recipe on the Automodel backend (NeMo RL's gpt-oss recipes are SFT)."""
    from hpcrl.config.recipe import SftCfg

    grpo = automodel_recipe()
    return with_policy(attrs.evolve(grpo, grpo=None, sft=SftCfg()), model_name=model_name, **policy)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(unquantized folder, MXFP4 folder, expected dequantized experts by name)."""
    root = tmp_path_factory.mktemp("gpt-oss")
    plain = build_tiny_gpt_oss(root / "plain")
    expected = write_mxfp4_checkpoint(plain, root / "mxfp4")
    return plain, str(root / "mxfp4"), expected


def loaded_weights(path: str, dequantize: bool) -> dict[str, torch.Tensor]:
    """The backend's model's weights under the checkpoint's (unquantized) names."""
    from hpcrl.core.backends.automodel.expert_layout import checkpoint_named_tensors
    from hpcrl.core.backends.automodel.model import load_hf_model

    model = load_hf_model(path, "cpu", dequantize=dequantize)
    return dict(checkpoint_named_tensors(model, list(model.state_dict().items())))


def test_transformers_dequantizes_the_mxfp4_experts_to_the_expected_values(checkpoints):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Mxfp4Config

    plain, mxfp4, expected = checkpoints
    assert len(expected) == 4  # gate_up_proj and down_proj of both layers
    own = AutoModelForCausalLM.from_pretrained(
        mxfp4, quantization_config=Mxfp4Config(dequantize=True)
    ).state_dict()  # transformers alone, on CPU
    for name, weight in expected.items():
        assert own[name].dtype == torch.bfloat16
        assert torch.equal(own[name].float(), weight), name
    got = loaded_weights(mxfp4, dequantize=True)  # the backend: fp32 master weights
    unquantized = load_file(f"{plain}/model.safetensors")
    assert sorted(got) == sorted(unquantized)
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, expected.get(name, unquantized[name])), name


def test_an_mxfp4_checkpoint_without_dequantize_is_refused_by_name(checkpoints):
    from hpcrl.core.backends.automodel.model import load_hf_model

    _, mxfp4, _ = checkpoints
    recipe = sft_recipe(mxfp4)
    problem = architecture_problem(recipe, read_hf_config_of(mxfp4))
    assert problem is not None
    assert problem.one_line() == (
        "policy.dequantize_base_checkpoint = False: model MODEL stores weights in MXFP4 "
        "(quantization_config.quant_method 'mxfp4' in config.json), which hpcrl's Automodel "
        "backend cannot train as they are: it trains unquantized weights, dequantized to bf16 "
        "as the model loads; fix: set policy.dequantize_base_checkpoint=true (as NeMo RL's "
        "gpt-oss recipes do)"
    ).replace("MODEL", mxfp4)
    with pytest.raises(ValueError, match="dequantize_base_checkpoint=False: the checkpoint"):
        load_hf_model(mxfp4, "cpu", dequantize=False)
    dequantized = with_policy(recipe, dequantize_base_checkpoint=True)
    assert architecture_problem(dequantized, read_hf_config_of(mxfp4)) is None
    # GRPO would sample with vLLM from the MXFP4 checkpoint and refit bf16 weights into it
    grpo = with_policy(automodel_recipe(), model_name=mxfp4, dequantize_base_checkpoint=True)
    grpo = with_policy(grpo, generation=GenerationCfg(backend="vllm"))
    refused = architecture_problem(grpo, read_hf_config_of(mxfp4))
    assert refused is not None and refused.path == "policy.generation.backend"


def read_hf_config_of(path: str) -> dict:
    from pathlib import Path

    config = read_hf_config(Path(path))
    assert config is not None
    return config


def test_dequantize_on_an_unquantized_checkpoint_changes_nothing(checkpoints):
    plain, _, _ = checkpoints
    recipe = sft_recipe(plain, dequantize_base_checkpoint=True)
    assert architecture_problem(recipe, read_hf_config_of(plain)) is None
    with_it, without = loaded_weights(plain, True), loaded_weights(plain, False)
    assert sorted(with_it) == sorted(without)
    for name, tensor in with_it.items():
        assert torch.equal(tensor, without[name]), name


def test_the_megatron_backend_refuses_dequantize_base_checkpoint():
    recipe = with_policy(megatron_recipe(), dequantize_base_checkpoint=True)
    (problem,) = [p for p in check_recipe(recipe) if p.path == "policy.dequantize_base_checkpoint"]
    assert problem.value is True and "Automodel backend only" in problem.message
    assert not [p for p in check_recipe(with_policy(recipe, dequantize_base_checkpoint=False))
                if p.path == "policy.dequantize_base_checkpoint"]  # fmt: skip
