"""Simulated vs measured step time per schedule, with profiled costs (gloo ranks on CPU).

Right before each case, profiles the pipeline stages of a small GPT in this process (one thread, as
each spawned rank has), measures the machine's concurrency slowdown and what the runtime's messages
cost, builds the ``CostModel`` (I and W timed as the runtime splits the backward; the runtime's fixed
cost per action measured by ``measure_action_overhead``), simulates the schedule, then runs it with
``PipelineRunner`` on spawned gloo ranks and compares the median step time (slowest rank; ranks
leave a barrier before each step). The runtime runs unmeasured steps (``measure_memory=False``), as
training does between logged steps.

The prediction (what a user gets from the profiler, every figure measured before the run):
- compute: each rank's actions replayed through ``PipelineRunner`` on a ``LoopbackTransport``, one
  rank after the other in this process, each action's thread CPU (``replayed_action_times(...,
  clock=time.thread_time)``): the stages as the runtime runs them. ``profile_stages`` times each
  stage's F, I and W alone in a warm loop and misses what the runtime does around them (the
  activation store's saved-tensor hooks in every F of a split backward, many microbatches alive at
  once): on group-interleaved and zb-v the replay takes 1.06-1.11x its CPU in all, 1.1-1.4x on
  some ranks (docs/runtime.md);
- the machine: its cores (``CostModel.cores``) and its other load (``other_load``, from
  ``measure_concurrency`` on the thread's CPU clock: 1..ranks processes computing at once against
  the CPU time alone);
- messages: ``measure_message_costs`` (the runtime's own transport on a synthetic 1F1B pipeline of
  as many ranks, read from its traces): the lane per send/receive (``message_time``), the mean
  transfer to a waiting receiver (``p2p_time``) and the transport threads' CPU (``message_cpu``).
The simulator shares the cores among the runnable ranks and transports (processor sharing).
For comparison, none seeing the measured steps:
- stage profile: the same with ``profile_stages``' CPU per action (the former prediction);
- per-rank stretch: ``contended_costs`` (each rank stretched by the measured slowdown with the
  ranks busy with it) with the fitted transfer (``fitted_p2p_time``);
- with ping-pong: the same with ``measure_p2p_time``'s gloo ping-pong and no ``message_time``;
- the wall-clock profile alone, without the concurrency (every rank a core of its own);
- together: every rank's actions replayed through the runtime on a ``LoopbackTransport`` by all
  ranks at once, in the ranks' own processes, one replayed step right before each measured one
  (``concurrent_action_times``): the run's own minutes, but every rank busy all the time.
- paired: the prediction again with the replay alone taken in the run's own seconds: before every
  measured step each rank replays one step of its actions while the others wait in a barrier
  (``_replay_alone``), so that machine drift between the profile and the run cannot explain a miss.
The last column, drift, is the same replay alone once more right after the run over the one before
it (the rank furthest from 1.0): the machine's own change during the case, which no prediction made
before the run can see (a drift beyond a few percent makes that row's error the machine's, not the
model's). A case whose drift is beyond ``--steady`` (10%) is measured again, at most ``--tries`` (3)
times in all; every attempt stays printed, the table has the last one and the count (tries).

Per action, the runtime's wall and thread-CPU durations are printed beside the replay's, the
profile's, the stretched ones and the concurrent replay's: where the runtime's wall exceeds its own
CPU time, the rank was off the CPU (other processes, the other ranks); where its CPU time exceeds
the replay's, the run did more work than the runtime alone (caches shared, the machine slower). The
load average before and after each case is printed: a shared machine is noisy.

    .venv/bin/python benchmarks/sim_vs_measured.py [--ranks 2 4] [--steps 6] [--message-check]

``--message-check`` checks the message model alone: synthetic pipelines of each schedule run through
the runtime and simulated with their own compute walls (the load falls on both alike), with the
message figures read on synthetic 1F1B, against the ping-pong.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind
from pipeoffload.models.gpt import GPTConfig, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import build_rank_stages, even_counts, split_layers
from pipeoffload.passes.lower import lower
from pipeoffload.profiling import (
    action_clock,
    concurrent_action_times,
    contended_costs,
    measure_action_overhead,
    measure_concurrency,
    measure_message_costs,
    measure_p2p_time,
    other_load,
    profile_stages,
    replayed_action_times,
    synthetic_run,
    with_action_times,
)
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
BOUNDARY = MICROBATCH * CFG.seq * CFG.hidden * 4  # bytes of one boundary message


class Row(NamedTuple):
    """One case of the table: the step times in seconds (predicted and its alternatives, measured) and
    the drift (the replay after the run over the one before, the rank furthest from 1.0)."""
    ranks: int
    family: str
    v: int
    predicted: float
    paired: float  # the same, the replay taken between the measured steps (``_replay_alone``)
    profiled: float
    stretched: float
    former: float
    alone: float
    together: float
    measured: float
    drift: float


def _specs(counts: tuple[int, ...] | list[int]) -> dict[int, Any]:
    """Every boundary's spec, from one microbatch through the whole model (a replaying rank, on a
    ``LoopbackTransport``, cannot infer them from its peers)."""
    inputs, _ = sample_batch(CFG, MICROBATCH * MICROBATCHES, padded=False)
    x: tuple = (inputs[0][:MICROBATCH], *inputs[1:])
    specs = {}
    for s, module in enumerate(split_layers(gpt_layers(CFG), counts)[:-1]):  # with autograd: the specs say
        x = module(*x)                                                        # which outputs get gradients
        specs[s] = spec_of(x)
    return specs


def _durations(trace: Any, sink: dict[str, list[float]]) -> None:
    """Compute actions' wall durations by kind and stage; key "comm": the seconds spent in batches of
    sends and receives (the actions of one batch share their start and end)."""
    batches = set()
    for r in trace.records:
        if r.action.kind in COMPUTE:
            sink[f"{r.action.kind}{r.action.stage}"].append(r.end - r.start)
        else:
            batches.add((r.start, r.end))
    sink["comm"].append(sum(end - start for start, end in batches))


def _preemptions() -> int:
    """This thread's involuntary context switches so far: each is a time slice lost to another
    thread, after which its caches are (partly) cold."""
    with open("/proc/thread-self/status") as status:
        return next(int(line.split(":")[1]) for line in status if line.startswith("nonvoluntary_ctxt_switches"))


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RankRun(NamedTuple):
    """What one rank of a measured case returns (every figure after two warm-up steps)."""
    walls: list[float]  # each measured step's wall on this rank
    kinds: dict[str, list[float]]  # its actions' wall and thread-CPU durations, preemptions, other threads' CPU
    together: dict[tuple[ActionKind, int], list[float]]  # replayed with every rank at once
    alone: dict[tuple[ActionKind, int], list[float]]  # replayed alone, the other ranks waiting


def _replay_alone(rank: int, world: int, runner: Any, inputs: Any, targets: Any,
                  sink: dict[tuple[ActionKind, int], list[float]]) -> None:
    """One step of each rank's actions replayed on its ``LoopbackTransport`` runner, one rank after the
    other while the others wait in a barrier (off the CPU): ``replayed_action_times``' thread CPU, taken
    in the ranks' own processes between measured steps, so that it sees the machine of the minutes
    the steps run in (the drift column shows one replay moving by up to a third within a case). The
    caller's barrier before its measured step ends the last turn."""
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            with action_clock(runner, time.thread_time, sink):
                runner.step(inputs, targets)
            for p in (p for s in runner.stages.values() for p in s.module.parameters()):
                p.grad = None


