"""model_overrides are merged into a fresh megatron-bridge provider (nested dicts into nested
config objects), unknown fields fail with their full path, and the persisted run config holds
the overridden values."""

from __future__ import annotations

import dataclasses

import pytest

from hpcrl.core.backends.megatron.provider import ModelOverrideError, apply_model_overrides


def _tiny_provider():
    from megatron.bridge.models import GPTModelProvider

    return GPTModelProvider(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        vocab_size=128,
        seq_length=16,
    )


@dataclasses.dataclass
class _Inner:
    rate: float = 0.1
    name: str = "a"


@dataclasses.dataclass
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    width: int = 1


def test_nested_dicts_follow_nested_config_objects():
    outer = _Outer()
    apply_model_overrides(outer, {"width": 3, "inner": {"rate": 0.5}})
    assert outer == _Outer(inner=_Inner(rate=0.5, name="a"), width=3)


def test_unknown_nested_field_names_its_full_path():
    with pytest.raises(
        ModelOverrideError,
        match=r"policy\.megatron_cfg\.model_overrides\.inner\.rat: .*did you mean rate",
    ):
        apply_model_overrides(_Outer(), {"inner": {"rat": 0.5}})


def test_real_provider_takes_overrides_and_rejects_unknown(megatron_cpu, tmp_path):
    from hpcrl.core.backends.megatron.hf_import import read_run_config, save_run_config

    provider = _tiny_provider()
    apply_model_overrides(
        provider, {"hidden_dropout": 0.0, "attention_dropout": 0.0, "layernorm_epsilon": 1e-6}
    )
    assert (provider.hidden_dropout, provider.layernorm_epsilon) == (0.0, 1e-6)
    with pytest.raises(ModelOverrideError) as error:
        apply_model_overrides(provider, {"hiden_dropout": 0.0})
    assert "policy.megatron_cfg.model_overrides.hiden_dropout" in str(error.value)
    assert "did you mean hidden_dropout" in str(error.value)

    provider.finalize()
    save_run_config(provider, tmp_path / "run_config.yaml")
    persisted = read_run_config(tmp_path)
    assert persisted["layernorm_epsilon"] == 1e-6 and persisted["hidden_dropout"] == 0.0
    assert persisted["_target_"].endswith("GPTModelProvider")
