"""vLLM generation on the real Ray worker group (2 CPU ranks, FSDP2 over gloo), colocated in
the training workers and on a separate generation worker: same greedy tokens as the torch
sampler on the trainer's weights, before and after a training step (refit from the gathered
FSDP state dict), and no worker or engine process left afterwards.

A colocated engine of tensor_parallel_size 2 over both ranks runs on the Ray group in
tests/vllm/test_grpo_vllm.py (colocated-tp2: the trainer's log-probs at every one of 16
steps, its engine processes gone after the run); its greedy parity is
tests/vllm/test_colocated_tp.py's (a TP=2 engine samples as a TP=1 engine and follows a
refit). It was a case here too, one more start-up of the same group (issue 26)."""

from __future__ import annotations

import attrs
import pytest

from tests.require import VLLM_HINT, require_module

require_module("ray", kind="vllm", hint=VLLM_HINT)

from hpcrl.config.recipe import (  # noqa: E402
    ColocatedCfg,
    GenerationCfg,
    GenerationResourcesCfg,
    Recipe,
)
from hpcrl.core.workers.vllm_policy import VllmPolicy, wrap_policy  # noqa: E402
from hpcrl.run.jobspec import GenerationPlacement  # noqa: E402
from tests.core.parallel_harness import make_batch, masked_nll_loss, start_policy  # noqa: E402
from tests.recipe_builder import tiny_automodel_recipe  # noqa: E402
from tests.vllm.harness import (  # noqa: E402
    VLLM_CFG,
    build_tiny_model,
    responses,
    torch_sampler_generate,
    wait_until_gone,
)

PROMPTS = [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34], [40], [50, 51, 52], [60, 61]]
# Where the planner puts a one-slot generation worker beside 2 training ranks on one node
# (the SFT recipe below is no GRPO plan; tests/core/test_generation_placement.py plans one).
SEPARATE_PLACEMENT = GenerationPlacement(
    first_node=0, num_nodes=1, slots_per_node=1, num_engines=1, slots_per_engine=1,
    training_nodes=1, training_slots_per_node=2,
)  # fmt: skip


def vllm_recipe(colocated: bool) -> Recipe:
    recipe = tiny_automodel_recipe(lr=3e-2)
    generation = GenerationCfg(
        backend="vllm",
        vllm_cfg=VLLM_CFG,
        colocated=ColocatedCfg(
            enabled=colocated,
            resources=GenerationResourcesCfg(num_nodes=1, gpus_per_node=1),
        ),
    )
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, generation=generation))


@pytest.fixture(scope="module")
def vllm_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


def _greedy(max_new_tokens: int = 12) -> GenerationCfg:
    return GenerationCfg(backend="vllm", temperature=0.0, max_new_tokens=max_new_tokens)


def _engine_side_pids(policy) -> list[int]:
    if isinstance(policy, VllmPolicy):
        return list(policy.generation_group.pids)
    return []  # colocated: the in-process engines live in the training workers


def _torch_sampler_on(hf_dir: str, cfg: GenerationCfg) -> dict:
    """The torch sampler on a consolidated export of the trainer's weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return torch_sampler_generate(model, AutoTokenizer.from_pretrained(hf_dir), PROMPTS, cfg)


def _children(pids: list[int]) -> list[int]:
    import psutil

    # Python's multiprocessing resource tracker (one per parent, exits with it) aside.
    return [
        child.pid
        for pid in pids
        for child in psutil.Process(pid).children(recursive=True)
        if "resource_tracker" not in " ".join(child.cmdline())
    ]


@pytest.mark.slow
@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "separate"])
def test_vllm_follows_training_steps_and_matches_torch_sampler(
    ray_cluster,
    vllm_model_path: str,
    colocated: bool,
    tmp_path,
) -> None:
    recipe = vllm_recipe(colocated)
    training = start_policy(recipe, vllm_model_path, world_size=2)
    policy = wrap_policy(training, recipe, vllm_model_path, "cpu", SEPARATE_PLACEMENT)
    pids = []
    try:
        pids = _engine_side_pids(policy) + training.group.call_same("pid")
        worker_pids = list(pids)
        before = policy.generate(PROMPTS, _greedy(), seed=0)
        pids += _children(worker_pids)  # an in-process engine's helpers, if any
        policy.export_hf(str(tmp_path / "before"))
        for step in range(2):
            policy.train(make_batch(step), masked_nll_loss)
        after = policy.generate(PROMPTS, _greedy(), seed=0)
        policy.export_hf(str(tmp_path / "after"))
        sampled = policy.generate(
            PROMPTS, GenerationCfg(backend="vllm", temperature=1.0, max_new_tokens=12), seed=1
        )
        trainer_logprobs = policy.get_logprobs(
            {"input_ids": sampled.input_ids, "attention_mask": sampled.attention_mask}
        )
    finally:
        policy.shutdown()

    assert isinstance(policy, VllmPolicy) is not colocated
    torch_before = _torch_sampler_on(str(tmp_path / "before"), _greedy())
    torch_after = _torch_sampler_on(str(tmp_path / "after"), _greedy())
    assert responses(attrs.asdict(before)) == responses(torch_before)
    assert responses(attrs.asdict(after)) == responses(torch_after)
    assert after.metrics["time_sample_s"] > 0
    changed = sum(
        a != b
        for a, b in zip(
            responses(attrs.asdict(before)), responses(attrs.asdict(after)), strict=True
        )
    )
    assert changed >= 3, "two training steps should change several greedy outputs"
    # sampled log-probs are the trainer's (refit complete: no stale layer anywhere)
    mask = sampled.response_mask.bool()
    diff = (sampled.generation_logprobs - trainer_logprobs).abs()[mask]
    assert float(diff.max()) < 2e-4
    assert wait_until_gone(pids) == []