def _run(rank: int, world: int, family: str, v: int, steps: int) -> RankRun:
    """Step walls of this rank and its actions' durations (wall, and thread CPU under "cpu ..."),
    after two warm-up steps, with per step the compute thread's involuntary context switches
    ("preempted") and the CPU seconds of the process's other threads ("threads": gloo's, the
    heartbeat); and, before each measured step, its actions replayed on a ``LoopbackTransport``
    twice: alone (``_replay_alone``: each rank in turn) and with every rank replaying at once
    (``concurrent_action_times``), so that all three see the same machine."""
    torch.set_num_threads(1)
    schedule = lower(generate(family, world, MICROBATCHES, v))
    counts = even_counts(len(gpt_layers(CFG)), world * v)
    stages = build_rank_stages(gpt_layers(CFG), counts, schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, measure_memory=False)
    alone = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, measure_memory=False, output_specs=_specs(counts),
                           transport=LoopbackTransport(torch.device("cpu")))
    inputs, targets = sample_batch(CFG, MICROBATCH * MICROBATCHES, padded=False)
    kinds: dict[str, list[float]] = defaultdict(list)
    cpu: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)  # each compute action's thread CPU
    walls: list[float] = []
    replayed: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    by_turns: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    for n in range(steps + 2):
        for key, values in concurrent_action_times(alone, inputs, targets, barrier=dist.barrier, steps=1,
                                                   warmup=0 if n else 1).items():
            replayed[key] += values
        turns: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
        _replay_alone(rank, world, alone, inputs, targets, turns)
        if n >= 2:
            for key, values in turns.items():
                by_turns[key] += values
        dist.barrier()
        cpu.clear()
        preempted, process, thread = _preemptions(), _process_cpu(), time.thread_time()
        with action_clock(runner, time.thread_time, cpu):
            runner.step(inputs, targets)
        if n >= 2:
            kinds["preempted"].append(_preemptions() - preempted)
            kinds["threads"].append((_process_cpu() - process) - (time.thread_time() - thread))
            for (kind, stage), values in cpu.items():
                kinds[f"cpu {kind}{stage}"] += values
        for p in (p for s in stages.values() for p in s.parameters()):
            p.grad = None
        if n >= 2:
            walls.append(runner.trace.wall)  # type: ignore[union-attr]
            _durations(runner.trace, kinds)
    runner.close()
    return RankRun(walls, dict(kinds), dict(replayed), dict(by_turns))


