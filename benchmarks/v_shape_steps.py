"""What each step of the V-Half / V-Min construction buys: bubble ratio and peak of the building
block as is, the block with its W passes re-placed in time, the squeezed block, and both (squeeze,
then W replay: what ``generate("v-half" | "v-min", ...)`` returns). docs/schedules-zero-bubble.md,
"V-Half and V-Min".

    PYTHONPATH=. .venv/bin/python benchmarks/v_shape_steps.py [--d 4 8 16] [--m 32]

For each d (ranks, V placement: 2 stages per rank) and m (microbatches) it prints, per family and
step, ``bubble ratio / peak rank units`` simulated with unit costs (F = I = W, P2P free; the blocks
assume equal pass times). The steps:

- block as is: the repeated building block with W passes in its free slots (``block_grids``),
  replayed as ordered (``fill_weight_passes`` on the rows, W passes included);
- block + W replay: the block's F/I order with W passes re-placed by the replay, capped at the
  block's own peaks, kept only where faster (``v_shape._best_of``);
- squeezed: the block after ``squeeze`` (warm-up and cool-down passes moved earlier), as is;
- both: the squeezed order through ``_best_of``, the shipped schedule (the script checks it equals
  ``generate``'s).

Deterministic: simulated figures only; a run takes about a second.
"""
from __future__ import annotations

import argparse

from pipeoffload import generate
from pipeoffload.costs import CostModel
from pipeoffload.ir import Action, Schedule
from pipeoffload.placement import Placement
from pipeoffload.schedules import v_shape as vs
from pipeoffload.schedules.zero_bubble import fill_weight_passes
from pipeoffload.simulator import simulate

STEPS = ("block as is", "block + W replay", "squeezed", "both")
FAMILIES = (("v-half", vs.v_half_offsets), ("v-min", vs.v_min_offsets))


def steps(name: str, d: int, m: int) -> list[tuple[float, float]]:
    """(bubble ratio, peak rank units) of each of STEPS for one family."""
    offsets = dict(FAMILIES)[name]
    placement, costs = Placement.v(d, 2), vs._UNIT
    out = []
    for squeezed in (False, True):
        grids = vs.block_grids(d, m, offsets)
        if squeezed:
            grids = vs.squeeze(grids, m, lambda s: 1.0)
        rows: list[list[Action]] = [[g[slot] for slot in sorted(g)] for g in grids]
        for filled in (fill_weight_passes(placement, rows, costs), vs._best_of(placement, rows, costs)):
            t = simulate(Schedule(filled.rows, placement, m, name), CostModel())
            out.append((t.bubble_ratio, t.peak_rank_units))
    shipped = simulate(generate(name, d, m, 2), CostModel())
    if (shipped.bubble_ratio, shipped.peak_rank_units) != out[-1]:
        raise AssertionError(f"{name} d={d} m={m}: 'both' differs from generate's schedule")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, nargs="+", default=[4, 8, 16], help="ranks (default 4 8 16)")
    parser.add_argument("--m", type=int, default=32, help="microbatches (default 32)")
    args = parser.parse_args()
    print(f"m = {args.m}, unit costs; cells: bubble ratio / peak rank units")
    print(f"{'d':>3} {'family':8}" + "".join(f"{s:>20}" for s in STEPS))
    for d in args.d:
        for name, _ in FAMILIES:
            cells = "".join(f"{f'{b:.3f} / {p:g}':>20}" for b, p in steps(name, d, args.m))
            print(f"{d:>3} {name:8}{cells}")


if __name__ == "__main__":
    main()
