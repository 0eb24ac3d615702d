"""TensorBoard event files, written with torch's SummaryWriter (the tensorboard package)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.core.loggers.logger_errors import missing_package

if TYPE_CHECKING:
    from hpcrl.config.recipe import TensorboardCfg


class TensorboardLogger:
    """Scalars per step; flushed every step so a dying job keeps what it logged."""

    def __init__(self, cfg: TensorboardCfg, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise missing_package("tensorboard_enabled", "tensorboard", error) from None
        folder = Path(cfg.log_dir).expanduser() if cfg.log_dir else Path("tensorboard")
        self.log_dir = folder if folder.is_absolute() else log_dir / folder
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def where(self) -> dict[str, Any]:
        return {"logger": "tensorboard", "folder": str(self.log_dir)}
