"""What a stall budget buys: the device peak and the step of `simulate --max-stall PCT` across k.

Where the copy lane can no longer hide every copy in time, the offload pass (which never lets a copy
make compute wait) leaves activations on the device, and the peak can jump (ZB-V d = 8, m = 32,
offload all: 3 activation units at k = 0.66, 12 at k = 0.68). With a stall budget the pass also tries
the plans it makes for faster copies (0.95 to 0.5 times the copy time), runs each at the real copy
times, and keeps the lowest peak whose step is at most PCT % longer than the step without copies
(docs/offload.md, "A stall budget").

Every figure comes from the service call a user makes (``simulate(SimulateRequest(...))``, what
``pipeoffload simulate`` runs): per family (d = 8, m = 32, offload all, default costs), per k and per
budget, the worst rank's peak in activation units and how much longer the step is than without copies.

    .venv/bin/python benchmarks/stall_budget.py [--ks 0.5 0.6 ...] [--budgets 0 1 2 5 10]
    .venv/bin/python benchmarks/stall_budget.py --figure docs/gallery/stall_budget.png
"""
from __future__ import annotations

import argparse

from pipeoffload.service import SimulateRequest, simulate

CASES = [("zb-v", {}), ("zb-h1", {}), ("interleaved-1f1b", {"stages_per_rank": 2}),
         ("group-interleaved", {"group_size": 4}), ("1f1b", {})]
KS = (0.5, 0.6, 0.66, 0.68, 0.7, 0.8, 1.0, 1.5)
BUDGETS = (0.0, 1.0, 2.0, 5.0, 10.0)


def run(family: str, options: dict, k: float, budget: float) -> tuple[float, float]:
    """(peak in activation units, percent the step is longer than without copies)."""
    request = SimulateRequest(family, ranks=8, microbatches=32, offload="all", offload_ratio=k, max_stall=budget,
                              **options)
    timeline = simulate(request).timeline
    plain = simulate(SimulateRequest(family, ranks=8, microbatches=32, **options)).timeline
    return timeline.peak_activation_units, 100 * (timeline.makespan / plain.makespan - 1)


def table(ks: tuple[float, ...], budgets: tuple[float, ...]) -> None:
    print("d = 8, m = 32, offload all, default costs (w_fraction 1); per budget: peak in activation units "
          "(+ percent the step is longer than without copies, where it is)")
    print(f"{'family':18s} {'k':>5s}  " + "  ".join(f"{f'max-stall {b:g} %':>17s}" for b in budgets))
    for family, options in CASES:
        for k in ks:
            cells = []
            for budget in budgets:
                peak, longer = run(family, options, k, budget)
                cells.append(f"{peak:g}" + (f" (+{longer:.2f} %)" if longer > 0.005 else ""))
            print(f"{family:18s} {k:5g}  " + "  ".join(f"{c:>17s}" for c in cells))


def figure(path: str) -> None:
    """The picture of docs/offload.md, "A stall budget": ZB-V's and ZB-H1's peak against k per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from pipeoffload.fileio import write_atomic
    from pipeoffload.viz.plot import figure_bytes

    ks = [round(0.5 + 0.02 * i, 2) for i in range(26)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, (family, options) in zip(axes, CASES[:2]):
        for budget, colour in ((0.0, "0.45"), (2.0, "tab:blue"), (5.0, "tab:orange"), (10.0, "tab:red")):
            peaks = [run(family, options, k, budget)[0] for k in ks]
            ax.plot(ks, peaks, color=colour, lw=2, drawstyle="steps-mid",
                    label="never stall (default)" if budget == 0 else f"--max-stall {budget:g}")
        ax.set(title=f"{family} d=8 m=32, offload all", xlabel="k (copy time over compute time)",
               ylabel="device peak (activation units)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    write_atomic(path, figure_bytes(fig, "png", dpi=110))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=float, nargs="+", default=list(KS), help="offload ratios k")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS), help="--max-stall values, percent")
    parser.add_argument("--figure", metavar="PNG", help="draw the docs' picture instead of the table")
    args = parser.parse_args()
    if args.figure:
        figure(args.figure)
    else:
        table(tuple(args.ks), tuple(args.budgets))


if __name__ == "__main__":
    main()
