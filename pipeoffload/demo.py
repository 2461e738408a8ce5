"""``make demo``: simulate and compare schedules, write pictures to ``out/``, then train on 2 ranks.

Run as ``python -m pipeoffload.demo [--out DIR]``.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeoffload.costs import CostModel
from pipeoffload.fileio import write_atomic
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulate import Timeline, simulate

log = logging.getLogger("pipeoffload.demo")

D, M = 8, 32
K_RATIO = 0.5  # the paper's offload ratio k = (D2H + H2D) / (F + I + W) of one activation
# (label, family, stages_per_rank, options, offload policy) on the same 8 ranks and 32 microbatches.
LINEUP = [
    ("GPipe", "gpipe", 1, {}, "none"),
    ("1F1B", "1f1b", 1, {}, "none"),
    ("interleaved 1F1B, v=2", "interleaved-1f1b", 2, {}, "none"),
    ("ZB-H1", "zb-h1", 1, {}, "none"),
    ("ZB-V", "zb-v", 2, {}, "none"),
    ("V-Min", "v-min", 2, {}, "none"),
    ("PipeOffload g=4, v=2", "group-interleaved", 2, {"group_size": 4}, "none"),
    ("  + offload first:1", "group-interleaved", 2, {"group_size": 4}, "first:1"),
    ("  + offload all", "group-interleaved", 2, {"group_size": 4}, "all"),
    ("1F1B + offload all", "1f1b", 1, {}, "all"),
    ("ZB-V + offload auto", "zb-v", 2, {}, "auto"),
]


def compare() -> list[tuple[str, Timeline]]:
    """Same model on every schedule: a rank's layers cost F = I = W = 1, split over its v stages;
    copies take k = 0.5 of the compute time of what they move."""
    results = []
    for label, name, v, options, offload in LINEUP:
        costs = CostModel.uniform(1.0 / v, 1.0 / v, 1.0 / v).with_offload_ratio(K_RATIO)
        schedule = lower(generate(name, D, M, v, **options), costs, offload=offload)
        results.append((label, simulate(schedule, costs)))
    return results


def table(results: list[tuple[str, Timeline]]) -> str:
    width = max(len(label) for label, _ in results)
    lines = [f"{'schedule'.ljust(width)}  makespan  bubble  peak memory (rank units)  vs 1F1B  stall"]
    base = next(t for label, t in results if label == "1F1B").peak_rank_units
    for label, t in results:
        lines.append(f"{label.ljust(width)}  {t.makespan:8.4g}  {t.bubble_ratio:6.1%}  {t.peak_rank_units:24.4g}  "
                     f"{t.peak_rank_units / base:6.2f}x  {t.stall:5.3g}")
    return "\n".join(lines)


TRAIN_ARGS = ["--schedule", "group-interleaved", "--stages-per-rank", "2", "--microbatches", "4",
              "--steps", "3", "--layers", "8", "--hidden", "64", "--seq", "32"]


def _train_worker(rank: int, world: int, argv: list[str]) -> dict:
    """Runs in a spawned process: train the reference GPT on this rank (torch imported only here)."""
    from pipeoffload.runtime.demo import parse, train

    return train(rank, world, parse(argv))


def train_tour(ranks: int = 2) -> str:
    """Train the same small GPT twice on ``ranks`` gloo processes, without and with full offload."""
    from pipeoffload.runtime.launch import spawn
    from pipeoffload.runtime.trace import Trace

    lines = [f"Training a small GPT ({TRAIN_ARGS[TRAIN_ARGS.index('--layers') + 1]} layers) on {ranks} CPU ranks (gloo), "
             "group-interleaved 1F1B, v=2, 4 microbatches, 3 AdamW steps:"]
    runs = {}
    for offload in ("none", "all"):
        result = spawn(_train_worker, ranks, (TRAIN_ARGS + ["--offload", offload],), deadline=600)
        if not result.ok:
            raise RuntimeError("training failed:\n" + "\n".join(e for e in result.errors if e))
        losses = next(r["losses"] for r in result.results if r["losses"])
        peaks = [Trace.from_dict(r["trace"]).peak_bytes for r in result.results]
        runs[offload] = (losses, peaks)
        lines.append(f"  offload {offload:4}: losses {', '.join(f'{x:.6f}' for x in losses)}; "
                     f"peak resident activations per rank {', '.join(f'{p / 2**10:.0f} KiB' for p in peaks)}")
    same = runs["none"][0] == runs["all"][0]
    drop = 1 - max(runs["all"][1]) / max(runs["none"][1])
    lines.append(f"  losses bitwise {'identical' if same else 'DIFFERENT'}; offload cut the worst rank's "
                 f"resident activations by {drop:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out", help="folder for pictures (default: out/)")
    parser.add_argument("--no-train", action="store_true", help="skip the 2-rank training run (needs torch)")
    args = parser.parse_args(argv)
    print(f"Simulating {len(LINEUP)} schedules of one model on d={D} ranks, m={M} microbatches: a rank's layers "
          f"take F = I = W = 1, host copies k = {K_RATIO} (the paper's offload ratio).\n"
          "Memory is the worst rank's peak in rank units (one microbatch through all of a rank's layers).\n")
    results = compare()
    print(table(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from pipeoffload.viz.plot import figure_bytes, timeline_figure
    from pipeoffload.viz.report import html_report

    pictures = []
    for label, timeline in results:
        slug = "".join(c if c.isalnum() else "-" for c in label.strip(" +").lower()).strip("-")
        path = out / f"{slug}.png"
        pictures.append(figure_bytes(timeline_figure(timeline, title=label)))
        write_atomic(path, pictures[-1])
    write_atomic(out / "report.html", html_report([t for _, t in results], title="pipeoffload demo", pictures=pictures))
    print(f"\nPictures: {out}/*.png and {out}/report.html (open in a browser).\n")
    if not args.no_train:
        print(train_tour())
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
