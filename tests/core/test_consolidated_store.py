"""``checkpointing.save_consolidated``: the checkpoint store writes ``<checkpoint>/hf`` through
the policy's ``export_hf`` after each save, complete or absent; not for a preemption's save
(time is short: ``hpcrl export`` writes it later); pruned with its checkpoint. No Ray: a
policy that writes files stands in (what the store does with them is the point; the real
export is tested in test_export.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpcrl.core.algorithms.loop import CheckpointStore
from hpcrl.run.checkpoints import (
    CONSOLIDATED_SUBDIR,
    EXPORT_RECORD,
    complete_checkpoints,
    step_of_checkpoint,
)

ABOUT = {"run_dir": "/runs/r", "backend": "automodel"}


class FilePolicy:
    """Test stand-in: a checkpoint is a folder, an export one file; ``fail_export`` raises
    half-way through an export (after writing part of it)."""

    def __init__(self) -> None:
        self.fail_export = False

    def save_checkpoint(self, path: str, extra_state: dict) -> None:
        shutil.rmtree(path, ignore_errors=True)  # as RayPolicy replaces a step saved again
        Path(path).mkdir(parents=True)

    def export_hf(self, out_dir: str) -> None:
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "model.safetensors").write_text("weights")
        if self.fail_export:
            raise RuntimeError("the export died")


def test_each_save_writes_a_complete_hf_folder_with_its_record(tmp_path):
    store = CheckpointStore(FilePolicy(), tmp_path, 1, keep=None, consolidated=ABOUT)
    saved = store.save(3, {})
    folder = saved / CONSOLIDATED_SUBDIR
    assert sorted(p.name for p in folder.iterdir()) == [EXPORT_RECORD, "model.safetensors"]
    record = json.loads((folder / EXPORT_RECORD).read_text())
    assert record == {"run_dir": "/runs/r", "checkpoint": str(saved), "step": 3,
                      "backend": "automodel", "written_by": "checkpointing.save_consolidated"}  # fmt: skip
    assert sorted(p.name for p in saved.iterdir()) == [CONSOLIDATED_SUBDIR]


def test_off_by_default_and_not_for_a_preemptions_save(tmp_path):
    plain = CheckpointStore(FilePolicy(), tmp_path / "plain", 1, keep=None)
    assert list(plain.save(1, {}).iterdir()) == []
    hurried = CheckpointStore(FilePolicy(), tmp_path / "hurried", 1, keep=None, consolidated=ABOUT)
    assert list(hurried.save(1, {}, in_a_hurry=True).iterdir()) == []


def test_a_failed_export_leaves_no_hf_folder_that_looks_complete(tmp_path):
    policy = FilePolicy()
    store = CheckpointStore(policy, tmp_path, 1, keep=None, consolidated=ABOUT)
    policy.fail_export = True
    with pytest.raises(RuntimeError, match="the export died"):
        store.save(2, {})
    checkpoint = tmp_path / "step_000002"
    assert not (checkpoint / CONSOLIDATED_SUBDIR).exists()
    assert (checkpoint / f"{CONSOLIDATED_SUBDIR}.partial" / "model.safetensors").exists()
    policy.fail_export = False
    store.save(2, {})  # saving the step again replaces the leftover
    assert sorted(p.name for p in checkpoint.iterdir()) == [CONSOLIDATED_SUBDIR]


def test_pruned_with_its_checkpoint(tmp_path):
    store = CheckpointStore(FilePolicy(), tmp_path, 1, keep=2, consolidated=ABOUT)
    for step in range(1, 5):
        store.save(step, {})
    kept = complete_checkpoints(tmp_path)
    assert [step for step, _ in kept] == [3, 4]
    assert all((folder / CONSOLIDATED_SUBDIR / EXPORT_RECORD).is_file() for _, folder in kept)


def test_step_of_checkpoint():
    assert step_of_checkpoint("/x/step_000012") == 12
    assert step_of_checkpoint("/x/step_12.partial") is None
    assert step_of_checkpoint("/x/hf") is None