def _profile(ranks: int, v: int, p2p_time: float, overhead: float, message: float,
             ping_pong: float) -> tuple[CostModel, CostModel]:
    """What a user gets: ``profile_stages`` (each stage alone, in this process) on the thread's CPU
    clock and, right after it, ``measure_concurrency`` on the same clock (the same model's compute
    on 1..ranks processes at once, against its CPU time alone: time-sharing, shared caches and the
    machine's load now), in one cost model; and, to compare, the wall-clock profile as it was the
    default (no concurrency)."""
    torch.set_num_threads(1)
    layers = gpt_layers(CFG)
    stages = split_layers(layers, even_counts(len(layers), ranks * v))
    (tokens, mask, offset), targets = sample_batch(CFG, MICROBATCH, padded=False)
    wall = profile_stages(stages, (tokens, mask, offset), loss_fn=lm_loss, target=targets, warmup=3, repeats=7)
    cpu = profile_stages(stages, (tokens, mask, offset), loss_fn=lm_loss, target=targets, warmup=3, repeats=7,
                         clock=time.thread_time)
    slowdown = measure_concurrency(stages, (tokens, mask, offset), loss_fn=lm_loss, target=targets, ranks=ranks,
                                   clock=time.thread_time)
    return (cpu.cost_model(p2p_time=p2p_time, action_overhead=overhead, message_time=message,
                           concurrency_slowdown=slowdown),
            wall.cost_model(p2p_time=ping_pong, action_overhead=overhead))


