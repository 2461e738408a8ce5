"""Is the ladder construction for "monotone in k" (issue #17 item 4) exact and cheap enough? (own host links)

The construction: plans made only at the points of one fixed ladder of k, L_j = 2 ** (j / 8), up to K*,
the point above which no copy fits in any activation's window; at k, each rank takes the lowest
replay at k among the plans of the points L_j >= k. A plan replayed with faster copies than it was
made for never peaks higher (docs/offload.md, "A faster link than planned"), so the candidates of a
smaller k include those of a larger k, each no higher: monotone by construction, but a k off the
ladder loses the plan made at k itself. This measures, on a fine grid of k:

- ``main``: the pass as it is (``lower`` at k);
- ``ladder``: the construction above, each ladder point's plan being the pass's own (``lower`` at L_j);
- ``ladder+own``: per rank the lower of ``main`` and ``ladder`` (never above main; monotone only where
  main's own plan at k is not the only one below the ladder);

with the inversion pairs of each and the CPU the ladder costs (process CPU of ``lower`` at each ladder
point from the lowest k of the grid up to K*, and how many of those plans place no copy).

    python benchmarks/offload_monotone_ladder.py --schedule interleaved-1f1b --ranks 8 --microbatches 32 \
        --stages-per-rank 2 --start 1.2 --stop 2.0 --step 0.02 [--pure]

``--pure`` makes each ladder point's plan without the plans for faster copies and step 13 (the plan at
L and those for slower copies only): plans whose copies start as planned or earlier at L, which the
replay argument covers; without it each point's plan is the whole pass's.

``--headline`` measures the cost where it matters: it runs issue #19's speed target (``plan --model
llama3-70b --gpu h100 --gpus 64 --global-batch 512 --memory 80``) in this process, records every call
of the offload pass (a wrapper around ``passes.lower.plan_offload`` that calls it and notes its
arguments), and for each own-link offload call whose plan is above the floor (the only ones the
construction could change) times the pure plans at every ladder point from k up to K* and one
simulation of each (what a replay at k costs, at most), in process CPU, against the headline's.

``--premise`` checks the premise of the replay argument on the pass's own plans (six families, d = 4
and 8, m = 4d, k = 0.6 to 2.0, offload all and auto): the argument needs every RELOAD to start, at the
k it is simulated at, before the end of any compute action of its rank that frees memory after its
issue point. Plans the pass made for faster copies (step 7) run with slower copies than planned, where
a reload can queue behind a longer copy past such an end; a replay at a smaller k could then allocate
it before a free it followed. It counts those reloads and the plans step 7 won, and replays every plan
at 0.95 down to 0.30 of its k, counting any rank whose peak rises as k falls.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import subprocess
import time
from typing import Any

from pipeoffload import CostModel, generate, lower, simulate
from pipeoffload.ir import ActionKind, Schedule
from pipeoffload.passes import lower as lower_module
from pipeoffload.passes.copy_plan import rank_timelines
from pipeoffload.passes.offload import _emit, _groups, _Planning, plan_offload
from pipeoffload.policies import OffloadPolicy
from pipeoffload.simulator import simulate_figures

HEADLINE = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "512", "--memory", "80"]

LADDER_STEPS = 8


def k_star(schedule: Schedule, costs: CostModel) -> float:
    """The k above which no window can hold its copies (copies at ``costs``' k scaled linearly): the
    largest lifespan / (D2H + H2D) over every candidate window, times k."""
    bare = schedule.compute_only()
    return _k_star(rank_timelines(bare, simulate(bare, costs), costs), costs)


def _k_star(timelines: list, costs: CostModel) -> float:  # type: ignore[type-arg]
    k = costs.offload_ratio(0)
    ratio = 0.0
    for tl in timelines:
        for x in list(tl.activations.values()) + list(tl.w_activations.values()):
            copy = x.d2h + x.h2d
            if copy > 0:
                ratio = max(ratio, (x.deadline - x.f_end) / copy)
    return k * ratio


def ladder(start: float, stop: float) -> list[float]:
    """Ladder points from the highest at or below ``start`` to the first at or above ``stop``."""
    lo = math.floor(LADDER_STEPS * math.log2(start) + 1e-9)
    hi = math.ceil(LADDER_STEPS * math.log2(stop) - 1e-9)
    return [2 ** (j / LADDER_STEPS) for j in range(lo, hi + 1)]


def copies(schedule: Schedule) -> int:
    return sum(1 for row in schedule.actions for a in row if a.kind in (ActionKind.OFFLOAD, ActionKind.OFFLOAD_W))


def inversions(grid: list[float], peaks: list[float]) -> int:
    return sum(1 for i in range(len(grid)) for j in range(i + 1, len(grid)) if peaks[i] > peaks[j] + 1e-9)


def headline() -> None:
    """The ladder's cost on the headline's own-link offload calls (see the module's docstring)."""
    calls: list[tuple[Any, ...]] = []
    real = lower_module.plan_offload

    def recorded(base: Schedule, costs: CostModel, policy: Any, **kw: Any) -> Any:
        out = real(base, costs, policy, **kw)
        calls.append((base, costs, OffloadPolicy.parse(policy), kw.get("exclude", frozenset()), out[1]))
        return out

    from pipeoffload.cli import main as cli_main
    lower_module.plan_offload = recorded  # type: ignore[assignment]
    logging.disable(logging.WARNING)
    t0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            cli_main(HEADLINE)
    total = time.process_time() - t0
    lower_module.plan_offload = real
    own, floor, points, empty, planned, replayed, empty_cpu = 0, 0, 0, 0, 0.0, 0.0, 0.0
    for base, costs, policy, exclude, report in calls:
        if policy.kind == "none" or costs.shared_host_link or costs.d2h_time + costs.h2d_time <= 0:
            continue
        own += 1
        timelines = rank_timelines(base, simulate(base, costs), costs)
        budget = policy.budget_units(base.stages_per_rank) if policy.kind == "budget" else None
        plan = _Planning(base, timelines, policy, set(exclude), budget, _groups(base.num_ranks, False))
        if plan.at_floor(costs, {r.rank: r.peak_after for r in report.per_rank}):
            floor += 1
            continue
        k = costs.offload_ratio(0)
        ladder_points = [p for p in ladder(k, _k_star(timelines, costs)) if p >= k - 1e-12]
        points += len(ladder_points)
        states = []
        for p in ladder_points:
            t0 = time.process_time()
            states.append(plan.states(costs, p / k)[0])
            spent = time.process_time() - t0
            planned += spent
            if not any(x.placed for x in states[-1].values()):
                empty, empty_cpu = empty + 1, empty_cpu + spent
        t0 = time.process_time()
        for s in states:
            simulate_figures(base.with_actions([_emit(s[r]) for r in range(base.num_ranks)]), costs)
        replayed += time.process_time() - t0
    print(f"# headline ({' '.join(HEADLINE)}): {total:.2f} s process CPU; {len(calls)} offload-pass calls, "
          f"{own} with copies on own links, {floor} of them at the floor")
    print(f"# the other {own - floor}: {points} ladder points up to K* ({points / max(own - floor, 1):.1f} a call, "
          f"{empty} plans place no copy, {empty_cpu:.2f} s of theirs); their plans {planned:.2f} s, one simulation each "
          f"{replayed:.2f} s: "
          f"+{100 * (planned + replayed) / total:.0f} % of the headline (+{100 * planned / total:.0f} % for the plans alone)")


PREMISE_FAMILIES = [("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 2}),
                    ("zb-h1", 1, {}), ("zb-v", 2, {}), ("v-min", 2, {})]
_COPIES = (ActionKind.OFFLOAD, ActionKind.RELOAD, ActionKind.OFFLOAD_W, ActionKind.RELOAD_W)
_FREES = (ActionKind.B, ActionKind.I, ActionKind.W)  # compute actions that free memory at their end


def queued_reloads(schedule: Schedule, timeline: Any) -> int:
    """Reloads that start at or after the end of a compute action of their rank that frees memory and
    ends after their issue point (at equal times the simulator applies the free first)."""
    count = 0
    for rank, row in enumerate(schedule.actions):
        frees = [timeline.end[rank][j] for j, action in enumerate(row) if action.kind in _FREES]
        issue = 0.0  # the lane reaches a copy when the action before it ends
        for j, action in enumerate(row):
            if action.kind in (ActionKind.RELOAD, ActionKind.RELOAD_W):
                start = timeline.start[rank][j]
                count += any(issue + 1e-9 < end <= start + 1e-9 for end in frees)
            elif action.kind not in _COPIES:
                issue = timeline.end[rank][j]
    return count


def premise() -> None:
    """The replay argument's premise and replays of the pass's own plans (see the module's docstring)."""
    plans = won = queued = rises = 0
    for name, v, options in PREMISE_FAMILIES:
        for d in (4, 8):
            schedule = generate(name, d, 4 * d, v, **options)
            for k in (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0):
                costs = CostModel().with_offload_ratio(k)
                for policy in ("all", "auto"):
                    made = lower(schedule, costs, offload=policy)
                    own = simulate(made, costs)
                    pure = simulate(plan_offload(schedule.compute_only(), costs, policy, faster_copies=False)[0], costs)
                    plans += 1
                    won += own.peak_activation_units < pure.peak_activation_units - 1e-9
                    queued += queued_reloads(made, own)
                    before = [r.peak_activation_units for r in own.per_rank]
                    for i in range(1, 15):
                        replay = simulate(made, CostModel().with_offload_ratio(k * (1 - 0.05 * i)))
                        now = [r.peak_activation_units for r in replay.per_rank]
                        rises += replay.stall > 0 or any(a > b + 1e-9 for a, b in zip(now, before))
                        before = now
    print(f"# {plans} plans of the pass ({won} won by step 7's plans for faster copies): {queued} reloads start after "
          f"a free past their issue point; {rises} of {14 * plans} replays (0.95 to 0.30 x k, each against "
          f"the one before) with a rank peaking higher or a stall")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="interleaved-1f1b")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--stages-per-rank", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--offload", default="all")
    parser.add_argument("--start", type=float, default=1.2)
    parser.add_argument("--stop", type=float, default=2.0)
    parser.add_argument("--step", type=float, default=0.02)
    parser.add_argument("--pure", action="store_true",
                        help="ladder plans without the plans for faster copies and step 13 (each a plan made "
                             "for copies at least as slow as the point's, so a replay at k <= L is safe)")
    parser.add_argument("--headline", action="store_true", help="the ladder's cost in the headline plan instead")
    parser.add_argument("--premise", action="store_true", help="the replay argument's premise on the pass's plans")
    args = parser.parse_args()
    if args.headline:
        headline()
        return
    if args.premise:
        premise()
        return
    options = {"group_size": args.group_size} if args.group_size else {}
    schedule = generate(args.schedule, args.ranks, args.microbatches, args.stages_per_rank, **options)
    count = int(round((args.stop - args.start) / args.step)) + 1
    grid = [round(args.start + i * args.step, 6) for i in range(count)]
    base = CostModel()
    cap = k_star(schedule, base.with_offload_ratio(args.start))
    points = ladder(args.start, max(cap, args.stop))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {args.schedule} d={args.ranks} m={args.microbatches} v={args.stages_per_rank} {options or ''}"
          f" offload {args.offload}, own host links; commit {commit}; K* = {cap:.4g}, "
          f"{'pure plans (no faster copies, no step 13)' if args.pure else 'the pass at each point'}, "
          f"{len(points)} ladder points from {points[0]:.4g} to {points[-1]:.4g}")
    plans, cpu, empty = [], [], 0
    for point in points:
        t0 = time.process_time()
        made = (plan_offload(schedule.compute_only(), base.with_offload_ratio(point), args.offload,
                             faster_copies=False)[0] if args.pure
                else lower(schedule, base.with_offload_ratio(point), offload=args.offload))
        cpu.append(time.process_time() - t0)
        empty += copies(made) == 0
        plans.append((point, made))
    top = max(i for i, (p, _) in enumerate(plans) if p <= cap + 1e-9) if any(p <= cap for p, _ in plans) else 0
    print(f"# ladder plans: {sum(cpu):.2f} s CPU in all ({len(points)} points, {empty} place no copy; "
          f"the first above K*: {copies(plans[-1][1])} copies); per point: "
          + " ".join(f"{p:.3g}:{c:.2f}" for (p, _), c in zip(plans, cpu)))
    print(f"# the ladder from a k to K* has {top + 1} points at k = {points[0]:.3g}")
    print("k       main  ladder  ladder+own  main cpu s")
    rows = {"main": [], "ladder": [], "ladder+own": []}
    for k in grid:
        costs = base.with_offload_ratio(k)
        t0 = time.process_time()
        own = simulate(lower(schedule, costs, offload=args.offload), costs)
        spent = time.process_time() - t0
        best = [math.inf] * args.ranks
        for point, made in plans:
            if point < k - 1e-12:
                continue
            replay = simulate(made, costs)
            assert replay.stall == 0, (k, point)
            best = [min(b, r.peak_activation_units) for b, r in zip(best, replay.per_rank)]
        mixed = [min(b, r.peak_activation_units) for b, r in zip(best, own.per_rank)]
        rows["main"].append(own.peak_activation_units)
        rows["ladder"].append(max(best))
        rows["ladder+own"].append(max(mixed))
        print(f"{k:<7g} {own.peak_activation_units:4g} {max(best):7g} {max(mixed):11g} {spent:11.2f}", flush=True)
    for name, peaks in rows.items():
        worse = sum(1 for a, b in zip(peaks, rows["main"]) if a > b + 1e-9)
        better = sum(1 for a, b in zip(peaks, rows["main"]) if a < b - 1e-9)
        print(f"{name:<11} inversion pairs {inversions(grid, peaks):4d}   above main at {worse} k, below at {better}")


if __name__ == "__main__":
    main()
