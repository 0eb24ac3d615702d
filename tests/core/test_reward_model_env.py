"""NeMo RL's reward-model environment (hpcrl.core.environments.reward_model_env): rewards are
the sequence classifier's own forward on the conversations formatted as NeMo RL formats them."""

from __future__ import annotations

import time
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
    with pytest.raises(ValueError, match="is not a local folder"):
        RewardModelEnvironment(reward_model_path, tokenizer_path=str(tmp_path / "missing"))


def test_scorers_in_ray_actors_score_like_the_local_scorer(
    ray_cluster: None, reward_model_path: str
) -> None:
    """Two scorers in Ray actors of their own placement group (CPU worker slots here), each
    scoring a contiguous share, return the local scorer's rewards in order, and their
    reward_model_env/* metrics; shutdown frees the slots."""
    import ray

    from hpcrl.core.environments.reward_model_env import RewardModelEnvironment, reward_metrics
    from hpcrl.core.workers.reward_model_actor import RewardModelScorers
    from hpcrl.run.jobspec import RewardModelPlacement

    kwargs = {"model_path": reward_model_path, "precision": "float32", "batch_size": 2}
    prompts = [m[0]["content"] for m in CONVERSATIONS] * 2  # 6 rows: 3 per scorer
    responses = [m[1]["content"] for m in CONVERSATIONS] * 2
    local = RewardModelEnvironment(**kwargs).score(prompts, responses, [""] * 6)
    placement = RewardModelPlacement(first_node=0, num_nodes=1, slots_per_node=2)
    before = ray.available_resources().get("CPU", 0.0)
    scorers = RewardModelScorers(kwargs, placement, "cpu").start()
    try:
        assert len(scorers.actors) == 2
        assert scorers.score(prompts, responses, [""] * 6) == pytest.approx(local, abs=1e-6)
        assert scorers.last_metrics == pytest.approx(reward_metrics(local))
        # a share per scorer, whatever the count
        one = scorers.score(prompts[:2], responses[:2], [""] * 2)
        assert one == pytest.approx(local[:2], abs=1e-6)
    finally:
        scorers.shutdown()
    deadline = time.monotonic() + 30  # Ray returns a removed group's resources shortly after
    while ray.available_resources().get("CPU", 0.0) < before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == pytest.approx(before)


def test_grpo_scored_by_the_reward_model_through_the_driver(
    ray_cluster: None, reward_model_path: str, tmp_path: Path
) -> None:
    """The tiny CPU recipe scored by the reward model: the plan gives the scorer one of the
    2 worker slots (training on the other, as NeMo RL carves a one-node job), the driver
    starts it, and each step's rewards are its scores: real-valued, varied, logged with
    reward_model_env/* (no scaling or shaping here, so their mean is the step's)."""
    from hpcrl.core.driver import run_training
    from hpcrl.run.jobspec_file import read_jobspec
    from tests.core._driver_harness import read_metrics, write_run_dir

    run_dir = write_run_dir(
        tmp_path / "run",
        "grpo-tiny-1n-cpu.yaml",
        [
            "env.name=reward_model",
            f"env.reward_model.model_name={reward_model_path}",
            "env.reward_model.precision=float32",
            "env.reward_model.resources.gpus_per_node=1",
            "grpo.max_num_steps=2",
            "policy.generation.max_new_tokens=4",
        ],
    )
    spec = read_jobspec(run_dir)
    assert (spec.world_size, spec.reward_model.num_scorers) == (1, 1)
    assert run_training(str(run_dir)) == 0
    metrics = [m for m in read_metrics(run_dir) if m.get("step", 0) > 0]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward_model_env/num_samples"] == 32.0
        assert m["reward_mean"] == pytest.approx(m["reward_model_env/mean_reward"], abs=1e-5)
        assert m["reward_std"] > 1e-4  # a classifier's logits, not a 0/1 check
        low, high = m["reward_model_env/min_reward"], m["reward_model_env/max_reward"]
        assert low < high and not {low, high} <= {0.0, 1.0}