def _replayed_cpu(ranks: int, family: str, v: int) -> dict[tuple[ActionKind, int], float]:
    """The profile of the stages as the runtime runs them: every rank's actions of ``family`` replayed
    through ``PipelineRunner`` on a ``LoopbackTransport``, one rank after the other in this process
    (``replayed_action_times``), each action's median thread CPU. The stage profile misses what the
    runtime does around the compute (the activation store's hooks in F where the backward is split,
    microbatches alive at once); this does not."""
    torch.set_num_threads(1)
    schedule = lower(generate(family, ranks, MICROBATCHES, v))
    counts = even_counts(len(gpt_layers(CFG)), ranks * v)
    specs, cpu = _specs(counts), torch.device("cpu")
    runners = [PipelineRunner(build_rank_stages(gpt_layers(CFG), counts, schedule.placement, r), schedule, r,
                              loss_fn=lm_loss, measure_memory=False, output_specs=specs, transport=LoopbackTransport(cpu))
               for r in range(ranks)]
    inputs, targets = sample_batch(CFG, MICROBATCH * MICROBATCHES, padded=False)
    try:
        return replayed_action_times(runners, inputs, targets, steps=4, warmup=2, clock=time.thread_time)
    finally:
        for runner in runners:
            runner.close()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _cost(costs: CostModel, kind: ActionKind, stage: int) -> float:
    return {ActionKind.F: costs.f, ActionKind.B: costs.b, ActionKind.I: costs.i, ActionKind.W: costs.w}[kind](stage)


def _waits(timeline: Any) -> list[float]:
    """Per rank, the simulated seconds in communication actions (a receive lasts until its data is in)."""
    return [sum(end - start for a, start, end in timeline.events(r) if a.kind not in COMPUTE)
            for r in range(timeline.schedule.num_ranks)]


def _per_rank(schedule: Any, costs: CostModel) -> list[float]:
    """Each rank's compute seconds per step under ``costs`` (its F, B, I and W counted)."""
    return [sum(_cost(costs, a.kind, a.stage) for a in row if a.kind in COMPUTE) for row in schedule.actions]


def _medians(samples: Any) -> dict[tuple[ActionKind, int], float]:
    """Each action's median over every rank's samples (an iterable of per-rank dicts)."""
    pooled: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    for per_rank in samples:
        for key, values in per_rank.items():
            pooled[key] += values
    return {key: statistics.median(values) for key, values in pooled.items()}


def _err(sim: float, measured: float) -> str:
    return f"{(sim - measured) / measured:+.1%}"


