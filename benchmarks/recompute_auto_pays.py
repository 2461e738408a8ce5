"""Does `--recompute auto` buy memory where it costs time? A grid of `simulate` runs with and without it.

`recompute auto` recomputes the activations the copy lane could not hide (under `budget:X`, what
stays above X). Those are often not what sets the worst rank's peak (the I -> W parts W still needs,
the last ranks of zero-bubble schedules), so a recomputation can lengthen the step and lower nothing.
Since 2026-12-05 the lowering recomputes only where that lowers the worst rank's simulated peak
(docs/offload.md, the `--recompute` table). Each case runs the service call a user makes
(``simulate(SimulateRequest(...))``, what ``pipeoffload simulate`` runs) with `--recompute none` and
`--recompute auto` (default costs, m = 2d) and counts the cases where `auto` has a longer step and no
lower peak; `--list` prints them.

    .venv/bin/python benchmarks/recompute_auto_pays.py [--list]
"""
from __future__ import annotations

import argparse
import itertools

from pipeoffload.service import SimulateRequest, simulate

FAMILIES = [("1f1b", None, None), ("interleaved-1f1b", 2, None), ("group-interleaved", 2, 4), ("zb-h1", None, None),
            ("zb-h2", None, None), ("zb-v", None, None), ("v-min", None, None), ("v-half", None, None)]
RANKS = (4, 8)
KS = (0.5, 0.8, 1.0, 1.25, 1.6, 2.0)
POLICIES = ("auto", "all")


def figures(family: str, v: int | None, g: int | None, d: int, k: float, offload: str,
            recompute: str) -> tuple[float, float, int]:
    """(worst rank's peak in activation units, step, activations recomputed) of one simulate run."""
    result = simulate(SimulateRequest(family, ranks=d, stages_per_rank=v, group_size=g, offload=offload,
                                      recompute=recompute, offload_ratio=k))
    t = result.timeline
    return t.peak_activation_units, t.makespan, len(result.report.recomputed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every case where auto costs time for nothing")
    args = parser.parse_args()
    cases = wasted = lowered = 0
    for (family, v, g), d, k, offload in itertools.product(FAMILIES, RANKS, KS, POLICIES):
        peak, step, _ = figures(family, v, g, d, k, offload, "none")
        auto_peak, auto_step, recomputed = figures(family, v, g, d, k, offload, "auto")
        cases += 1
        lowered += auto_peak < peak - 1e-9
        if auto_step > step + 1e-9 and auto_peak >= peak - 1e-9:
            wasted += 1
            if args.list:
                print(f"{family} d={d} k={k} offload {offload}: none {peak:g} units {step:g} t; "
                      f"auto {auto_peak:g} units {auto_step:g} t ({recomputed} recomputed)")
    print(f"{cases} cases (families x d in {RANKS} x k in {KS} x offload {'/'.join(POLICIES)}, m = 2d): "
          f"recompute auto lowers the worst peak in {lowered}; lengthens the step without lowering it in {wasted}")


if __name__ == "__main__":
    main()
