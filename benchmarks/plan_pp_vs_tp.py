"""Rerun the `plan --by-tp` comparisons of docs/pp-offload-vs-tp.md and save each output.

Run: .venv/bin/python benchmarks/plan_pp_vs_tp.py [NAME ...]   (default: every run)
     .venv/bin/python benchmarks/plan_pp_vs_tp.py --table     (the doc's table, from the saved files)
Each result file, benchmarks/results/plan_pp_vs_tp_NAME.txt, starts with its command and the commit.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from pipeoffload.cli import main as cli
from pipeoffload.fileio import write_atomic

RUNS = {
    "gpt3-6.7b-a100-72gib": "--model gpt3-6.7b --seq 8192 --gpu a100 --gpus 8 --global-batch 32 --memory 72",
    "gpt3-6.7b-a100-40gib": "--model gpt3-6.7b --seq 8192 --gpu a100 --gpus 8 --global-batch 32 --memory 40",
    "gpt3-13b-a100-72gib": "--model gpt3-13b --seq 8192 --gpu a100 --gpus 16 --global-batch 64 --memory 72",
    "gpt3-13b-a100-40gib": "--model gpt3-13b --seq 8192 --gpu a100 --gpus 16 --global-batch 64 --memory 40",
    "gpt3-13b-a100-40gib-nolgd": "--model gpt3-13b --seq 8192 --gpu a100 --gpus 16 --global-batch 64 --memory 40 "
                                 "--no-partial-recompute",
    "gpt3-13b-a100-40gib-30gbps": "--model gpt3-13b --seq 8192 --gpu a100 --gpus 16 --global-batch 64 --memory 40 "
                                  "--offload-bw 30",
    "gpt3-13b-gh200-40gib": "--model gpt3-13b --seq 8192 --gpu gh200 --gpus 16 --global-batch 64 --memory 40",
    "llama3-70b-h100-72gib": "--model llama3-70b --gpu h100 --gpus 64 --global-batch 256 --memory 72",
}
NOT_EXHAUSTIVE = {"llama3-70b-h100-72gib"}  # --by-tp alone: the exhaustive search takes too long here
SUFFIX = " --by-tp --exhaustive"


def run(name: str) -> None:
    suffix = " --by-tp" if name in NOT_EXHAUSTIVE else SUFFIX
    argv = ["plan", *RUNS[name].split(), *suffix.split()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(argv)
    header = f"$ pipeoffload {' '.join(argv)}\n# {commit}, load average {load:.2f} at start\n"
    write_atomic(Path("benchmarks/results") / f"plan_pp_vs_tp_{name}.txt", header + out.getvalue())
    print(f"{name}: exit {code}", flush=True)


def best_per_tp(name: str) -> dict[int, tuple[str, float, float]]:
    """TP size -> (layout and schedule, tokens/s, total GiB) from a saved result file."""
    lines = (Path("benchmarks/results") / f"plan_pp_vs_tp_{name}.txt").read_text().splitlines()
    start = lines.index("best plan per tensor-parallel size:") + 2
    out: dict[int, tuple[str, float, float]] = {}
    for line in lines[start:]:
        if not line.strip():
            break
        cols = line.split()
        tp = int(cols[1].split("xTP")[1].split("x")[0])
        plan = f"{cols[1]} {cols[2]} v{cols[3]}" + (f" g{cols[4]}" if cols[4] != "-" else "") + \
            f", offload {cols[5]}, recompute {cols[6]}"
        out[tp] = (plan, float(cols[8].replace(",", "")), float(cols[11]))
    return out


def table() -> str:
    rows = ["| run | TP1 (PP + offload) | tok/s | GiB | TP8 tok/s | best TP > 1 | TP1 vs TP8 | TP1 vs best TP > 1 |",
            "|---|---|---|---|---|---|---|---|"]
    for name in RUNS:
        best = best_per_tp(name)
        one, eight = best[1], best.get(8)
        other = max((v for k, v in best.items() if k > 1), key=lambda v: v[1])
        vs8 = f"{one[1] / eight[1] - 1:+.1%}" if eight else "n/a"
        rows.append(f"| {name} | {one[0]} | {one[1]:,.0f} | {one[2]:.1f} | "
                    f"{eight[1]:,.0f} | {other[0].split(',')[0]}: {other[1]:,.0f} | {vs8} | "
                    f"{one[1] / other[1] - 1:+.1%} |" if eight else "")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
    else:
        for name in sys.argv[1:] or list(RUNS):
            run(name)