def _case(ranks: int, family: str, v: int, ping_pong: float, overhead: float, steps: int) -> Row:
    """Profile, simulate ``family`` (processor sharing; the per-rank stretch; the wall-clock profile
    alone), run it, print the case; returns its table row. The profile is taken right before the run:
    the same minutes."""
    load = _load()
    messages = measure_message_costs(BOUNDARY, ranks=ranks)
    c, wall = _profile(ranks, v, messages.fitted_p2p_time, overhead, messages.message_time, ping_pong)
    schedule = generate(family, ranks, MICROBATCHES, v)
    alone = simulate(lower(schedule, wall), wall).makespan
    cores = len(os.sched_getaffinity(0))
    staged = replace(c, concurrency_slowdown=None, p2p_time=messages.p2p_time, cores=cores,
                     message_cpu=messages.message_cpu, other_load=other_load(c.concurrency_slowdown or (1.0,), cores))
    profiled = simulate(lower(schedule, staged), staged).makespan
    shared = with_action_times(staged, _replayed_cpu(ranks, family, v))  # the runtime's own CPU per action
    timeline = simulate(lower(schedule, shared), shared)
    predicted = timeline.makespan
    contended = contended_costs(schedule, c)
    stretched = simulate(lower(schedule, contended), contended).makespan
    former_costs = contended_costs(schedule, replace(c, message_time=0.0, p2p_time=ping_pong))
    former = simulate(lower(schedule, former_costs), former_costs).makespan
    run = spawn(_run, ranks, (family, v, steps), deadline=900)
    if not run.ok:
        raise SystemExit("\n".join(e for e in run.errors if e))
    results: list[RankRun] = run.results
    measured = statistics.median(max(w) for w in zip(*(r.walls for r in results)))
    together_costs = with_action_times(wall, _medians(r.together for r in results))
    together = simulate(lower(schedule, together_costs), together_costs).makespan
    # the prediction's model and messages, with the replay taken between the measured steps
    paired_costs = with_action_times(staged, _medians(r.alone for r in results))
    paired = simulate(lower(schedule, paired_costs), paired_costs).makespan
    after = _load()
    # the same replay right after the run: not the prediction's, the machine's drift over the case
    drift = [x / y for x, y in zip(_per_rank(schedule, with_action_times(staged, _replayed_cpu(ranks, family, v))),
                                   _per_rank(schedule, shared))]
    slowdown = ", ".join(f"{x:.2f}" for x in c.concurrency_slowdown or ())
    print(f"{ranks} ranks {family:<17} v={v}: measured {measured:.3f} s; simulated with the runtime's CPU per "
          f"action (replayed alone), its message costs and the cores shared (processor sharing) {predicted:.3f} s "
          f"({_err(predicted, measured)}); the same with the stage profile's CPU {profiled:.3f} s "
          f"({_err(profiled, measured)}); with the measured concurrency per rank (contended_costs) and the fitted "
          f"transfer instead {stretched:.3f} s ({_err(stretched, measured)}); with the ping-pong and no message "
          f"costs {former:.3f} s ({_err(former, measured)}); "
          f"the wall-clock profile alone {alone:.3f} s "
          f"({_err(alone, measured)}); replayed together {together:.3f} s ({_err(together, measured)}); "
          f"the prediction with the replay alone taken between the measured steps {paired:.3f} s "
          f"({_err(paired, measured)}); "
          f"slowdown with 1..{ranks} ranks computing: {slowdown}; load {load} -> {after}", flush=True)
    print(f"    the runtime's messages (measure_message_costs): {messages.message_time * 1e3:.2f} ms on the lane per "
          f"send/receive and {messages.message_cpu * 1e3:.2f} ms of CPU on the transport's threads (other load: "
          f"{shared.other_load:.2f} runnable threads), "
          f"{messages.p2p_time * 1e3:.2f} ms from a send to a waiting receiver (ping-pong "
          f"{ping_pong * 1e3:.2f} ms; {messages.samples[0]} / {messages.samples[1]} messages); its synthetic pipeline "
          f"measured {messages.measured_step * 1e3:.1f} ms, simulated with them {messages.simulated_step * 1e3:.1f} ms "
          f"({_err(messages.simulated_step, messages.measured_step)}), the same with a transfer of "
          f"{messages.fitted_p2p_time * 1e3:.2f} ms (fitted)")
    def median(key: str, scale: float = 1.0) -> str:  # per rank
        return ", ".join(f"{statistics.median(r.kinds[key]) * scale:.0f}" for r in results)

    print(f"    in send/receive batches per step, per rank: {median('comm', 1e3)} ms; simulated (waiting in receives): "
          + ", ".join(f"{x * 1e3:.0f}" for x in _waits(timeline)) + f" ms; the compute thread preempted "
          f"{median('preempted')} times per step, the other threads' CPU {median('threads', 1e3)} ms per step")
    durations: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for key, values in r.kinds.items():
            if key not in ("comm", "preempted", "threads"):
                durations[key] += values
    # the timeline model alone: processor sharing on the run's own thread CPU per action (not a prediction)
    own = with_action_times(shared, {(ActionKind(k[4]), int(k[5:])): statistics.median(x)
                                     for k, x in durations.items() if k.startswith("cpu")})
    own_step = simulate(lower(schedule, own), own).makespan
    def ratios(base: CostModel) -> str:  # each rank's compute CPU in the run over base's
        return ", ".join(f"{x / y:.2f}" for x, y in zip(_per_rank(schedule, own), _per_rank(schedule, base)))

    print(f"    processor sharing on the run's own thread CPU per action (the timeline model alone): "
          f"{own_step:.3f} s ({_err(own_step, measured)}); the run's compute CPU per rank over the replay's: "
          f"{ratios(shared)}; over the stage profile's: {ratios(c)}; the replay again after the run over before: "
          + ", ".join(f"{x:.2f}" for x in drift))
    print("    per action (ms): runtime wall / thread CPU | replayed alone CPU | profile CPU / wall | CPU with concurrency"
          " | replayed together | replayed alone between the steps")
    for key in sorted((k for k in durations if not k.startswith("cpu")), key=lambda k: (int(k[1:]), k[0])):
        kind, stage = ActionKind(key[0]), int(key[1:])
        print(f"    {key:>4}: {statistics.median(durations[key]) * 1e3:6.2f} / "
              f"{statistics.median(durations['cpu ' + key]) * 1e3:6.2f} | {_cost(shared, kind, stage) * 1e3:6.2f} | "
              f"{_cost(c, kind, stage) * 1e3:6.2f} / "
              f"{_cost(wall, kind, stage) * 1e3:6.2f} | "
              f"{_cost(contended, kind, stage) * 1e3:6.2f} | {_cost(together_costs, kind, stage) * 1e3:6.2f} | "
              f"{_cost(paired_costs, kind, stage) * 1e3:6.2f}")
    return Row(ranks, family, v, predicted, paired, profiled, stretched, former, alone, together, measured,
               max(drift, key=lambda x: abs(x - 1)))


