"""``make demo``: simulate and compare schedules (pictures in ``out/``), then `pipeoffload train` on 4 ranks.

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
from pipeoffload.simulator import Timeline, simulate

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


# `make demo`'s training: one small GPT on 4 CPU ranks (2 pipeline x 2 data-parallel) on the default text
# (the standard library's sources), once with 1F1B and once with group-interleaved stages + full offload.
TRAIN_COMMON = ["--pp", "2", "--dp", "2", "--nproc", "4", "--layers", "4", "--hidden", "64", "--heads", "4",
                "--seq-len", "64", "--global-batch", "16", "--microbatches", "4", "--steps", "30",
                "--eval-every", "10", "--save-every", "30", "--lr", "1e-3", "--warmup", "5", "--no-progress"]
TRAIN_RUNS = [
    ("1F1B", "train-1f1b", ["--schedule", "1f1b"]),
    ("group-interleaved v=2 + offload all", "train-gi-offload",
     ["--schedule", "group-interleaved", "--stages-per-rank", "2", "--offload", "all"]),
]


def _train(out: Path, extra: list[str]) -> list[dict]:
    import json
    import shutil
    import subprocess
    import sys

    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time (train refuses a folder with checkpoints)
    cmd = [sys.executable, "-m", "pipeoffload", "train", *TRAIN_COMMON, *extra, "--out", str(out)]
    print("  $ pipeoffload train " + " ".join(cmd[4:]), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"pipeoffload train failed with exit code {done.returncode}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _report(run: Path) -> str:
    """`pipeoffload report RUN_DIR` when that command exists in this version."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("pipeoffload.cli.report") is None:
        return f"  (no `pipeoffload report` command in this version: skipped the report of {run})"
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "report", str(run)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"  pipeoffload report {run} failed: {done.stderr.strip().splitlines()[-1:]}"
    return f"  report: {run}/report.html"


def run_line(label: str, metrics: list[dict]) -> str:
    """One run's line: its losses, the worst rank's measured and simulated peak, and its steps' time
    (the sum of ``step_s``: the run's training steps, not its start-up, validation or saves)."""
    peak = max(max(m["peak_act_bytes"]) for m in metrics)
    sim = max(max(m["sim_peak_act_bytes"]) for m in metrics)
    vals = [m["val_loss"] for m in metrics if m["val_loss"] is not None]
    return (f"  {label:36}: loss {metrics[0]['loss']:.4f} -> {metrics[-1]['loss']:.4f}, val loss "
            f"{vals[0]:.4f} -> {vals[-1]:.4f}; worst rank's peak activations {peak / 2**10:.0f} KiB "
            f"(simulated {sim / 2**10:.0f} KiB); its {len(metrics)} steps took "
            f"{sum(m['step_s'] for m in metrics):.1f} s")


def train_tour(out: Path) -> str:
    """Train the same GPT with two schedules through `pipeoffload train`; compare losses and memory."""
    print("Training a 4-block GPT on 4 CPU ranks (2 PP x 2 DP, gloo) on the standard library's sources, "
          "30 AdamW steps, twice:", flush=True)
    runs = {}
    for label, folder, extra in TRAIN_RUNS:
        runs[label] = _train(out / folder, extra)
    lines = [run_line(label, metrics) for label, metrics in runs.items()]
    (a, ma), (b, mb) = runs.items()
    same = [m["loss"] for m in ma] == [m["loss"] for m in mb]
    close = max(abs(x["loss"] - y["loss"]) for x, y in zip(ma, mb))
    drop = 1 - max(max(m["peak_act_bytes"]) for m in mb) / max(max(m["peak_act_bytes"]) for m in ma)
    lines.append(f"  losses {'bitwise identical' if same else f'equal within {close:.1e}'}; {b} cut the worst "
                 f"rank's measured activation memory by {drop:.0%}")
    for _, folder, _ in TRAIN_RUNS:
        lines.append(_report(out / folder))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].replace("``", ""))  # no reST markup in --help
    parser.add_argument("--out", default="out", help="folder for pictures (default: %(default)s/)")
    parser.add_argument("--no-train", action="store_true", help="skip the 4-rank training runs (need torch)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        print(train_tour(out))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
