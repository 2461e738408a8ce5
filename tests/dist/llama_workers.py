"""Rank code for the Llama-model tests (importable by spawned processes)."""
from __future__ import annotations

from typing import Any

import torch

from pipeoffload import generate, lower
from pipeoffload.llama_config import LlamaShape
from pipeoffload.models import build_rank_stages, even_counts, lm_loss
from pipeoffload.models.llama import llama_layers
from pipeoffload.profiling import profile_stages
from pipeoffload.runtime import PipelineRunner

MEMORY_SHAPE = LlamaShape(vocab=128, hidden=64, layers=4, heads=4, kv_heads=2, ffn_hidden=96)


def memory_worker(rank: int, world: int, cases: list[tuple[str, int, str]], seq: int, microbatches: int) -> list[dict]:
    """Per case: the runtime's peak activation bytes and per-stage slot bytes on this rank, and (rank 0)
    the profiler's per-stage activation bytes of one microbatch."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, MEMORY_SHAPE.vocab, (microbatches, seq), generator=gen)
    targets = torch.randint(0, MEMORY_SHAPE.vocab, (microbatches, seq), generator=gen)
    out = []
    for family, v, policy in cases:
        schedule = generate(family, world, microbatches, v)
        what, _, which = policy.partition(":")
        schedule = lower(schedule, **({what: which} if which else {}))
        layers = llama_layers(MEMORY_SHAPE, seed=0, tie=False)
        counts = even_counts(len(layers), schedule.num_stages)
        result: dict[str, Any] = {"schedule": schedule.to_json()}
        if rank == 0:
            stages = [torch.nn.Sequential(*layers[sum(counts[:s]):sum(counts[:s + 1])]) for s in range(len(counts))]
            stages = [_Unpack(m) for m in stages]
            # one microbatch as the runtime holds it: its own storage (not a view of the batch)
            prof = profile_stages(stages, (tokens[:1].clone(), None, 0), loss_fn=lm_loss, target=targets[:1].clone(),
                                  warmup=0,
                                  repeats=1)
            result["profiled"] = {s: p.activation_bytes for s, p in enumerate(prof.stages)}
        mine = build_rank_stages(layers, counts, schedule.placement, rank)
        runner = PipelineRunner(mine, schedule, rank, loss_fn=lm_loss, timeout=120, min_offload_bytes=1)  # count all
        runner.step((tokens, None, 0), targets)
        result["trace"] = runner.trace.as_dict()
        result["slot_bytes"] = dict(runner.slot_bytes)
        out.append(result)
    return out


class _Unpack(torch.nn.Module):
    """A stage as the runtime calls it: tuples between layers are unpacked into the next one's arguments."""

    def __init__(self, seq: torch.nn.Sequential) -> None:
        super().__init__()
        self.seq = seq

    def forward(self, *args: Any) -> Any:
        value: Any = args
        for layer in self.seq:
            value = layer(*(value if isinstance(value, tuple) else (value,)))
        return value
