"""``pipeoffload train --plan auto --memory GIB [--gpu NAME]``: ask the planner, then train its choice.

The planner (pure Python) searches layouts (pp x tp x dp over ``--nproc`` ranks), schedules and
offload/recompute policies for the reference GPT of the config under the memory budget; its best
plan fills every layout/schedule key the user did not give explicitly.
"""
from __future__ import annotations

import importlib.util
import logging
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig

log = logging.getLogger(__name__)


def planned_config(cfg: TrainConfig, memory_gib: float | None, gpu: str | None, explicit: set[str]) -> TrainConfig:
    from pipeoffload.planner import ModelSpec, PlanRequest, find_plans, hardware_preset
    from pipeoffload.planner.emit import offload_ratio
    from pipeoffload.planner.hardware import GIB

    if memory_gib is None or memory_gib <= 0:
        raise ConfigError("--plan auto needs --memory GIB (> 0): the per-GPU memory budget to plan for")
    ranks = cfg.parallel.nproc or cfg.world
    vocab = 256 if cfg.data.tokenizer == "byte" else int(cfg.data.tokenizer.partition(":")[2])
    model = ModelSpec(name="gpt", layers=cfg.model.layers, hidden=cfg.model.hidden, heads=cfg.model.heads,
                      seq=cfg.model.seq_len,
                      vocab=vocab, microbatch=1, flash_attention=False, dropout=False)
    tp_ok = importlib.util.find_spec("pipeoffload.models.tensor_parallel") is not None
    request = PlanRequest(model=model, hardware=hardware_preset(gpu or "a100"), gpus=ranks,
                          global_batch=cfg.data.global_batch, memory_budget=memory_gib * GIB,
                          tp_sizes=None if tp_ok else (1,), top=1, max_stall=cfg.schedule.max_stall)
    result = find_plans(request)
    best = result.best(1)
    if not best:
        raise ConfigError(f"--plan auto: no layout of {ranks} ranks fits {memory_gib:g} GiB per GPU; raise --memory, "
                          "use more ranks (--nproc) or a smaller model")
    plan = best[0]
    c = plan.choice
    chosen: dict[str, Any] = {"pp": plan.layout.pp, "tp": plan.layout.tp, "dp": plan.layout.dp, "schedule": c.family,
              "stages_per_rank": c.stages_per_rank, "group_size": c.group_size or 0, "offload": str(c.offload),
              "recompute": str(c.recompute), "microbatches": plan.microbatches}
    updates = {k: v for k, v in chosen.items() if k not in explicit}
    updates["max_stall"] = c.offload.max_stall  # the budget stays only where the chosen plan uses it
    if c.offload.kind != "none" and "offload_ratio" not in explicit:  # copies planned for the planner's link
        updates["offload_ratio"] = round(offload_ratio(request, plan), 4)
    log.warning("--plan auto chose %s (%.0f tokens/s predicted, %.2f GiB per GPU)",
                ", ".join(f"{k}={v}" for k, v in chosen.items()), plan.tokens_per_second, plan.memory.total / GIB)
    return cfg.updated(nproc=ranks if cfg.parallel.nproc else 0, **updates)
