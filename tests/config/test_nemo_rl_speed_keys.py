"""NeMo RL keys of issue 24's second list, each as NeMo RL's code treats it:

- ``policy.refit_buffer_size_gb`` (its nemotron3-super recipes: 8): the GiB per bucket of
  its colocated refit (``refit_policy_generation``: a bucket size, else a share of free
  memory): the same weights, in other pieces; accepted whatever it holds, with the reason.
- ``policy.sequence_packing.train_mb_tokens`` below ``max_total_sequence_length`` (49152 of
  65536 in the same recipes): NeMo RL's packer raises only when a sequence that long arrives
  (``Sequence length ... exceeds bin capacity``); hpcrl's does the same, so the budget is a
  warning at plan time, not a refusal.
"""

from __future__ import annotations

import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.config.recipe import SequencePackingCfg
from hpcrl.core.workers.micro_batches import BatchingSettings, plan_shards
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl
from tests.recipe_builder import megatron_recipe, with_policy

PACK = "policy.sequence_packing"


def test_refit_buffer_size_is_accepted_as_a_bucket_size():
    path = "policy.refit_buffer_size_gb"
    loaded = load_as_hpcrl(config_path("grpo_math_1B.yaml"), [f"+{path}=8"])
    (entry,) = [key for key in loaded.unused_nemo_rl_keys if key.path == path]
    assert entry.value == 8 and not entry.at_default
    assert "in how many pieces the same weights reach the engine" in entry.why


def test_automodel_attn_implementation_is_a_kernel_choice():
    """NeMo RL passes automodel_kwargs to from_pretrained (its dapo-mistral-medium recipe:
    attn_implementation: eager); which kernel computes attention is accepted with the
    reason, any other extra from_pretrained argument is still refused."""
    kwargs = "policy.dtensor_cfg.automodel_kwargs"
    loaded = load_as_hpcrl(
        config_path("grpo_math_1B.yaml"), [f"+{kwargs}.attn_implementation=eager"]
    )
    path = f"{kwargs}.attn_implementation"  # named as the user wrote it
    (entry,) = [key for key in loaded.unused_nemo_rl_keys if key.path == path]
    assert entry.value == "eager" and "not what it computes" in entry.why
    with pytest.raises(ConfigError, match=r"automodel_kwargs.*extra from_pretrained arguments"):
        load_as_hpcrl(config_path("grpo_math_1B.yaml"), [f"+{kwargs}.trust_remote_code=true"])


def test_a_packing_budget_below_the_longest_sequence_warns_as_nemo_rl_fails_late():
    overrides = [f"{PACK}.enabled=true", f"{PACK}.train_mb_tokens=256"]
    loaded = load_as_hpcrl(config_path("grpo_math_1B.yaml"), overrides)
    (warning,) = [w for w in loaded.warnings if w.path == f"{PACK}.train_mb_tokens"]
    assert warning.format() == (
        f"warning: {PACK}.train_mb_tokens = 256: smaller than "
        "policy.max_total_sequence_length (512): a sequence longer than 256 tokens stops the "
        "job with an error, as it stops NeMo RL's\n"
        f"  fix: set {PACK}.train_mb_tokens to at least 512 (NeMo RL writes "
        "max_total_sequence_length x micro-batch size) if sequences may grow that long"
    )


def test_the_packer_packs_what_fits_and_stops_on_a_longer_sequence():
    recipe = with_policy(
        megatron_recipe(), max_total_sequence_length=512,
        sequence_packing=SequencePackingCfg(enabled=True, train_mb_tokens=256),
    )  # fmt: skip
    settings = BatchingSettings.from_recipe(recipe, "train")
    (plan,) = plan_shards([[100, 120, 200]], 512, settings)
    assert sorted(row for spec in plan for row in spec.rows) == [0, 1, 2]
    assert all(spec.pack_width <= 256 for spec in plan)
    with pytest.raises(ValueError, match="a sequence of 320 tokens does not fit a pack of 256"):
        plan_shards([[100, 320]], 512, settings)


def test_attention_backend_reaches_the_provider_and_needs_te_for_its_kernels():
    """NeMo RL sets megatron-core's AttnBackend[name] on the model config (its grpo-cispo
    recipe: flash); hpcrl does the same in apply_megatron_cfg (tests/core/
    test_consumers_downstream.py), and a TE kernel on a machine without TE is refused."""
    from hpcrl.plan.machine_needs import machine_needs

    path = "policy.megatron_cfg.attention_backend"
    loaded = load_as_hpcrl(config_path("grpo_math_1B_megatron.yaml"), [f"++{path}=flash"])
    assert loaded.recipe.policy.megatron_cfg.attention_backend == "flash"
    (need,) = machine_needs(loaded.recipe)
    assert (need.needs, need.path, need.value) == ("transformer_engine", path, "flash")


def test_a_built_in_refit_transport_is_accepted_with_vllm_only():
    """NeMo RL's grpo_math_8B_megatron_nixl.yaml: NIXL moves the same weights into vLLM
    (its sparse transports send lossless XOR/overwrite deltas); hpcrl refits through its
    own path. NeMo RL raises for a transport without vLLM; so does hpcrl, and a custom
    ``module:Class`` checkpoint engine (code hpcrl cannot vouch for) is refused."""
    from hpcrl.config import ConfigError

    loaded = load_as_hpcrl(config_path("grpo_math_8B_megatron_nixl.yaml"))
    assert loaded.recipe.policy.generation.refit_transport == "nixl"
    assert "policy.generation.refit_cfg" in {key.path for key in loaded.unused_nemo_rl_keys}
    for overrides, message in (
        (["policy.generation.backend=torch", "policy.generation.colocated.enabled=true"],
         "NeMo RL refuses it with the torch backend"),
        (["policy.generation.refit_transport=my.engines:Fast"], "'my.engines:Fast' is not one of"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            load_as_hpcrl(config_path("grpo_math_8B_megatron_nixl.yaml"), overrides)
        texts = [p.format() for p in caught.value.errors if p.path.endswith("refit_transport")]
        assert len(texts) == 1 and message in texts[0], texts
