"""The set of metric loggers of one run and how a step record is named for them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hpcrl.config.recipe import LoggerCfg

#: Prefixes of step-record keys and the group they are logged under.
GROUPS = (("val_", "validation"), ("time_", "timing"), ("peak_", "memory"), ("gpu", "gpu"))


class MetricLogger(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...

    def where(self) -> dict[str, Any]:
        """Where it writes (``hpcrl.run.logger_destinations``)."""
        ...


def log_name(key: str) -> str:
    """``loss`` -> ``train/loss``, ``val_loss`` -> ``validation/val_loss``, ..."""
    for prefix, group in GROUPS:
        if key.startswith(prefix):
            return f"{group}/{key}"
    return f"train/{key}"


def numeric_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's finite numbers under their logger names (``step`` is the x axis)."""
    values = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            values[log_name(key)] = float(value)
    return values


class MetricLoggers:
    """Every logger the recipe enables; ``log`` passes one step record to all of them."""

    def __init__(self, loggers: list[MetricLogger], monitor: Any = None) -> None:
        self.loggers = loggers
        self.monitor = monitor

    def log(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int):
            return
        if self.monitor is not None:
            self.monitor.last_step = step
        if not self.loggers:
            return
        values = numeric_values(record)
        for logger in self.loggers:
            logger.log(step, values)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        for logger in self.loggers:
            logger.close()


def resolve_log_dir(cfg: LoggerCfg, run_dir: Path) -> Path:
    path = Path(cfg.log_dir).expanduser()
    return path if path.is_absolute() else run_dir / path


def build_loggers(cfg: LoggerCfg, run_dir: Path, run_name: str | None = None) -> MetricLoggers:
    """The loggers ``cfg`` enables, writing below ``logger.log_dir`` (relative: in the run
    folder). Raises LoggerError when one cannot start."""
    log_dir = resolve_log_dir(cfg, run_dir)
    name = run_name or run_dir.name
    loggers: list[MetricLogger] = []
    if cfg.tensorboard_enabled:
        from hpcrl.core.loggers.tensorboard import TensorboardLogger

        loggers.append(TensorboardLogger(cfg.tensorboard, log_dir))
    if cfg.wandb_enabled:
        from hpcrl.core.loggers.wandb import WandbLogger

        loggers.append(WandbLogger(cfg.wandb, log_dir, name))
    if cfg.mlflow_enabled:
        from hpcrl.core.loggers.mlflow import MlflowLogger

        loggers.append(MlflowLogger(cfg.mlflow, log_dir, name))
    monitor = None
    if cfg.monitor_gpus:
        from hpcrl.core.loggers.gpu_monitor import start_gpu_monitor

        monitor = start_gpu_monitor(cfg.gpu_monitoring, loggers, log_dir)
    if loggers:
        announce_destinations(run_dir, [logger.where() for logger in loggers])
    return MetricLoggers(loggers, monitor)


def announce_destinations(run_dir: Path, entries: list[dict[str, Any]]) -> None:
    """One line per logger in the driver's log, and ``loggers.json`` for status and report."""
    from hpcrl.run.logger_destinations import describe, write_destinations

    for entry in entries:
        print(f"logger: {describe(entry)}", flush=True)
    write_destinations(run_dir, entries)