def _message_check(ranks: int, families: list[str]) -> None:
    """The message model alone, on synthetic pipelines (``synthetic_run``) simulated with their own
    compute walls, so that the machine's load falls on the measured and the simulated step alike: the
    message figures read on 1F1B (``measure_message_costs``) applied to each schedule, against the ping-pong."""
    ping_pong = measure_p2p_time(BOUNDARY, ranks=ranks)
    messages = measure_message_costs(BOUNDARY, ranks=ranks)
    print(f"{ranks} ranks: ping-pong {ping_pong * 1e3:.2f} ms; the runtime's lane {messages.message_time * 1e3:.2f} ms "
          f"per send/receive, transfer to a waiting receiver {messages.p2p_time * 1e3:.2f} ms, fitted transfer "
          f"{messages.fitted_p2p_time * 1e3:.2f} ms (read on synthetic 1f1b)", flush=True)
    for family, v in (c for c in CASES if c[0] in families):
        run = synthetic_run(BOUNDARY, ranks=ranks, family=family, v=v, steps=12)

        def step(**fields: Any) -> float:
            costs = replace(run.compute, **fields)
            return simulate(lower(run.schedule, costs), costs).makespan

        measured = run.measured_step
        variants = {"ping-pong": step(p2p_time=ping_pong),
                    "runtime's messages": step(p2p_time=messages.p2p_time, message_time=messages.message_time),
                    "fitted transfer": step(p2p_time=messages.fitted_p2p_time, message_time=messages.message_time)}
        print(f"    synthetic {family:<17} v={v}: measured {measured * 1e3:.1f} ms; simulated with its compute walls and "
              + "; ".join(f"{name} {t * 1e3:.1f} ms ({_err(t, measured)})" for name, t in variants.items())
              + f"; load {_load()}", flush=True)


def _table(lines: list[str], start: int) -> dict[str, tuple[float, float, float | None]]:
    """A case's per-action rows, under the first "per action" header from ``start`` (results files
    have one to three lines between the case's and its header): key -> (the run's thread CPU, the
    stage profile's CPU, the replay's CPU or None where the file has no such column), seconds."""
    header = next((n for n in range(start, len(lines)) if lines[n].lstrip().startswith("per action")), len(lines))
    rows = {}
    for line in lines[header + 1:]:
        match = re.match(r"\s+([FBIW]\d+):\s+[\d.]+ /\s+([\d.]+) \|(?:\s+([\d.]+) \|)?\s+([\d.]+) /", line)
        if not match:
            break
        rows[match[1]] = (float(match[2]) * 1e-3, float(match[4]) * 1e-3, float(match[3]) * 1e-3 if match[3] else None)
    return rows


