"""The public path a user runs, each case first call in a fresh process (process CPU seconds).

Issue #11's targets, measured the way a user meets them (issue #19): ``generate`` -> ``lower`` (which
validates before and after) -> ``simulate`` for interleaved-1f1b at d = 64, v = 2, m = 256 in 0.4 s;
the same with ``offload="all"`` in 1.0 s; the headline ``pipeoffload plan`` in 2.5 s. Each case runs
in its own interpreter; the figure is that child's user + sys CPU time including its imports (``cpu``)
and the CPU time of the calls alone (``calls``), best of --repeat fresh processes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

CASES = {
    "generate-lower-simulate d=64": """
from pipeoffload import generate, lower, simulate
t = time.process_time()
timeline = simulate(lower(generate("interleaved-1f1b", 64, 256, 2)))
calls = time.process_time() - t
figure = round(timeline.bubble_ratio, 6)
""",
    "same with offload all": """
from pipeoffload import CostModel, generate, lower, simulate
costs = CostModel().with_offload_ratio(0.5)
t = time.process_time()
timeline = simulate(lower(generate("interleaved-1f1b", 64, 256, 2), costs, offload="all"), costs)
calls = time.process_time() - t
figure = round(timeline.makespan, 6)
""",
    "plan (headline, CLI)": """
import contextlib, io
from pipeoffload.cli import main
argv = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "512", "--memory", "80"]
out = io.StringIO()
t = time.process_time()
with contextlib.redirect_stdout(out):
    main(argv)
calls = time.process_time() - t
figure = next(line for line in out.getvalue().splitlines() if line.strip().startswith("1 "))[:60].strip()
""",
}


def run_case(code: str) -> dict[str, object]:
    """One fresh interpreter: returns its CPU seconds (user + sys, imports included) and its report."""
    program = f"import time\n{code}\nimport json\nprint(json.dumps([calls, figure]))"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    calls, figure = json.loads(done.stdout.strip().splitlines()[-1])
    return {"cpu": cpu, "calls": calls, "figure": figure}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-plan", action="store_true", help="leave out the headline plan (the slowest case)")
    args = parser.parse_args()
    print(f"# {sys.executable} benchmarks/public_path.py --repeat {args.repeat}; load average "
          f"{os.getloadavg()[0]:.2f} at start; best of {args.repeat} fresh processes")
    print(f"{'case':30} {'cpu s':>6} {'calls s':>8}  figure")
    for name, code in CASES.items():
        if args.skip_plan and name.startswith("plan"):
            continue
        runs = [run_case(code) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: float(r["cpu"]))  # type: ignore[arg-type]
        calls = min(float(r["calls"]) for r in runs)  # type: ignore[arg-type]
        print(f"{name:30} {float(best['cpu']):6.2f} {calls:8.2f}  {best['figure']}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
