"""Data order and resume position, SFT example masks, checkpoint bookkeeping, metrics lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.config.data_steps import num_steps_in_epochs
from hpcrl.core.algorithms.loop import CheckpointStore, PreemptionWatch
from hpcrl.core.data.jsonl import DataPosition, EpochSampler, load_jsonl
from hpcrl.core.metrics import format_progress
from hpcrl.run.checkpoints import latest_checkpoint
from hpcrl.run.metrics_file import MetricsWriter
from tests.require import require_module

ROWS = [{"prompt": f"p{i}", "answer": str(i)} for i in range(10)]


def _ids(batch: list[dict]) -> list[str]:
    return [row["answer"] for row in batch]


def test_each_epoch_visits_every_row_once_in_a_seeded_order() -> None:
    sampler = EpochSampler(ROWS, seed=3)
    first_epoch = _ids(sampler.next_batch(4) + sampler.next_batch(4) + sampler.next_batch(2))
    second_epoch = _ids(sampler.next_batch(10))
    assert sorted(first_epoch, key=int) == [str(i) for i in range(10)]
    assert sorted(second_epoch, key=int) == [str(i) for i in range(10)]
    assert first_epoch != second_epoch  # reshuffled per epoch
    assert _ids(EpochSampler(ROWS, seed=3).next_batch(10)) == first_epoch
    assert _ids(EpochSampler(ROWS, seed=4).next_batch(10)) != first_epoch
    assert _ids(EpochSampler(ROWS, seed=3, shuffle=False).next_batch(3)) == ["0", "1", "2"]


def test_restored_position_continues_exactly_across_an_epoch_boundary() -> None:
    straight = EpochSampler(ROWS, seed=1)
    straight.next_batch(8)
    expected = _ids(straight.next_batch(6))  # crosses into epoch 1
    interrupted = EpochSampler(ROWS, seed=1)
    interrupted.next_batch(8)
    saved = json.loads(json.dumps(interrupted.position.to_dict()))
    assert saved == {"epoch": 0, "index": 8}
    resumed = EpochSampler(ROWS, seed=1)
    resumed.restore(DataPosition.from_dict(saved))
    assert _ids(resumed.next_batch(6)) == expected
    assert resumed.position == DataPosition(epoch=1, index=4)


def test_steps_in_epochs() -> None:
    assert num_steps_in_epochs(256, 8, 1) == 32
    assert num_steps_in_epochs(10, 4, 1) == 2
    assert num_steps_in_epochs(3, 8, 1) == 1


def test_jsonl_errors_name_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"question": "b"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:3: missing key\(s\) prompt, answer"):
        load_jsonl(path, ["prompt", "answer"])
    path.write_text('{"prompt": "a"\n')
    with pytest.raises(ValueError, match="d.jsonl:1: not valid JSON"):
        load_jsonl(path, ["prompt"])
    assert load_jsonl(
        Path(__file__).parents[2] / "recipes/data/toy_count.jsonl", ["prompt", "answer"]
    )


def test_sft_example_masks_only_response_and_eos() -> None:
    require_module("transformers")
    from hpcrl.core.data.prompts import encode_sft_example
    from hpcrl.core.models.tiny import ensure_tiny_model
    from hpcrl.core.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ensure_tiny_model("tiny:qwen2"))
    ids, mask = encode_sft_example(tokenizer, "Q: 1+1=? ", "A: 2.", 64, use_chat_template=False)
    assert tokenizer.decode(ids) == "Q: 1+1=? A: 2.<|eos|>"
    assert mask == [0.0] * 9 + [1.0] * 6
    ids, mask = encode_sft_example(tokenizer, "Q: 1+1=? ", "A: 2.", 11, use_chat_template=False)
    assert len(ids) == len(mask) == 11 and sum(mask) == 2.0


class _FolderWritingPolicy:
    """Test stand-in for the policy's checkpoint methods: writes the folder, records calls."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, checkpoint_dir: str, extra_state: dict) -> None:
        Path(checkpoint_dir).mkdir(parents=True)
        (Path(checkpoint_dir) / "extra_state.json").write_text(json.dumps(extra_state))

    def load_checkpoint(self, checkpoint_dir: str) -> dict:
        self.loaded.append(checkpoint_dir)
        return json.loads((Path(checkpoint_dir) / "extra_state.json").read_text())


def test_checkpoint_store_saves_on_period_keeps_newest_and_restores_latest(tmp_path: Path) -> None:
    policy = _FolderWritingPolicy()
    store = CheckpointStore(policy, tmp_path / "ckpt", save_period=2, keep=2)
    assert store.restore_latest() is None
    for step in range(1, 8):
        if store.due(step):
            store.save(step, {"data_position": {"epoch": 0, "index": step}})
    (tmp_path / "ckpt" / "step_000008.partial").mkdir()  # an interrupted save
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step_000004",
        "step_000006",
        "step_000008.partial",
    ]
    assert latest_checkpoint(tmp_path / "ckpt") == tmp_path / "ckpt" / "step_000006"
    assert store.restore_latest() == {"data_position": {"epoch": 0, "index": 6}, "step": 6}


def test_preemption_marker_file_and_signal(tmp_path: Path) -> None:
    import os
    import signal

    watch = PreemptionWatch(tmp_path)
    with watch.installed():
        assert not watch.requested()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert watch.requested()
    other = PreemptionWatch(tmp_path)
    assert not other.requested()
    (tmp_path / "PREEMPT").touch()
    assert other.requested()


def test_a_resumed_run_drops_the_steps_it_runs_again(tmp_path: Path) -> None:
    """An attempt that died after its last checkpoint (step 2) wrote steps 3 and 4, and half
    a line; the next attempt resumes at step 3: none of them may stay (none done twice)."""
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    assert writer.drop_steps_from(3) == 0  # no file yet
    for step in range(5):  # step 0: the validation before step 1
        writer.write({"step": step, "loss": 0.1 * step})
    with (tmp_path / "metrics.jsonl").open("a") as stream:
        stream.write('{"step": 5, "lo')
    assert writer.drop_steps_from(3) == 3
    assert [json.loads(line)["step"] for line in writer.path.read_text().splitlines()] == [0, 1, 2]
    writer.write({"step": 3, "loss": 0.3})
    assert writer.drop_steps_from(0) == 4  # a run starting over keeps nothing
    assert writer.path.read_text() == ""


def test_metrics_lines_and_progress_text(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    writer.write({"step": 1, "loss": float("nan"), "reward_mean": 0.5})
    writer.write({"step": 2, "loss": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "loss": None, "reward_mean": 0.5},
        {"step": 2, "loss": 0.25},
    ]
    record = {
        "reward_mean": 0.41,
        "reward_std": 0.12,
        "loss": 0.0123,
        "grad_norm": 0.5,
        "time_generate_s": 1.23,
        "time_logprobs_s": 0.31,
        "time_train_s": 0.84,
        "tokens_per_s": 412.4,
    }
    assert format_progress(3, 20, record) == (
        "step 3/20  reward 0.410±0.120  loss 0.0123  gnorm 0.500  gen 1.2s  lp 0.3s  "
        "train 0.8s  412 tok/s"
    )
