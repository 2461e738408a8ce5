"""Rank functions for the training tests (importable by spawned processes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeoffload.train.config import TrainConfig


def gpt_params(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """Train like `pipeoffload train` (no run directory); return this rank's parameters and the history."""
    from pipeoffload.models import lm_loss
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.job import TokenBatches, lowered_schedule
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.model import apply_tensor_parallel, gpt_rank_model
    from pipeoffload.train.optim import local_tensor

    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path("."), cfg.model.seq_len, cfg.data.val_fraction)
    schedule = lowered_schedule(cfg)
    model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
    if cfg.parallel.tp > 1:
        apply_tensor_parallel(model, ctx.tp_mesh())
    trainer = Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg), None)
    result = trainer.fit()
    result["params"] = {n: local_tensor(p).detach().clone() for n, p in trainer.named.items()}
    result["coords"] = (ctx.dp_rank, ctx.pp_rank, ctx.tp_rank)
    return result
