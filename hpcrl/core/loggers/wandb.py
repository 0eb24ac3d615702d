"""Weights & Biases: offline files under the log folder unless the job can go online.

Online when WANDB_API_KEY is in the job's environment (the profile's pass_env) or WANDB_MODE
says so; otherwise offline (``wandb sync <log_dir>/wandb/offline-run-*`` uploads later). An
online start that fails (no network from the compute nodes) falls back to offline, said once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.core.loggers.logger_errors import missing_package

if TYPE_CHECKING:
    from hpcrl.config.recipe import WandbCfg

INIT_TIMEOUT_S = 90


def wandb_mode(environ: Mapping[str, str]) -> str:
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


class WandbLogger:
    def __init__(self, cfg: WandbCfg, log_dir: Path, run_name: str) -> None:
        try:
            import wandb
        except ImportError as error:
            raise missing_package("wandb_enabled", "wandb", error) from None
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        mode = wandb_mode(os.environ)
        try:
            self.run = self._init(wandb, cfg, run_name, mode)
        except Exception as error:  # wandb raises its own types for network and auth failures
            if mode != "online":
                raise
            print(f"wandb: online start failed ({error}); logging offline instead", flush=True)
            self.run = self._init(wandb, cfg, run_name, "offline")
        self.mode = self.run.settings.mode

    def _init(self, wandb: Any, cfg: WandbCfg, run_name: str, mode: str) -> Any:
        return wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or run_name,
            dir=str(self.log_dir),
            mode=mode,
            settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S, silent=True),
        )

    def where(self) -> dict[str, Any]:
        """Online: the run's page; offline: its folder (``wandb sync`` uploads it later)."""
        if self.mode == "online":
            return {"logger": "wandb", "mode": "online", "url": self.run.get_url()}
        return {"logger": "wandb", "mode": self.mode, "folder": str(self.run.settings.sync_dir)}

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before the service has written the run file; teardown waits
        # for it, so the files are whole before the driver exits.
        wandb.teardown()
