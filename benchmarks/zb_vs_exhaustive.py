"""How far the ``zb`` generator's shortlist is from an exhaustive search of its own candidate space.
docs/schedules-zero-bubble.md, "How W passes are placed".

    PYTHONPATH=. .venv/bin/python benchmarks/zb_vs_exhaustive.py [--quick]

``zb`` (pipeoffload/schedules/zero_bubble.py) ranks the warm-up depths of ``_warmup_grid`` on a
pipeline shortened to min(m, 3d) microbatches, replays the best two in full with two gap rules
(``overfill`` 1.0: a W goes in a gap only when all of it fits; 0.0: any gap), adds ZB-H2's skeleton
and the closed-form ZB-H1, and keeps the shortest makespan that fits the memory limit. The
exhaustive search here replays, in full, every warm-up depth vector ``skeleton`` accepts (non-increasing
along the pipeline, 1 <= depth <= min(m, what the limit holds on that rank)) with each gap rule, plus
ZB-H1, and keeps the shortest makespan that fits. It is run twice over: with zb's two gap rules
(1.0, 0.0), and with a third, 0.5 (a W goes in a gap that holds half of it; ``fill_weight_passes``
accepts any value, zb does not try it). The exhaustive set holds all of zb's candidates, so zb is never
faster (checked).

The grid (the exhaustive space grows as C(L + d - 1, d) vectors for a limit of L units, so d stops at 6,
with d = 8 at limits up to d only):

- d in 2..6, m in {d, 2d, 4d} (4d: longer than the 3d pipeline zb ranks on), memory limit
  L in {ceil(d/2), d, 3d/2 rounded down, 2d} activation units per rank (d: zb's default and
  1F1B's peak; 2d: ZB-H2's; below d, where ZB-H1 does not fit);
- d = 8, m in {8, 16, 32}, L in {4, 8};
- four cost sets per configuration (per stage, one stage per rank): uniform F = I = W = 1; F = 1,
  I = 1.5, W = 0.5 (the unbalanced profile of the other schedule figures); uniform with a P2P time of
  0.25 (transfers open gaps); uniform with the last stage twice as slow (a language model's head and
  loss on the last rank) and w_fraction 0.5 (I frees half the activation, so the limit binds later).

It prints one summary row per d and cost set, every configuration where zb is slower than the
exhaustive best (its makespan, the best's, the loss and the winning depths and rule), the totals for
limits below d and from d up, and the process CPU time. Deterministic but for the time: a full run
takes about 5 minutes of one core (most of it d = 6 at L = 12 and d = 8 at L = 8); ``--quick`` stops
at d = 5 (about 20 s).
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator

from pipeoffload.costs import CostModel
from pipeoffload.placement import Placement
from pipeoffload.schedules import zero_bubble as zbm
from pipeoffload.simulator import simulate

RULES_ZB = (1.0, 0.0)
RULES_ALL = (1.0, 0.5, 0.0)
EPS = 1e-9


def cost_sets(d: int) -> dict[str, CostModel]:
    head = (1.0,) * (d - 1) + (2.0,)
    return {
        "F=I=W=1": CostModel.uniform(1.0, 1.0, 1.0),
        "F=1 I=1.5 W=0.5": CostModel.uniform(1.0, 1.5, 0.5),
        "F=I=W=1 p2p=0.25": CostModel.uniform(1.0, 1.0, 1.0, p2p=0.25),
        "last stage x2, w_fraction=0.5": CostModel.per_stage(head, head, head, w_fraction=0.5),
    }


def grid(quick: bool) -> Iterator[tuple[int, int, int]]:
    """(d, m, limit) of every configuration, per cost set."""
    for d in range(2, 6 if quick else 7):
        for m in (d, 2 * d, 4 * d):
            for limit in sorted({math.ceil(d / 2), d, 3 * d // 2, 2 * d}):
                yield d, m, limit
    if not quick:
        for m in (8, 16, 32):
            for limit in (4, 8):
                yield 8, m, limit


def depth_vectors(caps: list[int]) -> Iterator[tuple[int, ...]]:
    """Every non-increasing vector with 1 <= v[r] <= caps[r]."""
    def extend(prefix: tuple[int, ...], top: int) -> Iterator[tuple[int, ...]]:
        r = len(prefix)
        if r == len(caps):
            yield prefix
            return
        for depth in range(min(top, caps[r]), 0, -1):
            yield from extend(prefix + (depth,), depth)
    return extend((), max(caps))


def exhaustive(d: int, m: int, limit: float, costs: CostModel) -> dict[tuple[float, ...], tuple[float, object]]:
    """Best fitting makespan (and what gave it) per set of gap rules: RULES_ZB and RULES_ALL."""
    placement, pool, limits = Placement.loop(d, 1), zbm.ActionPool(d, m), [limit] * d
    h1 = zbm.fill_weight_passes(placement, zbm.zb_h1_rows(d, m), costs)
    best: dict[tuple[float, ...], tuple[float, object]] = {
        rules: (h1.makespan if h1.fits(limits) else math.inf, "zb-h1") for rules in (RULES_ZB, RULES_ALL)}
    caps = [min(m, max(1, int(limit / max(costs.act(r), EPS) + EPS))) for r in range(d)]
    for warmups in depth_vectors(caps):
        rows = zbm.skeleton(d, m, warmups, pool)
        for rule in RULES_ALL:
            filled = zbm.fill_weight_passes(placement, rows, costs, limits, rule, pool)
            if not filled.fits(limits):
                continue
            for rules in best:
                if rule in rules and filled.makespan < best[rules][0] - EPS:
                    best[rules] = (filled.makespan, (warmups, rule))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="d up to 5 only")
    args = parser.parse_args()
    start = time.process_time()
    # (d, cost set) -> [configurations, slower with zb's rules, largest loss, slower with 3 rules, largest loss]
    rows: dict[tuple[int, str], list[float]] = {}
    # limits below d / from d up -> the same counts over all d and cost sets
    totals = {"L < d": [0, 0, 0.0, 0, 0.0], "L >= d": [0, 0, 0.0, 0, 0.0]}
    losses: list[str] = []
    for d, m, limit in grid(args.quick):
        for name, costs in cost_sets(d).items():
            shipped = simulate(zbm.zb(d, m, memory_limit=limit, costs=costs), costs).makespan
            best = exhaustive(d, m, limit, costs)
            row = rows.setdefault((d, name), [0, 0, 0.0, 0, 0.0])
            total = totals["L < d" if limit < d else "L >= d"]
            cells = []
            for k, rules in enumerate((RULES_ZB, RULES_ALL)):
                makespan, how = best[rules]
                if shipped < makespan - EPS:
                    raise AssertionError(f"d={d} m={m} L={limit} {name}: zb {shipped} beats the exhaustive {makespan}")
                loss = shipped / makespan - 1.0
                cells.append(f"{makespan:7.2f} +{100 * loss:5.2f} % {str(how):20}")
                if loss > EPS:
                    for counts in (row, total):
                        counts[1 + 2 * k] += 1
                        counts[2 + 2 * k] = max(counts[2 + 2 * k], loss)
            row[0] += 1
            total[0] += 1
            if shipped > best[RULES_ALL][0] + EPS:
                losses.append((f"{d:>2} {m:>3} {limit:>3}  {name:30} {shipped:7.2f}  " + "  ".join(cells)).rstrip())
    head = f"{'configs':>7}  {'slower':>6} {'max loss':>8}  {'slower':>6} {'max loss':>8}"
    print("zb as shipped against the exhaustive search; slower / max loss: with zb's two gap rules (1.0, 0.0),")
    print("then with three (1.0, 0.5, 0.0)\n")
    print(f"{'d':>2}  {'cost set':30} {head}")
    for (d, name), (n, s2, l2, s3, l3) in rows.items():
        print(f"{d:>2}  {name:30} {n:>7}  {s2:>6} {100 * l2:>7.2f}%  {s3:>6} {100 * l3:>7.2f}%")
    print("\nconfigurations where zb is slower (L: memory limit, activation units per rank; best: makespan, loss,")
    print("(warm-up depths, gap rule) of the exhaustive best with zb's two rules, then with three):")
    print(f"{'d':>2} {'m':>3} {'L':>3}  {'cost set':30} {'zb':>7}  {'best, 2 rules':35}  best, 3 rules")
    print("\n".join(losses) if losses else "  none")
    print()
    for label, (n, s2, l2, s3, l3) in totals.items():
        print(f"{label:6}: {n} configurations; zb slower in {s2} (by at most {100 * l2:.2f} %) against zb's two gap "
              f"rules, in {s3} (at most {100 * l3:.2f} %) against three")
    print(f"process CPU {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main()
