"""Which checkpoints are kept: the newest keep_top_k, or the best by checkpointing.metric_name
(NeMo RL's names) and always the newest."""

from pathlib import Path

import pytest

from hpcrl.core.algorithms.loop import CheckpointStore, metric_key
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
    "name, key",
    [("val_reward", "val_reward_mean"), ("val:val_loss", "val_loss"), ("train:loss", "loss")],
)
def test_metric_names_map_to_record_keys(name, key):
    assert metric_key(name) == key


def test_newest_without_a_metric(tmp_path):
    store = CheckpointStore(FolderPolicy(), tmp_path, 1, keep=2)
    assert kept_steps(store, [0.1, 0.9, 0.5, 0.2]) == [3, 4]


def test_best_by_metric_plus_the_newest(tmp_path):
    store = CheckpointStore(FolderPolicy(), tmp_path, 1, keep=2, metric="val_reward_mean")
    assert kept_steps(store, [0.1, 0.9, 0.5, 0.2, None]) == [2, 3, 5]


def test_lower_is_better(tmp_path):
    store = CheckpointStore(
        FolderPolicy(), tmp_path, 1, 2, metric="val_loss", higher_is_better=False
    )
    assert kept_steps(store, [0.3, 0.1, 0.5, 0.2]) == [2, 4]
