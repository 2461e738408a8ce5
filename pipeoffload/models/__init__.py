"""Reference models and helpers to split a model into pipeline stages (imports torch)."""
from pipeoffload.models.gpt import GPTConfig, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import StageModule, build_rank_stages, even_counts, split_layers

__all__ = [
    "GPTConfig", "StageModule", "build_rank_stages", "even_counts", "gpt_layers", "lm_loss", "sample_batch",
    "split_layers",
]
