"""Shared host link, full offload on group-interleaved: our pair plan beside the reference's planner.

The reference is the offload planner of the sail-sg zero-bubble Megatron fork
(``megatron/core/pipeline_parallel/zerobubble/scheduler/offloading.py``, ``add_offload``): GPUs 2p
and 2p+1 share one host link and get fixed alternating D2H/H2D slots of T = k/2 x (F + B + W) each,
phase-shifted by T, after the warm-up forwards were postponed; warm-up D2H slots last 0.7 T.
It is run as it is: its pure-Python scheduler modules are imported from a checkout (nothing of it
is copied here); only ``megatron.training.get_args``, which the planner reads for one flag
(``offload_overlap_sr``, False), is stubbed, and Megatron's package ``__init__`` files (which import
torch and CUDA code) are skipped. Put the checkout anywhere and pass it:

    git clone https://github.com/sail-sg/zero-bubble-pipeline-parallelism /path/to/zb   # tested at 39f2c186
    python benchmarks/offload_vs_reference.py --reference /path/to/zb > benchmarks/results/offload_vs_reference.txt

(or set ``PIPEOFFLOAD_REFERENCE``). Without a checkout the script says so and exits 0.
``--bound`` prints instead a lower bound on the worst rank's peak that any plan has on this
project's simulator (the pair's warm-up forwards against one D2H link at full speed; no reference
needed):

    python benchmarks/offload_vs_reference.py --bound >> benchmarks/results/offload_vs_reference.txt

Setting: group-interleaved, v = 2, m = 4d, F = B(I) = W = 1 t per stage (the reference's 1000 "ms"
units scaled to 1), no P2P time, every activation offloaded (the reference's ``offload_chunk_num``
= v; ours ``--offload all``), k = (D2H + H2D) / (F + I + W) of one activation, two ranks per link.
Columns per (d, g, k), peaks in activation units on the worst rank (no offload: g(v-1) + d):

- ``ref planned``: the reference's own numbers (its ``get_peak_memory`` over its lists; its planned
  makespan with the postponed warm-up); ``fails`` where it raises (its windows run out);
- ``ref in our simulator``: the reference's plan replayed in this project's simulator (its lists
  as ours: F, B -> I, W, OFFLOAD_SEND_START -> OFFLOAD, OFFLOAD_RECV_START -> RELOAD; compute runs
  as soon as it can, copies take k/2 x 3 t whether or not the other direction is busy): peak,
  makespan and total stall (a reload that came late);
- ``ours``: this project's pair plan (``CostModel(shared_host_link=True)``), simulated: peak,
  makespan, stall (always 0); the plan's CPU time.

The two models differ in what the reference assumes and the simulator does not: a warm-up copy 30 %
faster when it has the link to itself, and forwards that start later than they could. The
simulator's lower bound for the pair's warm-up (what the link can drain at full speed) is why no
plan here reaches the reference's planned peak at larger d: see docs/offload.md.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import importlib
import io
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

from pipeoffload import generate, simulate
from pipeoffload.costs import CostModel
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Action, ActionKind
from pipeoffload.passes.lower import lower

_PACKAGE = "megatron.core.pipeline_parallel.zerobubble"
_UNIT = 1000.0  # the reference's time unit for F, B and W


def load_reference(root: Path) -> dict[str, Any] | None:
    """The reference's scheduler modules from a checkout at ``root``, or None if it is not there."""
    scheduler = root / "megatron/core/pipeline_parallel/zerobubble/scheduler"
    if not (scheduler / "offloading.py").is_file():
        return None
    parts = _PACKAGE.split(".")
    for i in range(1, len(parts) + 1):  # package stubs: the real __init__ files import torch/CUDA
        name = ".".join(parts[:i])
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*parts[:i]))]
        sys.modules[name] = module
    training = types.ModuleType("megatron.training")
    training.get_args = lambda: types.SimpleNamespace(offload_overlap_sr=False)  # type: ignore[attr-defined]
    sys.modules["megatron.training"] = training
    return {name: importlib.import_module(f"{_PACKAGE}.scheduler.{name}")
            for name in ("graph", "group_interleaved_1f1b", "passes", "offloading")}


def reference_schedule(ref: dict[str, Any], d: int, v: int, g: int, m: int):  # type: ignore[no-untyped-def]
    """The reference's group-interleaved lists with times, before offload (its config and lists)."""
    graph, gis, passes = (ref[n] for n in ("graph", "group_interleaved_1f1b", "passes"))
    config = graph.GraphConfig.basic_config(_UNIT, _UNIT, _UNIT, d, m, v)
    with contextlib.redirect_stdout(io.StringIO()):  # the reference prints its schedules
        order = gis.create_schedule(config, True, None, None, None, g, v)
        return config, passes.add_time(config, passes.add_send_recv_peer_stage(config, order))


def reference_plan(ref: dict[str, Any], config, order, k: float):  # type: ignore[no-untyped-def]
    """(lists with offload nodes or None, planned peak, planned makespan in t, error text)."""
    offloading = ref["offloading"]
    with contextlib.redirect_stdout(io.StringIO()):
        try:  # add_offload replaces list items (never the nodes): a copy of the lists per run
            planned = offloading.add_offload(config, [list(r) for r in order], k / 2)
        except AssertionError as e:
            return None, None, None, str(e).split(".")[0] or "assertion"
    compute = [n for row in planned for n in row if n.type.is_computation()]
    return planned, max(offloading.get_peak_memory(planned)), max(n.completion_time for n in compute) / _UNIT, ""


