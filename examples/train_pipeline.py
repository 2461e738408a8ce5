"""Train a model split into pipeline stages with any schedule and offload policy (the public API).

    torchrun --standalone --nproc_per_node 2 examples/train_pipeline.py            # one process per rank
    python examples/train_pipeline.py --spawn 2                                      # same, spawned here
"""
from __future__ import annotations

import argparse

import torch

from pipeoffload import Schedule, generate, lower
from pipeoffload.errors import ConfigError
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.launch import init_from_env, spawn


def pipeline(world: int, offload: str) -> Schedule:
    return lower(generate("group-interleaved", world, 8, 2, group_size=world), offload=offload)


def run(rank: int, world: int, args: argparse.Namespace) -> float | None:
    schedule = pipeline(world, args.offload)
    cfg = GPTConfig(layers=8, hidden=64, seq=32)
    layers = gpt_layers(cfg, seed=0)  # embedding, blocks, head: every rank builds the same weights
    stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, rank)
    optimizer = torch.optim.AdamW([p for s in stages.values() for p in s.parameters()], lr=1e-3)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss)
    loss = None
    for step in range(args.steps):
        inputs, targets = sample_batch(cfg, 16, seed=step)
        loss = runner.step(inputs, targets)  # the loss on the rank holding the last stage, else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if loss is not None:
            print(f"step {step}: loss {loss.item():.4f}; rank {rank} peak activations {runner.trace.peak_bytes} B")
    return None if loss is None else loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawn", type=int, default=0, help="spawn this many ranks instead of using torchrun")
    parser.add_argument("--offload", default="all")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    try:  # a bad --offload or --spawn: one line here, not a traceback from every rank
        pipeline(args.spawn or 1, args.offload)  # (torchrun's world is checked by its ranks)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if args.spawn:
        result = spawn(run, args.spawn, (args,))
        if not result.ok:
            raise SystemExit("\n".join(e for e in result.errors if e))
    else:
        try:
            rank, world, _ = init_from_env()
        except ConfigError as err:  # plain ``python`` without --spawn: say how to launch, in one line
            raise SystemExit(f"{err}; here: python examples/train_pipeline.py --spawn 2") from None
        run(rank, world, args)


if __name__ == "__main__":
    main()
