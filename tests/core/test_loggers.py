"""Metric loggers read back from what they wrote: TensorBoard event files, W&B offline run
files, an MLflow file store; the GPU monitor with stand-in samplers (no GPU here)."""

import json
import sys
from pathlib import Path

import pytest

from hpcrl.config.recipe import GpuMonitoringCfg, LoggerCfg, MlflowCfg, WandbCfg
from hpcrl.core.loggers import LoggerError, build_loggers, log_name
from hpcrl.core.loggers.gpu_monitor import GpuMonitor, start_gpu_monitor

RECORDS = [
    {"step": 1, "loss": 0.5, "reward_mean": 0.25, "time_train_s": 1.5, "val_loss": None},
    {"step": 2, "loss": 0.25, "reward_mean": 0.75, "time_train_s": 1.25, "flag": True},
]


def run_loggers(tmp_path: Path, **enabled) -> Path:
    loggers = build_loggers(LoggerCfg(**enabled), tmp_path, run_name="run-a")
    for record in RECORDS:
        loggers.log(record)
    loggers.close()
    return tmp_path / "logs"


def test_names_group_the_record_keys():
    assert [log_name(k) for k in ("loss", "val_loss", "time_train_s", "peak_gpu_mem_gb")] == [
        "train/loss",
        "validation/val_loss",
        "timing/time_train_s",
        "memory/peak_gpu_mem_gb",
    ]


def test_tensorboard_event_files_hold_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = run_loggers(tmp_path, tensorboard_enabled=True)
    events = EventAccumulator(str(log_dir / "tensorboard"))
    events.Reload()
    loss = [(event.step, event.value) for event in events.Scalars("train/loss")]
    assert loss == [(1, 0.5), (2, 0.25)]
    assert [e.value for e in events.Scalars("timing/time_train_s")] == [1.5, 1.25]
    assert "validation/val_loss" not in events.Tags()["scalars"]  # null is not a number
    assert "train/flag" not in events.Tags()["scalars"]  # nor is a boolean