def replay(planned, schedule, costs: CostModel):  # type: ignore[no-untyped-def]
    """The reference's lists as this project's actions, simulated."""
    kinds = {"F": ActionKind.F, "B": ActionKind.I, "W": ActionKind.W,
             "OFFLOAD_SEND_START": ActionKind.OFFLOAD, "OFFLOAD_RECV_START": ActionKind.RELOAD}
    rows = [[Action(kinds[n.type.value], n.layer_group_idx, n.microbatch) for n in row if n.type.value in kinds]
            for row in planned]
    return simulate(schedule.with_actions(rows), costs)


def ours(schedule, costs: CostModel):  # type: ignore[no-untyped-def]
    start = time.process_time()
    lowered = lower(schedule, costs, offload="all")
    seconds = time.process_time() - start
    return simulate(lowered, costs), seconds


def warmup_bound(schedule, k: float) -> int:  # type: ignore[no-untyped-def]
    """A lower bound on the worst rank's peak for any plan of ``schedule`` on its own compute timing
    with two ranks per host link: each pair's D2H link drains at most one activation per copy time
    (k/2 x 3 t), taken at full speed from the first forward's end in forward-end order; until the
    pair's first backward, what it has started and not yet drained at a forward's start is resident
    on one of its two ranks."""
    timeline = simulate(schedule, CostModel())
    copy = 1.5 * k
    worst = 0
    for pair in range(0, schedule.num_ranks - 1, 2):
        starts, ends, first_backward = [], [], float("inf")
        for rank in (pair, pair + 1):
            for i, a in enumerate(schedule.actions[rank]):
                if a.kind is ActionKind.F:
                    starts.append(timeline.start[rank][i])
                    ends.append(timeline.end[rank][i])
                elif a.kind in (ActionKind.B, ActionKind.I):
                    first_backward = min(first_backward, timeline.start[rank][i])
        starts.sort()
        drained, free = [], 0.0
        for end in sorted(ends):
            free = max(free, end) + copy
            drained.append(free)
        # until the pair's first backward nothing frees an activation but its offload completing
        resident = max(bisect.bisect_right(starts, t) - bisect.bisect_right(drained, t) for t in starts
                       if t < first_backward)
        worst = max(worst, -(-resident // 2))
    return worst


def bound_table(ds: list[int], ks: list[float]) -> None:
    print("lower bound on the worst rank's peak, any plan, this compute timing, two ranks per host link")
    print(f"{'d':>3} {'g':>3} | " + " ".join(f"{k:>4g}" for k in ks))
    for d in ds:
        for g in sorted({d // 2, d}):
            schedule = generate("group-interleaved", d, 4 * d, 2, group_size=g)
            print(f"{d:>3} {g:>3} | " + " ".join(f"{warmup_bound(schedule, k):>4}" for k in ks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", type=Path, default=Path(os.environ.get("PIPEOFFLOAD_REFERENCE", "reference/zb")),
                        help="checkout of sail-sg/zero-bubble-pipeline-parallelism (default $PIPEOFFLOAD_REFERENCE)")
    parser.add_argument("--d", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--k", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(2, 11)])
    parser.add_argument("--g", type=int, nargs="+", default=None, help="group sizes (default d/2 and d)")
    parser.add_argument("--bound", action="store_true", help="print only the lower bound table (no reference needed)")
    args = parser.parse_args(argv)
    if args.bound:
        bound_table(args.d, args.k)
        return 0
    ref = load_reference(args.reference)
    if ref is None:
        print(f"reference checkout not found at {args.reference}: clone sail-sg/zero-bubble-pipeline-parallelism "
              "there or pass --reference DIR; skipped")
        return 0
    v = 2
    print("group-interleaved v=2 m=4d, offload all, two ranks per host link; peaks in activation units (worst rank)")
    print(f"{'d':>3} {'g':>3} {'k':>4} | {'no offl':>7} | {'ref planned':>17} | {'ref in our simulator':>26} |"
          f" {'ours':>21} {'plan s':>6}")
    print(f"{'':>3} {'':>3} {'':>4} | {'peak':>7} | {'peak':>5} {'makespan':>11} | {'peak':>5} {'makespan':>9}"
          f" {'stall':>10} | {'peak':>5} {'makespan':>9} {'stall':>5} {'':>6}")
    for d in args.d:
        m = 4 * d
        for g in args.g or sorted({d // 2, d}):
            schedule = generate("group-interleaved", d, m, v, group_size=g)
            base = simulate(schedule, CostModel())
            config, order = reference_schedule(ref, d, v, g, m)
            for k in args.k:
                costs = CostModel(shared_host_link=True).with_offload_ratio(k)
                planned, ref_peak, ref_makespan, error = reference_plan(ref, config, order, k)
                if planned is None:
                    ref_cols = f"{'fails':>5} {'':>11} | {'-':>5} {'':>9} {'':>10}"
                else:
                    try:
                        t = replay(planned, schedule, costs)
                        replayed = f"{t.peak_activation_units:>5g} {t.makespan:>9g} {t.stall:>10.2f}"
                    except ScheduleError as e:
                        replayed = f"{'invalid: ' + str(e)[:17]:>26}"
                    ref_cols = f"{ref_peak:>5g} {ref_makespan:>11g} | {replayed}"
                t, seconds = ours(schedule, costs)
                print(f"{d:>3} {g:>3} {k:>4g} | {base.peak_activation_units:>7g} | {ref_cols} | "
                      f"{t.peak_activation_units:>5g} {t.makespan:>9g} {t.stall:>5g} {seconds:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
