"""``pipeoffload train``: configuration, data, device mesh, the loop, checkpoints and metrics.

``TrainConfig`` (its sections) and ``validate`` are torch-free; the rest imports torch when used. For your own
model: ``train_model`` (see ``pipeoffload.train.api``).
"""
from __future__ import annotations

from typing import Any

from pipeoffload.train.config import (
    CheckpointConfig,
    DataConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
    ScheduleConfig,
    TrainConfig,
    build_config,
    validate,
)


def __getattr__(name: str) -> Any:  # the torch-side API, imported on first use
    if name == "train_model":
        from pipeoffload.train.api import train_model

        return train_model
    if name == "Trainer":
        from pipeoffload.train.loop import Trainer

        return Trainer
    raise AttributeError(name)


__all__ = ["CheckpointConfig", "DataConfig", "MetricsConfig", "ModelConfig", "OptimConfig", "ParallelConfig",
           "RunConfig", "ScheduleConfig", "TrainConfig", "Trainer", "build_config", "train_model", "validate"]
