"""Bubble ratio and peak activation memory of every zero-bubble / V-shape family, side by side with
torch.distributed.pipelining's orders of the same algorithms, all measured by our simulator.

    .venv/bin/python benchmarks/schedule_quality.py [--quick]

For d in {4, 8, 16}, m in {2d, 4d, 8d} and two cost profiles (uniform F = I = W = 1; F = 1, I = 1.5,
W = 0.5) per full-depth stage. Families with two stages per rank (V placement, interleaved) hold
half the layers per stage, so they are timed with half those costs per stage. Each cell is
``bubble ratio / peak rank units`` (rank unit = one microbatch's activations for all layers of a
rank; 1F1B peaks at d). Torch's orders are read through their compute-only CSV export.
The last section checks ours against torch where the algorithm matches: no worse on both numbers.
A section with full offload (k = 0.5, both offload windows: F -> I and I -> W, w_fraction = 1) shows
what each of our families keeps on the device once PipeOffload's copies are planned.
Cost-aware generators (zb, zb-v, v-half, v-min) get the profile as their ``costs`` option.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

from pipeoffload import CostModel, Schedule, generate, simulate
from pipeoffload.torch_interop import torch_schedule

PROFILES = {"uniform F=I=W=1": (1.0, 1.0, 1.0), "F=1 I=1.5 W=0.5": (1.0, 1.5, 0.5)}
# name -> (stages per rank, builder(d, m, per-stage costs))
Builder = Callable[[int, int, CostModel], Schedule]
OURS: dict[str, tuple[int, Builder]] = {
    "1f1b": (1, lambda d, m, c: generate("1f1b", d, m)),
    "interleaved-1f1b": (2, lambda d, m, c: generate("interleaved-1f1b", d, m, 2)),
    "zb-h1": (1, lambda d, m, c: generate("zb-h1", d, m)),
    "zb-h1 (v=2)": (2, lambda d, m, c: generate("zb-h1", d, m, 2)),
    "zb-h2": (1, lambda d, m, c: generate("zb-h2", d, m)),
    "zb limit=d": (1, lambda d, m, c: generate("zb", d, m, memory_limit=d, costs=c)),
    "zb limit=2d": (1, lambda d, m, c: generate("zb", d, m, memory_limit=2 * d, costs=c)),
    "1f1b-v": (2, lambda d, m, c: generate("1f1b-v", d, m, 2)),
    "zb-v": (2, lambda d, m, c: generate("zb-v", d, m, 2, costs=c)),
    "v-half": (2, lambda d, m, c: generate("v-half", d, m, 2, costs=c)),
    "v-min": (2, lambda d, m, c: generate("v-min", d, m, 2, costs=c)),
}
TORCH: dict[str, tuple[str, int]] = {
    "torch Interleaved1F1B": ("Interleaved1F1B", 2),
    "torch ZB1P (v=1)": ("InterleavedZeroBubble", 1),
    "torch ZB1P (v=2)": ("InterleavedZeroBubble", 2),
    "torch ZBVZeroBubble": ("ZBVZeroBubble", 2),
    "torch DualPipeV": ("DualPipeV", 2),
}
MATCHES = [("interleaved-1f1b", "torch Interleaved1F1B"), ("zb-h1", "torch ZB1P (v=1)"),
           ("zb-h1 (v=2)", "torch ZB1P (v=2)"), ("zb-v", "torch ZBVZeroBubble")]


def measure(schedule: Schedule, profile: tuple[float, float, float]) -> tuple[float, float]:
    scale = 1.0 / schedule.stages_per_rank
    f, i, w = (x * scale for x in profile)
    timeline = simulate(schedule, CostModel.uniform(f, i, w))
    return timeline.bubble_ratio, timeline.peak_rank_units


def main(quick: bool = False) -> int:
    if "dualpipe-v" in _registered():
        OURS["dualpipe-v"] = (2, lambda d, m, c: generate("dualpipe-v", d, m, 2))
        MATCHES.append(("dualpipe-v", "torch DualPipeV"))
    ranks = (4, 8) if quick else (4, 8, 16)
    results: dict[tuple[str, str, int, int], tuple[float, float]] = {}
    started = time.perf_counter()
    for label, profile in PROFILES.items():
        print(f"\n## {label}   cells: bubble ratio / peak rank units   (1F1B peak = d)")
        for d in ranks:
            sizes = (2 * d, 4 * d, 8 * d)
            print(f"\nd={d:<3} " + "".join(f"{f'm={m}':>16}" for m in sizes))
            for name, (v, build) in list(OURS.items()) + [(n, (v, None)) for n, (_, v) in TORCH.items()]:
                cells = []
                for m in sizes:
                    scale = 1.0 / v
                    costs = CostModel.uniform(*(x * scale for x in profile))
                    schedule = build(d, m, costs) if build else torch_schedule(TORCH[name][0], d, m, v)
                    results[(label, name, d, m)] = measure(schedule, profile)
                    bubble, peak = results[(label, name, d, m)]
                    cells.append(f"{bubble:.4f} / {peak:<5.3g}")
                print(f"{name:<22}" + "".join(f"{c:>16}" for c in cells))
    print("\n## ours vs torch where the algorithm matches (bubble and peak, every profile, d, m)")
    failures = 0
    for ours, theirs in MATCHES:
        keys = [k for k in results if k[1] == ours]
        worse = [k for k in keys if _worse(results[k], results[(k[0], theirs, k[2], k[3])])]
        failures += len(worse)
        print(f"{ours:<18} vs {theirs:<22} no worse in {len(keys) - len(worse)}/{len(keys)}"
              + ("" if not worse else f"   WORSE at {worse}"))
    _with_offload(8, 32)
    _generation_times(16 if not quick else 8)
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 1 if failures else 0


def _with_offload(d: int, m: int, k: float = 0.5) -> None:
    """Each of our families with ``offload all`` at ratio k (uniform profile): bubble and peak rank
    units without and with offload; the copies of both windows are planned by ``lower``."""
    from pipeoffload.passes.lower import lower_with_report

    print(f"\n## offload all, k={k} (both windows), d={d}, m={m}, uniform F=I=W=1, w_fraction=1")
    print(f"{'':<22}{'no offload':>16}{'offload all':>16}{'after I':>9}")
    for name, (v, build) in OURS.items():
        costs = CostModel.uniform(*(x / v for x in PROFILES["uniform F=I=W=1"]))
        schedule = build(d, m, costs)
        plain = simulate(schedule, costs)
        copies = costs.with_offload_ratio(k)
        lowered, report = lower_with_report(schedule, copies, offload="all", log_warnings=False)
        t = simulate(lowered, copies)
        print(f"{name:<22}{f'{plain.bubble_ratio:.4f} / {plain.peak_rank_units:<5.3g}':>16}"
              f"{f'{t.bubble_ratio:.4f} / {t.peak_rank_units:<5.3g}':>16}{report.offloaded_after_i:>9}")


def _generation_times(d: int) -> None:
    """Process CPU time to generate each family at m = 8d, profile F=1 I=1.5 W=0.5 (best of 3)."""
    m = 8 * d
    print(f"\n## generation time, d={d}, m={m} (process CPU seconds, best of 3)")
    for name, (v, build) in OURS.items():
        costs = CostModel.uniform(*(x / v for x in PROFILES["F=1 I=1.5 W=0.5"]))
        best = float("inf")
        for _ in range(3):
            clock = time.process_time()
            build(d, m, costs)
            best = min(best, time.process_time() - clock)
        print(f"{name:<22}{best:8.3f}")


def _worse(ours: tuple[float, float], theirs: tuple[float, float]) -> bool:
    return ours[0] > theirs[0] + 1e-9 or ours[1] > theirs[1] + 1e-9


def _registered() -> list[str]:
    from pipeoffload.schedules import schedule_names

    return schedule_names()


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
