"""Which checkpoints are kept, as NeMo RL's CheckpointManager keeps them: with keep_top_k,
the top k periodic checkpoints by checkpointing.metric_name (higher_is_better; a checkpoint
without the metric ranks last, ties go to the newer) or else the newest k, and always the
newest checkpoint, which a resumed run starts from. A real CPU run:
tests/core/test_grpo_learns.py::test_grpo_with_kl_penalty_and_leave_one_out_learns_and_keeps_the_top_k_checkpoints."""

from pathlib import Path

import pytest

from hpcrl.config.checkpoint_metrics import record_key
from hpcrl.core.algorithms.loop import CheckpointStore
from hpcrl.run.checkpoints import complete_checkpoints


class FolderPolicy:
    """Writes an empty checkpoint folder: what the store keeps or deletes is the point."""

    def save_checkpoint(self, path: str, extra_state: dict) -> None:
        Path(path).mkdir(parents=True)


def kept_steps(store: CheckpointStore, values: list[float | None]) -> list[int]:
    for step, value in enumerate(values, start=1):
        record = {} if value is None else {"val_reward_mean": value, "val_loss": value}
        store.save(step, {}, record)
    return [step for step, _ in complete_checkpoints(store.checkpoint_dir)]


@pytest.mark.parametrize(
    "algorithm, name, key",
    [
        ("grpo", "val:accuracy", "val_reward_mean"),
        ("grpo", "train:reward", "reward_mean"),
        ("sft", "val:val_loss", "val_loss"),
        ("sft", "train:loss", "loss"),
    ],
)
def test_nemo_rl_names_map_to_record_keys(algorithm, name, key):
    assert record_key(algorithm, name) == key


def test_newest_without_a_metric(tmp_path):
    store = CheckpointStore(FolderPolicy(), tmp_path, 1, keep=2)
    assert kept_steps(store, [0.1, 0.9, 0.5, 0.2]) == [3, 4]


def test_best_by_metric_plus_the_newest(tmp_path):
    store = CheckpointStore(FolderPolicy(), tmp_path, 1, keep=2, metric="val_reward_mean")
    assert kept_steps(store, [0.1, 0.9, 0.5, 0.2, None]) == [2, 3, 5]


def test_lower_is_better_and_ties_go_to_the_newer(tmp_path):
    store = CheckpointStore(
        FolderPolicy(), tmp_path, 1, 2, metric="val_loss", higher_is_better=False
    )
    assert kept_steps(store, [0.3, 0.1, 0.5, 0.1, 0.7]) == [2, 4, 5]


def test_only_periodic_checkpoints_compete(tmp_path):
    # save_period 2: the checkpoints of steps 3 and 5 (a preemption, the run's end) are kept
    # only while they are the newest, as NeMo RL keeps them.
    store = CheckpointStore(FolderPolicy(), tmp_path, 2, keep=1, metric="val_loss")
    for step, value in ((2, 0.1), (3, 0.9), (4, 0.2), (5, 0.8)):
        store.save(step, {}, {"val_loss": value})
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [4, 5]
