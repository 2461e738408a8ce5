"""Simulated vs measured step time per schedule, with profiled costs (gloo ranks on CPU).

Profiles the pipeline stages of a small GPT in this process (one thread, as each spawned rank has),
builds the ``CostModel`` (P2P time from a measured gloo ping-pong; I and W timed as the runtime
splits the backward; the runtime's fixed cost per action measured by ``measure_action_overhead``),
simulates each schedule, then runs it with ``PipelineRunner`` on spawned gloo ranks and compares
the median step time (slowest rank; ranks leave a barrier before each step). Two predictions are
printed: with the per-action overhead in the cost model, and without it (what the simulator
believed before). The runtime runs unmeasured steps (``measure_memory=False``), as training does
between logged steps. Per kind, the median duration the runtime's trace recorded is printed beside
the profiled one. The load average before and after each case is printed: a shared machine is noisy.

    .venv/bin/python benchmarks/sim_vs_measured.py [--ranks 2 4] [--steps 6]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections import defaultdict

import torch
import torch.distributed as dist

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind
from pipeoffload.models.gpt import GPTConfig, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import build_rank_stages, even_counts, split_layers
from pipeoffload.passes.lower import lower
from pipeoffload.profiling import measure_action_overhead, profile_stages, replayed_action_times, with_action_times
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.comm import LoopbackTransport
from pipeoffload.runtime.launch import spawn
from pipeoffload.runtime.spec import spec_of
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

CFG = GPTConfig(vocab=256, seq=128, hidden=128, heads=4, layers=8, flash=False)
MICROBATCH = 2  # sequences per microbatch
MICROBATCHES = 8
CASES = [("1f1b", 1), ("interleaved-1f1b", 2), ("group-interleaved", 2), ("zb-v", 2)]
COMPUTE = (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W)


def _ping_pong(rank: int, world: int, nbytes: int, repeats: int) -> float:
    """Median one-way time of a gloo send/recv of ``nbytes`` between ranks 0 and 1."""
    torch.set_num_threads(1)
    buf = torch.empty(nbytes // 4)
    samples = []
    for n in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if n >= 2:
            samples.append((time.perf_counter() - start) / 2)
    return statistics.median(samples)


def _run(rank: int, world: int, family: str, v: int, steps: int) -> tuple[list[float], dict[str, list[float]]]:
    """Step walls of this rank, and its compute actions' durations by kind (after two warm-up steps);
    key "comm": per step, the seconds this rank spent in its batches of sends and receives."""
    torch.set_num_threads(1)
    schedule = lower(generate(family, world, MICROBATCHES, v))
    counts = even_counts(len(gpt_layers(CFG)), world * v)
    stages = build_rank_stages(gpt_layers(CFG), counts, schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, measure_memory=False)
    inputs, targets = sample_batch(CFG, MICROBATCH * MICROBATCHES, padded=False)
    walls: list[float] = []
    kinds: dict[str, list[float]] = defaultdict(list)
    for n in range(steps + 2):
        dist.barrier()
        runner.step(inputs, targets)
        for p in (p for s in stages.values() for p in s.parameters()):
            p.grad = None
        if n >= 2:
            walls.append(runner.trace.wall)  # type: ignore[union-attr]
            batches = set()
            for r in runner.trace.records:  # type: ignore[union-attr]
                if r.action.kind in COMPUTE:
                    kinds[f"{r.action.kind}{r.action.stage}"].append(r.end - r.start)
                else:  # the actions of one comm batch share their start and end
                    batches.add((r.start, r.end))
            kinds["comm"].append(sum(end - start for start, end in batches))
    runner.close()
    return walls, dict(kinds)


def _profile(ranks: int, v: int, p2p_time: float, overhead: float) -> CostModel:
    torch.set_num_threads(1)
    layers = gpt_layers(CFG)
    stages = split_layers(layers, even_counts(len(layers), ranks * v))
    (tokens, mask, offset), targets = sample_batch(CFG, MICROBATCH, padded=False)
    profile = profile_stages(stages, (tokens, mask, offset), loss_fn=lm_loss, target=targets, warmup=3, repeats=7)
    return profile.cost_model(p2p_time=p2p_time, action_overhead=overhead)


def _replayed(ranks: int, family: str, v: int, costs: CostModel) -> CostModel:
    """``costs`` with the F/B/I/W times of every rank's actions replayed alone (``replayed_action_times``)."""
    torch.set_num_threads(1)
    schedule = lower(generate(family, ranks, MICROBATCHES, v))
    counts = even_counts(len(gpt_layers(CFG)), ranks * v)
    inputs, targets = sample_batch(CFG, MICROBATCH * MICROBATCHES, padded=False)
    # every boundary's spec, from one microbatch through the whole model (a lone rank cannot infer them)
    x: tuple = (inputs[0][:MICROBATCH], *inputs[1:])
    specs = {}
    for s, module in enumerate(split_layers(gpt_layers(CFG), counts)[:-1]):
        x = module(*x)
        specs[s] = spec_of(x)
    runners = [PipelineRunner(build_rank_stages(gpt_layers(CFG), counts, schedule.placement, r), schedule, r,
                              loss_fn=lm_loss, measure_memory=False, output_specs=specs,
                              transport=LoopbackTransport(torch.device("cpu")))
               for r in range(ranks)]
    return with_action_times(costs, replayed_action_times(runners, inputs, targets, steps=3, warmup=1))


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--schedules", nargs="+", default=[f for f, _ in CASES], choices=[f for f, _ in CASES])
    args = parser.parse_args()
    torch.set_num_threads(1)
    boundary = MICROBATCH * CFG.seq * CFG.hidden * 4
    print(f"GPT {CFG.layers} blocks, hidden {CFG.hidden}, seq {CFG.seq}, {MICROBATCH} sequences per microbatch, "
          f"{MICROBATCHES} microbatches; gloo on CPU, 1 thread per rank; {os.cpu_count()} CPUs; torch {torch.__version__}")
    overhead = measure_action_overhead()
    print(f"runtime's fixed cost per compute action (measure_action_overhead): {overhead * 1e6:.0f} us")
    rows = []
    for ranks in args.ranks:
        pp = spawn(_ping_pong, ranks, (boundary, 20), deadline=300)
        if not pp.ok:
            raise SystemExit("\n".join(e for e in pp.errors if e))
        p2p = max(pp.results)
        print(f"{ranks} ranks: P2P one-way for {boundary} B: {p2p * 1e3:.3f} ms")
        costs = {v: _profile(ranks, v, p2p, overhead) for v in sorted({v for f, v in CASES if f in args.schedules})}
        for family, v in (c for c in CASES if c[0] in args.schedules):
            c = costs[v]
            schedule = generate(family, ranks, MICROBATCHES, v)
            with_overhead = simulate(lower(schedule, c), c).makespan
            bare = dataclasses.replace(c, action_overhead=0.0)
            without = simulate(lower(schedule, bare), bare).makespan
            load = _load()
            replay = _replayed(ranks, family, v, c)
            replayed = simulate(lower(schedule, replay), replay).makespan
            run = spawn(_run, ranks, (family, v, args.steps), deadline=900)
            if not run.ok:
                raise SystemExit("\n".join(e for e in run.errors if e))
            measured = statistics.median(max(w) for w in zip(*(r[0] for r in run.results)))
            rows.append((ranks, family, v, with_overhead, without, replayed, measured, load, _load()))
            print(f"{ranks} ranks {family:<17} v={v}: simulated {with_overhead:.3f} s ({(with_overhead - measured) / measured:+.1%}), "
                  f"without the per-action overhead {without:.3f} s ({(without - measured) / measured:+.1%}), "
                  f"with replayed action times {replayed:.3f} s ({(replayed - measured) / measured:+.1%}), "
                  f"measured {measured:.3f} s; load {load} -> {_load()}", flush=True)
            comm = [statistics.median(kinds["comm"]) for _, kinds in run.results]
            print("    in send/receive batches per step, per rank: " + ", ".join(f"{x * 1e3:.0f} ms" for x in comm))
            durations: dict[str, list[float]] = defaultdict(list)
            for _, kinds in run.results:
                for key, values in kinds.items():
                    if key == "comm":
                        continue
                    durations[key] += values
            for key in sorted(durations, key=lambda k: (int(k[1:]), k[0])):
                kind, stage = ActionKind(key[0]), int(key[1:])
                profiled = {ActionKind.F: c.f, ActionKind.B: c.b, ActionKind.I: c.i, ActionKind.W: c.w}[kind](stage)
                again = {ActionKind.F: replay.f, ActionKind.B: replay.b, ActionKind.I: replay.i, ActionKind.W: replay.w}[kind](stage)
                print(f"    {key:>4}: runtime {statistics.median(durations[key]) * 1e3:6.2f} ms, "
                      f"cost model {profiled * 1e3:6.2f} ms, replayed {again * 1e3:6.2f} ms")
    print("\nranks  schedule           v  simulated s  measured s  error   (without overhead)   replayed s  error")
    for ranks, family, v, sim, bare, replayed, measured, _, _ in rows:
        print(f"{ranks:>5}  {family:<17} {v:>2} {sim:>11.3f} {measured:>11.3f} {(sim - measured) / measured:>+7.1%}   "
              f"({bare:.3f} s, {(bare - measured) / measured:+.1%}) {replayed:>11.3f} {(replayed - measured) / measured:>+7.1%}")


if __name__ == "__main__":
    main()
