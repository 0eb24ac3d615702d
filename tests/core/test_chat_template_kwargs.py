"""``policy.tokenizer.chat_template_kwargs`` (NeMo RL's; its nemotron3 and nanov3 recipes set
``enable_thinking``) reach every apply_chat_template call hpcrl makes: GRPO prompts, SFT
examples and the prompts of NeMo RL's named data sets; the arguments hpcrl sets itself are
refused by key."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.config.recipe import DatasetCfg, TokenizerCfg
from hpcrl.core.data import named
from hpcrl.core.data.prompts import encode_prompt, encode_sft_example, load_tokenizer
from hpcrl.core.models.tiny import resolve_model_path
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
    "{% if enable_thinking %}<think>{% endif %}"
)
THINKING = {"enable_thinking": True}


@pytest.fixture(scope="module")
def tokenizer():
    cfg = TokenizerCfg(chat_template=TEMPLATE)
    return load_tokenizer(resolve_model_path("tiny:qwen2"), cfg)


def text(tokenizer, ids) -> str:
    return tokenizer.decode(ids)


def test_grpo_prompts_and_sft_examples_are_rendered_with_them(tokenizer):
    assert text(tokenizer, encode_prompt(tokenizer, "1+1", True, THINKING)).endswith("<think>")
    assert not text(tokenizer, encode_prompt(tokenizer, "1+1", True)).endswith("<think>")
    ids, mask = encode_sft_example(tokenizer, "1+1", "2", 64, True, THINKING)
    prompt = text(tokenizer, [i for i, m in zip(ids, mask, strict=True) if m == 0.0])
    assert prompt.endswith("<think>")


def test_named_data_set_prompts_are_rendered_with_them(tokenizer):
    section = DatasetCfg(dataset_name="OpenMathInstruct-2")
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    with_kwargs = named.math_prompt(tokenizer, section, messages, THINKING)
    without = named.math_prompt(tokenizer, section, messages)
    assert text(tokenizer, with_kwargs["prompt_ids"]).endswith("<think>")
    assert not text(tokenizer, without["prompt_ids"]).endswith("<think>")


def test_nemo_rl_configs_value_loads_and_reserved_arguments_are_refused():
    path = config_path("grpo_math_1B.yaml")
    loaded = load_as_hpcrl(path, ["policy.tokenizer.chat_template_kwargs.enable_thinking=true"])
    assert loaded.recipe.policy.tokenizer.chat_template_kwargs == THINKING
    with pytest.raises(ConfigError) as caught:
        load_as_hpcrl(path, ["policy.tokenizer.chat_template_kwargs.tokenize=false"])
    assert [p.path for p in caught.value.errors] == [
        "policy.tokenizer.chat_template_kwargs.tokenize"
    ]
