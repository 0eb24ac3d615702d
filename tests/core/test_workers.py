"""The Ray worker group: placement and rank wiring, generation fan-out, clean shutdown;
plus the pure sharding helpers."""

from __future__ import annotations

import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.workers.sharding import (
    concat_right_padded,
    pad_prompts_evenly,
    pad_rows,
    split_batch,
    split_micro_batches,
)
from tests.core.parallel_harness import make_batch, masked_nll_loss, start_policy
from tests.recipe_builder import tiny_automodel_recipe


def rank_facts(backend: object) -> dict:
    import ray
    import torch.distributed as dist

    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}
    return {
        **env,
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
        "backend": dist.get_backend(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_group_wires_ranks_generates_in_order_and_leaves_nothing(
    ray_cluster,
    tiny_model_path,
    tmp_path,
):
    import ray

    from hpcrl.core.generation.padding import pad_prompts
    from hpcrl.core.generation.torch_sampler import generate

    prompts = [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34]]  # 3 prompts over 2 ranks: padded
    cfg = GenerationCfg(max_new_tokens=6, temperature=0.0)
    policy = start_policy(tiny_automodel_recipe(lr=3e-2), tiny_model_path, world_size=2)
    try:
        facts = policy.group.call_same("run", rank_facts)
        out = policy.generate(prompts, cfg, seed=5)
        # A training step: the workers' engines are refitted before the next generation.
        policy.train(make_batch(0), masked_nll_loss)
        after = policy.generate(prompts, cfg, seed=5)
        policy.export_hf(str(tmp_path / "after"))
    finally:
        policy.shutdown()
    pids = [f["pid"] for f in facts]

    assert [(f["RANK"], f["LOCAL_RANK"], f["WORLD_SIZE"]) for f in facts] == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]
    assert [(f["dist_rank"], f["dist_world"], f["backend"]) for f in facts] == [
        (0, 2, "gloo"),
        (1, 2, "gloo"),
    ]
    driver_node = ray.get_runtime_context().get_node_id()
    assert {f["node_id"] for f in facts} == {driver_node}
    # MASTER_ADDR is the address Ray registered for rank 0's node (not the default route's).
    (node,) = [n for n in ray.nodes() if n["NodeID"] == driver_node]
    assert {f["MASTER_ADDR"] for f in facts} == {node["NodeManagerAddress"]}
    assert len(set(pids)) == 2 and os.getpid() not in pids

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids, mask = pad_prompts(prompts, pad_token_id=0)
    want = generate(model, ids, mask, cfg, seed=0, eos_token_id=2, pad_token_id=0)
    assert out.input_ids.shape[0] == 3
    width = want["input_ids"].shape[1]
    assert torch.equal(out.input_ids[:, :width], want["input_ids"])
    assert torch.equal(out.response_mask[:, :width], want["response_mask"])
    assert torch.equal(out.prompt_lengths, torch.tensor([3, 2, 5]))
    torch.testing.assert_close(
        out.generation_logprobs[:, :width], want["generation_logprobs"], atol=1e-5, rtol=0
    )
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "after", dtype=torch.float32)
    want_after = generate(trained, ids, mask, cfg, seed=0, eos_token_id=2, pad_token_id=0)
    width = want_after["input_ids"].shape[1]
    assert torch.equal(after.input_ids[:, :width], want_after["input_ids"])
    assert not torch.equal(after.generation_logprobs, out.generation_logprobs)
    assert out.metrics["time_refit_s"] > 0 and out.metrics["time_sample_s"] > 0
    assert out.metrics["generation_decode_steps"] > 0
    for part in ("time_prefill_s", "time_decode_s"):  # the engine's own, within its call
        assert 0 < out.metrics[part] <= out.metrics["time_sample_s"]

    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids), "worker processes outlived shutdown"


@pytest.mark.slow
def test_too_few_nodes_is_a_clear_error(ray_cluster):
    from hpcrl.core.workers.group import pick_nodes

    with pytest.raises(RuntimeError, match="needs 2 Ray nodes but 1 joined"):
        pick_nodes(2)


def test_split_batch_keeps_order_and_rejects_uneven():
    batch = make_batch(seed=0, batch_size=6)
    shards = split_batch(batch, 3, "policy.train_global_batch_size")
    assert torch.equal(torch.cat([s["input_ids"] for s in shards]), batch["input_ids"])
    assert [len(s["token_mask"]) for s in shards] == [2, 2, 2]
    with pytest.raises(ValueError, match="batch of 6 sequences does not split evenly over 4"):
        split_batch(batch, 4, "policy.train_global_batch_size")
    micro = split_micro_batches(batch, 4)
    assert [len(m["input_ids"]) for m in micro] == [4, 2]


def test_pad_rows_repeats_the_last_row():
    batch = make_batch(seed=0, batch_size=5)
    padded, num_real = pad_rows(batch, 4)
    assert num_real == 5 and len(padded["input_ids"]) == 8
    assert torch.equal(padded["input_ids"][:5], batch["input_ids"])
    assert all(torch.equal(row, batch["input_ids"][4]) for row in padded["input_ids"][5:])
    assert pad_rows(batch, 5)[0]["input_ids"] is batch["input_ids"]


def test_prompt_padding_and_right_padded_join():
    shards, num_real = pad_prompts_evenly([[1], [2, 2], [3]], 2)
    assert (shards, num_real) == ([[[1], [2, 2]], [[3], [3]]], 3)
    joined = concat_right_padded(
        [
            {"input_ids": torch.tensor([[5, 6]]), "lengths": torch.tensor([2])},
            {"input_ids": torch.tensor([[7, 8, 9]]), "lengths": torch.tensor([3])},
        ],
        {"input_ids": 0},
    )
    assert torch.equal(joined["input_ids"], torch.tensor([[5, 6, 0], [7, 8, 9]]))
    assert torch.equal(joined["lengths"], torch.tensor([2, 3]))
