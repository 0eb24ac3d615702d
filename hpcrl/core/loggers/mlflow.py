"""MLflow: one run per job, metrics per step; a file store in the log folder by default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.core.loggers.logger_errors import missing_package

if TYPE_CHECKING:
    from hpcrl.config.recipe import MlflowCfg


def tracking_uri(cfg: MlflowCfg, log_dir: Path) -> str:
    return cfg.tracking_uri or (log_dir / "mlruns").resolve().as_uri()


class MlflowLogger:
    def __init__(self, cfg: MlflowCfg, log_dir: Path, run_name: str) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise missing_package("mlflow_enabled", "mlflow", error) from None
        self.tracking_uri = tracking_uri(cfg, log_dir)
        if cfg.tracking_uri is None:
            # MLflow 3 keeps its file store only on request; a file store needs no server or
            # database on the compute nodes, which is why it is the default here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self.client.get_experiment_by_name(cfg.experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(cfg.experiment_name)
        )
        run = self.client.create_run(experiment_id, run_name=cfg.run_name or run_name)
        self.run_id = run.info.run_id
        self.experiment = cfg.experiment_name

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        timestamp_ms = _now_ms()
        metrics = [Metric(name, value, timestamp_ms, step) for name, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)

    def where(self) -> dict[str, Any]:
        return {"logger": "mlflow", "uri": self.tracking_uri, "experiment": self.experiment,
                "run_id": self.run_id}  # fmt: skip


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
