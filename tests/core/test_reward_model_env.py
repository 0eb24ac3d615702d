"""NeMo RL's reward-model environment (hpcrl.core.environments.reward_model_env): rewards are
the sequence classifier's own forward on the conversations formatted as NeMo RL formats them."""

from __future__ import annotations

from pathlib import Path

import pytest

CONVERSATIONS = [
    [{"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "a long red"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there, friend"}],
]


@pytest.fixture(scope="module")
def reward_model_path(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random-init Qwen2 sequence classifier (num_labels 1) with the tiny model's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from hpcrl.core.models.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("rm")
    config = AutoConfig.from_pretrained(tiny_model_path, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(folder)
    tokenizer = load_tokenizer(tiny_model_path)
    # a chat template of the reward model's own (the tiny tokenizer ships none)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    tokenizer.save_pretrained(folder)
    return str(folder)


def _own_forward(path: str, ids: list[int]) -> float:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_rewards_equal_the_classifier_forward(reward_model_path: str) -> None:
    from hpcrl.core.environments.reward_model_env import RewardModelEnvironment

    env = RewardModelEnvironment(reward_model_path, precision="float32", batch_size=2)
    rewards = env.score_conversations(CONVERSATIONS)
    tokenizer = env.tokenizer
    for messages, reward in zip(CONVERSATIONS, rewards, strict=True):
        ids = env.token_ids(messages)
        # NeMo RL's form: the whole chat-templated conversation, BOS/EOS added where missing
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert tokenizer.decode(ids).rstrip("\n").endswith(tokenizer.eos_token)
        assert text.rstrip("\n") in tokenizer.decode(ids)
        assert reward == pytest.approx(_own_forward(reward_model_path, ids), abs=1e-5)
    assert len(set(rewards)) == len(rewards)  # different conversations, different scores
    # the prompt/response interface is the same two-turn conversation
    prompts = [m[0]["content"] for m in CONVERSATIONS]
    responses = [m[1]["content"] for m in CONVERSATIONS]
    assert env.score(prompts, responses, ["", "", ""]) == pytest.approx(rewards, abs=1e-6)


def test_truncates_to_max_model_len(reward_model_path: str) -> None:
    from hpcrl.core.environments.reward_model_env import RewardModelEnvironment

    env = RewardModelEnvironment(reward_model_path, precision="float32", max_model_len=7)
    ids = env.token_ids(CONVERSATIONS[2])
    assert len(ids) == 7
    assert env.score_conversations([CONVERSATIONS[2]]) == pytest.approx(
        [_own_forward(reward_model_path, ids)], abs=1e-5
    )


def test_metrics_and_refusals(reward_model_path: str, tmp_path: Path) -> None:
    from hpcrl.core.environments.reward_model_env import RewardModelEnvironment, reward_metrics

    metrics = reward_metrics([1.0, 2.0, 4.0])
    assert metrics == pytest.approx(
        {
            "reward_model_env/num_samples": 3.0,
            "reward_model_env/mean_reward": 7 / 3,
            "reward_model_env/std_reward": (
                ((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2
            )
            ** 0.5,
            "reward_model_env/min_reward": 1.0,
            "reward_model_env/max_reward": 4.0,
        }
    )
    with pytest.raises(ValueError, match="precision"):
        RewardModelEnvironment(reward_model_path, precision="int8")
    with pytest.raises(ValueError, match="not a local folder"):
        RewardModelEnvironment(reward_model_path, tokenizer_path=str(tmp_path / "missing"))


def test_ray_actor_scores_like_the_local_scorer(ray_cluster: None, reward_model_path: str) -> None:
    """The scorer in its own Ray actor (a CPU worker slot here) returns the same rewards."""
    from hpcrl.core.environments.reward_model_env import RewardModelEnvironment
    from hpcrl.core.workers.reward_model_actor import RewardModelActor

    kwargs = {"model_path": reward_model_path, "precision": "float32", "batch_size": 2}
    local = RewardModelEnvironment(**kwargs).score_conversations(CONVERSATIONS)
    actor = RewardModelActor(kwargs, device="cpu", cpus=1.0)
    try:
        assert actor.score_conversations(CONVERSATIONS) == pytest.approx(local, abs=1e-6)
    finally:
        actor.shutdown()
