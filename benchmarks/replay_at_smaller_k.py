"""A plan the offload pass made for slower copies, simulated with faster ones: can its peak rise?

The pass at k keeps the plans of the next ladder point above k only where their simulation at k
says so (docs/offload.md, steps 11-12), because a replay is not safe by construction: with faster
copies a copy queued behind another starts earlier, so an allocation can move before a free it
used to follow. This prints, for one shared-link case, the pass's own plan at each k and the plan
made at ``--at`` simulated at that k (peak in activation units, makespan, stall).

With ``--own-links`` it sweeps own host links instead (one copy engine per rank, the default),
where a replay is safe by construction (docs/offload.md, "A faster link than planned"): every
family at d in ``--ranks``, m = 4d, offload all and auto, a plan made at each k' of ``MADE``
simulated at k' x each of ``FACTORS``. It counts the replays that peak higher than the plan at k'
on any rank, stall, or lengthen the step, and the plans whose peak does not rise (or stay) at
every step as the replay's k grows back to k'.

With ``--grid`` it measures the exact construction of docs/offload.md (own links): plans made at
the points of a fixed grid of k (25 % steps from 0.1, up to the first point whose plan offloads
nothing, K*), and at each k of a 0.05 grid the lowest replay among the grid plans at or above k,
beside the pass's own plan at k. That construction is monotone in k by the replay guarantee; the
table shows what it costs (grid points per lowering) and where it is worse than the pass's own plan.

    .venv/bin/python benchmarks/replay_at_smaller_k.py [--at 0.5] [--ks 0.42 0.45 0.47 0.49]
    .venv/bin/python benchmarks/replay_at_smaller_k.py --own-links [--ranks 8 16]
    .venv/bin/python benchmarks/replay_at_smaller_k.py --grid
    .venv/bin/python benchmarks/replay_at_smaller_k.py --figure docs/gallery/faster_link.png

``--figure`` draws the guarantee and its limit: on own links (ZB-V, d = 8, m = 32, offload all) the
peak of the plans made for k' = 0.5 and 1 at every k they are run at, beside the pass's own plan at
each k (stalls marked); on a shared host link (the case above) the plan made for 0.5 run at smaller k.
"""
from __future__ import annotations

import argparse

from pipeoffload.costs import CostModel
from pipeoffload.ir import Schedule
from pipeoffload.passes.lower import lower, lower_with_report
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate

FAMILIES = [("1f1b", 1, {}), ("interleaved-1f1b", 2, {}), ("group-interleaved", 2, {"group_size": 4}),
            ("zb-h1", 1, {}), ("zb-v", 2, {})]
MADE = (0.2, 0.3, 0.5, 0.8, 1.0, 1.3, 1.7, 2.0)
FACTORS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97)


def _shared_link_case() -> tuple[Schedule, CostModel]:
    """The shared-link counterexample: group-interleaved d = 8, g = 8, m = 32 and its unit costs."""
    return (generate("group-interleaved", 8, 32, 2, group_size=8),
            CostModel.uniform(1.0, 1.0, 1.0, shared_host_link=True))


def own_links(ranks: list[int]) -> None:
    """Own host links: count the replays with faster copies that are worse than the plan."""
    print(f"own host links, one copy engine per rank; plans made at k' in {MADE}, replayed at k' x {FACTORS}")
    print("family              d    m  policy  plans  replays  higher peak  stall  longer step  peak not monotone")
    total = worse = 0
    for d in ranks:
        for name, v, options in FAMILIES:
            schedule = generate(name, d, 4 * d, v, **options)
            for policy in ("all", "auto"):
                counts = [0, 0, 0, 0, 0, 0]  # plans, replays, higher peak, stall, longer step, not monotone
                for k in MADE:
                    planned = CostModel().with_offload_ratio(k)
                    made = lower(schedule, planned, offload=policy)
                    at_k = simulate(made, planned)
                    counts[0] += 1
                    peaks = []
                    for factor in FACTORS:
                        replay = simulate(made, CostModel().with_offload_ratio(k * factor))
                        counts[1] += 1
                        counts[2] += any(now.peak_activation_units > then.peak_activation_units + 1e-9
                                         for now, then in zip(replay.per_rank, at_k.per_rank))
                        counts[3] += replay.stall > at_k.stall + 1e-9
                        counts[4] += replay.makespan > at_k.makespan + 1e-9
                        peaks.append(replay.peak_activation_units)
                    peaks.append(at_k.peak_activation_units)
                    counts[5] += any(a > b + 1e-9 for a, b in zip(peaks, peaks[1:]))
                total += counts[1]
                worse += counts[2] + counts[3] + counts[4]
                print(f"{name:18s} {d:3d} {4 * d:4d}  {policy:6s} {counts[0]:6d} {counts[1]:8d} {counts[2]:12d} "
                      f"{counts[3]:6d} {counts[4]:12d} {counts[5]:18d}", flush=True)
    print(f"{worse} of {total} replays worse than their plan")