def _from_results(path: str, span: str, message_cpu: float, cores: int) -> None:
    """Re-simulate the cases of a results file (its lines ``span``, "FIRST-LAST" from 1: one run) with processor
    sharing: the per-action CPU of the stage profile, of the replay (files that have it) and of the run
    itself, its message lane time, its mean
    transfer, its measured concurrency as ``other_load``, the given transport CPU per SEND/RECV
    (seconds) and ``cores``. The timeline model
    checked on a run already measured (an idle one), the load of now out of it."""
    match = re.fullmatch(r"(\d+)-(\d+)", span)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        print(f"sim_vs_measured: --lines {span!r}: give FIRST-LAST, e.g. 1-152", file=sys.stderr)
        raise SystemExit(2)
    try:
        lines = open(path).read().splitlines()[int(match[1]) - 1:int(match[2])]
    except OSError as err:
        print(f"sim_vs_measured: --from-results {path!r}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{path} (lines {span}): processor sharing on {cores} cores, transport CPU "
          f"{message_cpu * 1e3:.2f} ms per send/receive, the run's message lane time and mean transfer")
    print("ranks  schedule           v  measured s   profile CPU s  error   replayed CPU s  error   the run's own CPU s  "
          "error  other load")
    for n, line in enumerate(lines):
        case = re.match(r"(\d+) ranks (\S+)\s+v=(\d+): measured ([\d.]+) s", line) if n + 1 < len(lines) else None
        lane = re.search(r"([\d.]+) ms on the lane", lines[n + 1]) if case else None
        transfer = re.search(r"([\d.]+) ms from a send to a waiting", lines[n + 1]) if case else None
        if not (case and lane and transfer):
            continue
        ranks, family, v, measured = int(case[1]), case[2], int(case[3]), float(case[4])
        factors = re.search(r"computing: ([\d., ]+);", line)
        load = other_load([float(x) for x in factors[1].split(",")], cores) if factors else 0.0
        table = _table(lines, n + 1)
        schedule = generate(family, ranks, MICROBATCHES, v)
        base = CostModel(time_f=(0.0,) * (ranks * v), time_i=0.0, time_w=0.0, time_b=0.0, cores=cores,
                         message_time=float(lane[1]) * 1e-3, p2p_time=float(transfer[1]) * 1e-3,
                         message_cpu=message_cpu, other_load=load)
        cells = []
        for column, width in ((1, 15), (2, 16), (0, 21)):  # stage profile, replay, the run's own
            times = {(ActionKind(k[0]), int(k[1:])): x[column] for k, x in table.items()}
            known = {key: t for key, t in times.items() if t is not None}
            if len(known) < len(times):  # a file from before the replay column
                cells.append(f"{'-':>{width}} {'-':>6}")
                continue
            costs = with_action_times(base, known)
            if not any(k[0] == "B" for k in table):
                costs = replace(costs, time_b=None)
            step = simulate(lower(schedule, costs), costs).makespan
            cells.append(f"{step:>{width}.3f} {_err(step, measured):>6}")
        print(f"{ranks:>5}  {family:<17} {v:>2} {measured:>10.3f} " + " ".join(cells) + f" {load:>10.2f}")