def test_wandb_offline_run_files_hold_the_history(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggerCfg(wandb_enabled=True, wandb=WandbCfg(project="p"))
    loggers = build_loggers(cfg, tmp_path, run_name="run-a")
    assert loggers.loggers[0].mode == "offline"
    for record in RECORDS:
        loggers.log(record)
    loggers.close()
    (run_file,) = (tmp_path / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    history = _wandb_history(run_file)
    assert [(row["_step"], row["train/loss"]) for row in history] == [(1, 0.5), (2, 0.25)]


def _wandb_history(path: Path) -> list[dict]:
    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in _wandb_log_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.append({"_step": record.history.step.num, **row})
    return rows


def _wandb_log_records(blob: bytes, block_size: int = 32768) -> list[bytes]:
    """The records of W&B's run file, a LevelDB-style log: a 7-byte file header (":W&B",
    magic, version), then 32 KiB blocks of records, each with a 7-byte header (checksum,
    length, type: 1 whole, 2 first, 3 middle, 4 last part). Read here because wandb 0.31
    ships no reader; the checksums are not verified."""
    assert blob[:4] == b":W&B", blob[:8]
    records, pending, offset = [], b"", 7
    while offset + 7 <= len(blob):
        if block_size - offset % block_size < 7:
            offset += block_size - offset % block_size  # zero padding at a block's end
            continue
        length = int.from_bytes(blob[offset + 4 : offset + 6], "little")
        kind = blob[offset + 6]
        data = blob[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 2):
            pending = data
        elif kind in (3, 4):
            pending += data
        if kind in (1, 4):
            records.append(pending)
        elif kind == 0:
            break
    return records


def test_mlflow_file_store_holds_the_metric_history(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = LoggerCfg(mlflow_enabled=True, mlflow=MlflowCfg(experiment_name="exp"))
    loggers = build_loggers(cfg, tmp_path, run_name="run-a")
    (logger,) = loggers.loggers
    for record in RECORDS:
        loggers.log(record)
    loggers.close()
    assert logger.tracking_uri == (tmp_path / "logs" / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=logger.tracking_uri)
    history = client.get_metric_history(logger.run_id, "train/reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    run = client.get_run(logger.run_id)
    assert (run.info.run_name, run.info.status) == ("run-a", "FINISHED")


def test_a_missing_package_names_the_key_and_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(LoggerError, match=r"logger.tensorboard_enabled .*hpcrl\[loggers\]"):
        build_loggers(LoggerCfg(tensorboard_enabled=True), tmp_path)


class Recorder:
    def __init__(self):
        self.calls = []

    def log(self, step, values):
        self.calls.append((step, dict(values)))

    def close(self):
        pass


def test_gpu_monitor_writes_samples_and_logs_means_at_the_training_step(tmp_path):
    """Stand-in samplers: this machine has no GPU (the NVML path runs on GPU nodes)."""
    readings = iter([{"gpu0.util_pct": 50.0}, {"gpu0.util_pct": 100.0}])
    recorder = Recorder()
    cfg = GpuMonitoringCfg(collection_interval=3600, flush_interval=3600)
    monitor = GpuMonitor(cfg, {"node0": lambda: next(readings)}, [recorder], tmp_path / "g.jsonl")
    monitor.last_step = 7
    monitor.collect()
    monitor.collect()
    monitor.flush()
    assert recorder.calls == [(7, {"gpu/node0.gpu0.util_pct": 75.0})]
    lines = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert [(line["node"], line["gpu0.util_pct"]) for line in lines] == [
        ("node0", 50.0),
        ("node0", 100.0),
    ]
    assert start_gpu_monitor(cfg, [recorder], tmp_path, samplers={}) is None


def test_the_driver_says_where_each_logger_writes(tmp_path, monkeypatch, capsys):
    """At job start one line per logger in the driver's log and ``loggers.json`` for ``status
    RUN`` and ``report`` (issue 26 item 5: at 167264e W&B ran offline without a word)."""
    from hpcrl.run.logger_destinations import logger_lines, read_destinations

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggerCfg(wandb_enabled=True, tensorboard_enabled=True, mlflow_enabled=True,
                    wandb=WandbCfg(project="p"), mlflow=MlflowCfg(experiment_name="exp"))  # fmt: skip
    loggers = build_loggers(cfg, tmp_path, run_name="run-a")
    run_id = loggers.loggers[2].run_id
    loggers.close()
    (offline,) = (tmp_path / "logs" / "wandb").glob("offline-run-*")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("logger: ")]
    expected = [
        f"tensorboard: {tmp_path / 'logs' / 'tensorboard'}",
        f"wandb offline: {offline} (upload: wandb sync {offline})",
        f"mlflow: {(tmp_path / 'logs' / 'mlruns').resolve().as_uri()} (experiment exp, run {run_id})",
    ]
    assert said == [f"logger: {line}" for line in expected]
    assert read_destinations(tmp_path)[1] == {"logger": "wandb", "mode": "offline",
                                              "folder": str(offline)}  # fmt: skip
    assert logger_lines(tmp_path, {}) == expected  # what status RUN and report show


def test_before_the_job_starts_the_recipe_says_where_loggers_will_write(tmp_path):
    from hpcrl.run.logger_destinations import logger_lines

    recipe = {"logger": {"log_dir": "/lustre/me/tb", "wandb_enabled": True,
                         "tensorboard_enabled": True, "tensorboard": {"log_dir": "tb"}}}  # fmt: skip
    assert logger_lines(tmp_path, recipe) == [
        "wandb offline: /lustre/me/tb/wandb (upload: wandb sync /lustre/me/tb/wandb) (online "
        "instead when the job has WANDB_API_KEY)",
        "tensorboard: /lustre/me/tb/tb",
    ]
    assert logger_lines(tmp_path, {"logger": {"wandb_enabled": False}}) == []
