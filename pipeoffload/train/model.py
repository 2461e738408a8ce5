"""Models as pipeline stages with the full single-process parameter names.

A model is a list of layers (or of stage modules); the schedule's stage count splits it and its
placement picks this rank's stages. Each rank names its parameters as the whole model would in one
process (``layers.<i>.<name>``, or ``stages.<s>.<name>`` for stage modules), so checkpoints from any
layout hold the same keys and can be resharded or loaded by a single process.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from pipeoffload.ir import Schedule
from pipeoffload.models import GPTConfig, StageModule, even_counts, gpt_layers
from pipeoffload.models.tensor_parallel import parallelize_gpt_stage
from pipeoffload.train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class RankModel:
    """This rank's stage modules; ``starts[s]`` is the global index of stage ``s``'s first layer, or
    None when the stages are user modules (named ``stages.<s>.<name>``)."""

    stages: dict[int, nn.Module]
    starts: dict[int, int] | None = None

    def full_name(self, stage: int, local: str) -> str:
        if self.starts is None:
            return f"stages.{stage}.{local}"
        j, _, rest = local.partition(".")
        return f"layers.{self.starts[stage] + int(j)}.{rest}"

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """Full single-process name -> parameter (recomputed: tensor parallelism swaps parameters)."""
        return {self.full_name(s, n): p for s, m in self.stages.items() for n, p in m.named_parameters()}

    def parameters(self) -> list[nn.Parameter]:
        return list(self.named_parameters().values())


def gpt_config(cfg: TrainConfig, vocab: int) -> GPTConfig:
    m = cfg.model
    return GPTConfig(vocab=vocab, seq=m.seq_len, hidden=m.hidden, heads=m.heads, layers=m.layers,
                     max_offset=0)


def full_gpt(cfg: TrainConfig, vocab: int) -> nn.Module:
    """The whole GPT in one process, named as the pipeline ranks name it (``layers.<i>...``)."""
    model = nn.Module()
    model.layers = StageModule(*gpt_layers(gpt_config(cfg, vocab), seed=cfg.run.seed))
    return model


def from_layers(layers: Sequence[nn.Module], schedule: Schedule, pp_rank: int,
                counts: Sequence[int] | None = None) -> RankModel:
    """Split ``layers`` into ``schedule.num_stages`` consecutive stages; keep this pipeline rank's."""
    counts = tuple(counts) if counts is not None else even_counts(len(layers), schedule.num_stages)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    mine = schedule.placement.stages_of(pp_rank)
    stages: dict[int, nn.Module] = {s: StageModule(*layers[starts[s]:starts[s] + counts[s]]) for s in mine}
    return RankModel(stages, {s: starts[s] for s in mine})


def from_stage_modules(modules: Sequence[nn.Module], schedule: Schedule, pp_rank: int) -> RankModel:
    """One module per global stage (all of them, built identically on every rank); keep this rank's."""
    if len(modules) != schedule.num_stages:
        from pipeoffload.errors import ConfigError

        raise ConfigError(f"{len(modules)} stage modules for a schedule of {schedule.num_stages} stages "
                          "(pp * stages_per_rank): give one module per stage or a list of layers")
    stages = {s: modules[s] for s in schedule.placement.stages_of(pp_rank)}
    return RankModel(stages)


def gpt_rank_model(cfg: TrainConfig, vocab: int, schedule: Schedule, pp_rank: int, device: torch.device) -> RankModel:
    layers = [layer.to(device) for layer in gpt_layers(gpt_config(cfg, vocab), seed=cfg.run.seed)]
    return from_layers(layers, schedule, pp_rank)


def apply_tensor_parallel(model: RankModel, tp_mesh: DeviceMesh, seq_len: int | None = None) -> None:
    """Shard the GPT blocks of each stage over ``tp_mesh`` (column/row parallel, sequence parallel)."""
    for stage in model.stages.values():
        parallelize_gpt_stage(stage, tp_mesh, seq_len=seq_len)
