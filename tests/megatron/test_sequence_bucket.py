"""The Megatron worker's sequence bucket (``MegatronWorker.sequence_bucket``: 64 on a GPU):
right-padded micro-batches padded up to the bucket give the same log-probs, and the same
train loss, as at their planned width, on the real worker (one CPU rank, megatron-core over
gloo). What the bucket is for, fewer new shapes for a GPU's attention kernels, is measured on
the GPU (benchmarks/grpo_step.py, docs/performance.md issue 25 item 2)."""

from __future__ import annotations

from tests.megatron import harness

BUCKET = 24  # above the batch's width of 16 (harness.SEQ_LEN): every micro-batch pads


def bucket_run(rank: int, world_size: int, hf_path: str, ckpt_root: str) -> dict:
    import torch

    from tests.recipe_builder import tiny_megatron_recipe

    recipe = tiny_megatron_recipe(hf_path)
    worker, _ = harness.setup_worker(rank, world_size, recipe, hf_path, ckpt_root)
    batch = harness.fixed_batch()
    lengths = torch.tensor([12, 9, 7, 12, 5, 10, 11, 8])[: batch["input_ids"].shape[0]]
    columns = torch.arange(batch["input_ids"].shape[1])
    batch["attention_mask"] = (columns[None, :] < lengths[:, None]).long()
    batch["token_mask"] = batch["token_mask"] * batch["attention_mask"]
    num_tokens = float(batch["token_mask"].sum())
    as_planned = worker.logprobs(batch)
    worker.sequence_bucket = BUCKET
    padded_shapes = []
    upload = worker.staging.upload
    worker.staging.upload = lambda micro, device: (
        padded_shapes.extend(m["input_ids"].shape[1] for m in micro) or upload(micro, device)
    )
    worker.take_pass_metrics()
    bucketed = worker.logprobs(batch)
    micro = harness.micro_batches(batch, recipe.policy.train_micro_batch_size)
    metrics = worker.train_step(micro, harness.masked_nll, num_tokens)
    passes = worker.take_pass_metrics()
    worker.close()
    want_loss = float(-(as_planned * batch["token_mask"]).sum() / num_tokens)
    return {
        "mask": batch["token_mask"],
        "as_planned": as_planned,
        "bucketed": bucketed,
        "loss": metrics["loss"],
        "want_loss": want_loss,
        "padded_shapes": padded_shapes,
        "token_slots": (passes["logprobs_token_slots"], passes["train_token_slots"]),
        "rows": int(batch["input_ids"].shape[0]),
    }


def test_padding_to_the_bucket_changes_no_log_prob_and_no_loss(converted):
    hf_path, root = converted
    (result,) = harness.run_ranks(1, bucket_run, hf_path, root)
    assert set(result["padded_shapes"]) == {BUCKET}  # the passes did run padded
    # the pass figures count the positions the forwards computed, the padding included
    assert result["token_slots"] == (result["rows"] * BUCKET, result["rows"] * BUCKET)
    mask = result["mask"].bool()
    got, want = result["bucketed"][mask], result["as_planned"][mask]
    assert float((got - want).abs().max()) < 1e-5
    assert abs(result["loss"] - result["want_loss"]) < 1e-5 * abs(result["want_loss"])