def grid_construction() -> None:
    """Interleaved 1F1B, d = 8, m = 32, offload all, own links: the fixed-grid construction against
    the pass's own plans."""
    schedule = generate("interleaved-1f1b", 8, 32, 2)
    grid, g = [], 0.1
    while True:
        costs = CostModel().with_offload_ratio(g)
        made, report = lower_with_report(schedule, costs, offload="all")
        grid.append((g, made, simulate(made, costs).peak_activation_units))
        if report.offloaded + report.offloaded_after_i == 0:
            break
        g = round(g * 1.25, 6)
    print(f"interleaved-1f1b d=8 m=32 v=2, offload all, own host links; grid of 25 % steps from 0.1: "
          f"{len(grid)} points up to K* = {grid[-1][0]:g} (its plan offloads nothing)")
    print("grid point: peak " + ", ".join(f"{g:g}: {p:g}" for g, _, p in grid))
    print("    k  own plan: peak  |  lowest replay of the grid plans at or above k: peak")
    worse = better = 0
    ks = [round(0.1 + 0.05 * i, 2) for i in range(39)]
    for k in ks:
        costs = CostModel().with_offload_ratio(k)
        own = simulate(lower(schedule, costs, offload="all"), costs).peak_activation_units
        exact = min(simulate(made, costs).peak_activation_units for g, made, _ in grid if g >= k - 1e-12)
        worse, better = worse + (exact > own), better + (exact < own)
        print(f"{k:5.2f}  {own:14g}  |  {exact:10g}")
    print(f"the construction is worse than the pass's own plan at {worse} of {len(ks)} k, better at {better}")


def figure(path: str) -> None:
    """The picture of docs/offload.md, "A faster link than planned"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from pipeoffload.fileio import write_atomic
    from pipeoffload.viz.plot import figure_bytes

    fig, (own_ax, shared_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    schedule = generate("zb-v", 8, 32, 2)
    ks = [round(0.05 * i, 2) for i in range(25)]
    own = [simulate(lower(schedule, c, offload="all"), c).peak_activation_units
           for c in (CostModel().with_offload_ratio(k) for k in ks)]
    own_ax.plot(ks, own, color="0.55", lw=1.5, label="the pass's own plan at each k")
    for made_for, colour in ((0.5, "tab:blue"), (1.0, "tab:red")):
        made = lower(schedule, CostModel().with_offload_ratio(made_for), offload="all")
        runs = [simulate(made, CostModel().with_offload_ratio(k)) for k in ks]
        own_ax.plot(ks, [t.peak_activation_units for t in runs], color=colour, lw=2, ls="--",
                    label=f"the plan made for k = {made_for:g}")
        stalled = [(k, t.peak_activation_units) for k, t in zip(ks, runs) if t.stall > 0]
        if stalled:
            own_ax.scatter(*zip(*stalled), color=colour, marker="x", zorder=3,
                           label=f"... stalls (link slower than k = {made_for:g})")
        own_ax.axvline(made_for, color=colour, lw=0.8, alpha=0.5)
    own_ax.set(title="own host links: ZB-V d=8 m=32, offload all", xlabel="k the copies take (smaller: faster link)",
               ylabel="device peak (activation units)")
    own_ax.legend(fontsize=8, loc="upper left")
    gi, base = _shared_link_case()
    made = lower(gi, base.with_offload_ratio(0.5), offload="all")
    shared_ks = [0.42, 0.45, 0.47, 0.49, 0.5]
    shared_ax.plot(shared_ks, [simulate(made, base.with_offload_ratio(k)).peak_activation_units for k in shared_ks],
                   color="tab:purple", lw=2, ls="--", marker="o", label="the plan made for k = 0.5")
    shared_ax.set(title="a shared host link: group-interleaved d=8 g=8 m=32", xlabel="k the copies take",
                  ylabel="device peak (activation units)")
    shared_ax.legend(fontsize=8)
    for ax in (own_ax, shared_ax):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    write_atomic(path, figure_bytes(fig, "png", dpi=110))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, default=0.5, help="the k the replayed plan is made for")
    parser.add_argument("--ks", type=float, nargs="+", default=[0.42, 0.45, 0.47, 0.49], help="the k it is replayed at")
    parser.add_argument("--own-links", action="store_true", help="sweep own host links instead (see above)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16], help="pipeline sizes d of --own-links")
    parser.add_argument("--grid", action="store_true", help="measure the fixed-grid construction (see above)")
    parser.add_argument("--figure", metavar="PNG", help="draw the picture of docs/offload.md (see above)")
    args = parser.parse_args()
    if args.figure:
        figure(args.figure)
        return
    if args.grid:
        grid_construction()
        return
    if args.own_links:
        own_links(args.ranks)
        return
    schedule, base = _shared_link_case()
    made = lower(schedule, base.with_offload_ratio(args.at), offload="all")
    own = simulate(made, base.with_offload_ratio(args.at))
    print(f"group-interleaved d=8 v=2 g=8 m=32, offload all, shared host link; the plan made at k={args.at}: "
          f"peak {own.peak_activation_units:g}, makespan {own.makespan:g} t")
    print(f"    k  own plan: peak  makespan  |  plan of k={args.at:g}: peak  makespan  stall")
    for k in args.ks:
        costs = base.with_offload_ratio(k)
        mine = simulate(lower(schedule, costs, offload="all"), costs)
        replay = simulate(made, costs)
        print(f"{k:5.2f}  {mine.peak_activation_units:14g}  {mine.makespan:8g}  |  {replay.peak_activation_units:16g}  "
              f"{replay.makespan:8g}  {replay.stall:5g}")


if __name__ == "__main__":
    main()
