"""The validation loss of `pipeoffload train` on the default text falls well below its start.

Runs ``pipeoffload train`` (2 pipeline ranks, group-interleaved + full offload, byte tokenizer, the
standard library's sources) for a few hundred steps and prints the validation loss curve, the
start (after step 1), the end and their ratio; exits 1 if the end is not below 0.75 x the start.

    python benchmarks/train_loss_curve.py [--steps 300] [--out runs/loss-curve]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ARGS = ["--nproc", "2", "--pp", "2", "--schedule", "group-interleaved", "--offload", "all", "--layers", "4",
        "--hidden", "128", "--heads", "4", "--seq-len", "64", "--global-batch", "16", "--microbatches", "4",
        "--lr", "2e-3", "--warmup", "20", "--eval-every", "25", "--eval-batches", "4", "--no-progress"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="loss-curve-"))
    cmd = ["pipeoffload", "train", *ARGS, "--steps", str(args.steps), "--save-every", str(args.steps),
           "--out", str(out)]
    print("$ " + " ".join(cmd[:-2]) + " --out RUN")
    done = subprocess.run([sys.executable, "-m", *cmd], stdout=subprocess.DEVNULL)
    if done.returncode:
        return done.returncode
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["val_loss"]) for r in rows if r["val_loss"] is not None]
    print("step  train loss  val loss")
    for step, val in evals:
        print(f"{step:4d}  {rows[step - 1]['loss']:10.4f}  {val:8.4f}")
    start, end = evals[0][1], evals[-1][1]
    tps = sorted(r["tokens_per_s"] for r in rows)[len(rows) // 2]
    print(f"validation loss {start:.4f} -> {end:.4f} ({end / start:.2f}x); median {tps:.0f} tokens/s; "
          f"worst rank's peak activations {max(max(r['peak_act_bytes']) for r in rows) / 2**10:.0f} KiB")
    return 0 if end < 0.75 * start else 1


if __name__ == "__main__":
    raise SystemExit(main())