def _steady_case(ranks: int, family: str, v: int, p2p: float, overhead: float, steps: int, steady: float,
                 tries: int) -> tuple[Row, int]:
    """``_case`` measured again while its drift (the machine's own change during the case, which no
    prediction made before the run can see) is beyond ``steady``, at most ``tries`` times in all;
    every attempt stays printed, the last one is the row. With its number of attempts."""
    for attempt in range(1, tries + 1):
        row = _case(ranks, family, v, p2p, overhead, steps)
        if abs(row.drift - 1) <= steady:
            break
        if attempt < tries:
            print(f"    drift {row.drift:.2f} is beyond {steady:.0%}: the machine changed during the case; measured again")
    return row, attempt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--schedules", nargs="+", default=[f for f, _ in CASES], choices=[f for f, _ in CASES])
    parser.add_argument("--steady", type=float, default=0.1,
                        help="measure a case again while its drift is beyond this fraction (default 0.1)")
    parser.add_argument("--tries", type=int, default=3, help="at most this many attempts per case (default 3; 1: no retry)")
    parser.add_argument("--message-check", action="store_true",
                        help="only check the message model on synthetic pipelines (their own compute walls)")
    parser.add_argument("--from-results", metavar="FILE",
                        help="only re-simulate a results file's cases (its --lines) with processor sharing")
    parser.add_argument("--lines", default="1-1000000", help="with --from-results: the run's lines of FILE, FIRST-LAST")
    parser.add_argument("--message-cpu", type=float, default=0.6, help="with --from-results: transport CPU, ms")
    args = parser.parse_args()
    if args.from_results:
        _from_results(args.from_results, args.lines, args.message_cpu * 1e-3, len(os.sched_getaffinity(0)))
        return
    torch.set_num_threads(1)
    if args.message_check:
        for ranks in args.ranks:
            _message_check(ranks, args.schedules)
        return
    cores = len(os.sched_getaffinity(0))
    print(f"GPT {CFG.layers} blocks, hidden {CFG.hidden}, seq {CFG.seq}, {MICROBATCH} sequences per microbatch, "
          f"{MICROBATCHES} microbatches; gloo on CPU, 1 thread per rank; {cores} cores; torch {torch.__version__}")
    overhead = measure_action_overhead()
    print(f"runtime's fixed cost per compute action (measure_action_overhead): {overhead * 1e6:.0f} us")
    rows = []
    for ranks in args.ranks:
        p2p = measure_p2p_time(BOUNDARY, ranks=ranks)
        print(f"{ranks} ranks, {cores / ranks:g} cores per rank{' (oversubscribed)' if ranks > cores else ''}: "
              f"P2P one-way for {BOUNDARY} B, the other ranks computing (measure_p2p_time): {p2p * 1e3:.3f} ms")
        for family, v in (c for c in CASES if c[0] in args.schedules):
            rows.append(_steady_case(ranks, family, v, p2p, overhead, args.steps, args.steady, args.tries))
    print("\nranks  schedule           v  measured s   predicted s  error   replay between steps s  error   "
          "stage profile s  error    per-rank stretch s  error   with ping-pong s  error   profile alone s  error   "
          "together s  error  drift  tries")
    for row, tries in rows:
        m = row.measured
        print(f"{row.ranks:>5}  {row.family:<17} {row.v:>2} {m:>10.3f} {row.predicted:>13.3f} {_err(row.predicted, m):>6} "
              f"{row.paired:>24.3f} {_err(row.paired, m):>6} {row.profiled:>17.3f} {_err(row.profiled, m):>6} "
              f"{row.stretched:>21.3f} {_err(row.stretched, m):>6} {row.former:>18.3f} {_err(row.former, m):>6} "
              f"{row.alone:>17.3f} {_err(row.alone, m):>6} {row.together:>12.3f} {_err(row.together, m):>6} "
              f"{row.drift:>6.2f} {tries:>6}")
    errors = [abs(row.predicted - row.measured) / row.measured for row, _ in rows]
    steady = [e for e, (row, _) in zip(errors, rows) if abs(row.drift - 1) <= args.steady]
    print(f"largest error of the prediction: {max(errors):.1%} (target: within 10% on every row); "
          f"within 10%: {sum(e <= 0.1 for e in errors)} of {len(errors)} rows; rows whose drift stayed within "
          f"{args.steady:.0%}: {len(steady)}" + (f", largest error among them {max(steady):.1%}" if steady else ""))
    paired = [abs(row.paired - row.measured) / row.measured for row, _ in rows]
    print(f"with the replay taken between the measured steps: largest error {max(paired):.1%}; "
          f"within 10%: {sum(e <= 0.1 for e in paired)} of {len(paired)} rows")

if __name__ == "__main__":
    main()
