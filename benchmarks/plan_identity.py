"""Outputs that a speed change must leave byte-identical: plan tables and simulations over a grid.

Run: .venv/bin/python benchmarks/plan_identity.py --record /tmp/before.json   (before a change)
     .venv/bin/python benchmarks/plan_identity.py --check /tmp/before.json    (after it: exit 1 on a difference)
     --digest FILE writes one line per case (its sha256) for benchmarks/results/plan_identity.txt, and
     --check benchmarks/results/plan_identity.txt compares with those digests (no recorded JSON needed).

Each case runs the CLI in this process (``pipeoffload.cli.main``) and keeps its stdout and exit code:
``plan`` as text and as ``--json`` for a few requests (the headline, a shared host link, ``--by-tp``, an
infeasible budget, small models), and ``simulate --json`` for every schedule family x offload
none/all/auto x a few (d, m, k), with and without ``--shared-host-link``. Speed work may change no plan
and no figure, so the comparison is exact.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import shlex
import sys
import time
from pathlib import Path

from pipeoffload.cli import main as cli_main
from pipeoffload.schedules import schedule_names

HEADLINE = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "512", "--memory", "80"]
PLANS = {
    "headline": HEADLINE,
    "shared-link": ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "32", "--global-batch", "128",
                    "--memory", "80", "--shared-host-link"],
    "by-tp": ["--model", "gpt3-13b", "--gpu", "a100", "--gpus", "16", "--global-batch", "128", "--by-tp"],
    "infeasible": ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--memory", "20"],
    "small": ["--model", "llama3-8b", "--gpu", "a100", "--gpus", "8", "--global-batch", "64"],
    "qwen-shared": ["--model", "qwen2.5-7b", "--gpu", "a100", "--gpus", "8", "--global-batch", "32",
                    "--shared-host-link"],
    "gpt3-175b": ["--model", "gpt3-175b", "--gpu", "a100", "--gpus", "64", "--global-batch", "128"],
    "budget-tight": ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "32", "--global-batch", "128",
                     "--memory", "48"],
}
SIZES = [  # (d, m, k, shared host link)
    (4, 8, 0.5, False),
    (8, 32, 0.5, False),
    (8, 32, 1.5, False),
    (8, 32, 0.5, True),
    (16, 64, 1.0, True),
]


def cases(quick: bool) -> dict[str, list[str]]:
    """Case name -> argv. ``quick`` leaves out the three slowest plan requests."""
    out: dict[str, list[str]] = {}
    for name, argv in PLANS.items():
        if quick and name in ("headline", "gpt3-175b", "shared-link"):
            continue
        out[f"plan {name}"] = ["plan", *argv]
        out[f"plan {name} --json"] = ["plan", *argv, "--json"]
    for family in schedule_names():
        for d, m, k, shared in SIZES:
            for policy in ("none", "all", "auto"):
                argv = ["simulate", family, "-d", str(d), "-m", str(m), "--offload", policy,
                        "--offload-ratio", str(k), "--json"]
                if shared:
                    argv.append("--shared-host-link")
                out[" ".join(argv[1:])] = argv
    return out


# what a plan prints about its own run time, the one part of an output that may differ between runs
_ELAPSED = [(re.compile(r"in [0-9.,]+ s = [0-9,]+ candidates/s"), "in (elapsed) s = (rate) candidates/s"),
            (re.compile(r'"seconds": [0-9.e+-]+'), '"seconds": (elapsed)'),
            (re.compile(r"^.*planner\.progress: searching.*\n", re.MULTILINE), "")]  # progress lines


def masked(text: str) -> str:
    for pattern, replacement in _ELAPSED:
        text = pattern.sub(replacement, text)
    return text


def run(argv: list[str]) -> str:
    """The command's exit code, stdout and stderr as one text (its run time masked). Each plan starts
    cold: its search owns its memo."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return masked(f"exit {code}\n{out.getvalue()}\n--- stderr\n{err.getvalue()}")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_digests(text: str) -> dict[str, str]:
    """Each case's digest from a --record JSON file or from a --digest file ('sha256  case' lines)."""
    if text.lstrip().startswith("{"):
        return {name: digest(masked(output)) for name, output in json.loads(text).items()}
    lines = (line for line in text.splitlines() if line and not line.startswith("#"))  # "#": the command line
    return {name: value for value, _, name in (line.partition("  ") for line in lines)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", help="write every case's output to this JSON file")
    parser.add_argument("--check", help="compare every case's output with this recorded JSON file, or with "
                                        "the digests of a --digest file (benchmarks/results/plan_identity.txt)")
    parser.add_argument("--digest", help="write 'sha256  case' lines to this file")
    parser.add_argument("--quick", action="store_true", help="leave out the slowest plan requests")
    parser.add_argument("--only", help="run only the cases whose name contains this text")
    args = parser.parse_args()
    outputs: dict[str, str] = {}
    chosen = {name: argv for name, argv in cases(args.quick).items() if not args.only or args.only in name}
    if not chosen:  # a check of nothing must not read as a pass
        parser.error(f"--only {args.only!r} matches no case (names are the command without 'pipeoffload', e.g. "
                     "'zb-v -d 8 -m 32' or 'plan --model')")
    for name, argv in chosen.items():
        cpu = time.process_time()
        outputs[name] = run(argv)
        print(f"{time.process_time() - cpu:7.2f} s  {name}", file=sys.stderr)
    if args.record:
        Path(args.record).write_text(json.dumps(outputs, indent=1, sort_keys=True))
    if args.digest:
        command = f"# command: .venv/bin/python {shlex.join(sys.argv)}\n"  # the file names what wrote it
        Path(args.digest).write_text(command + "".join(f"{digest(text)}  {name}\n" for name, text in sorted(outputs.items())))
    if args.check:
        recorded = recorded_digests(Path(args.check).read_text())
        different = [name for name, text in outputs.items() if recorded.get(name) != digest(text)]
        for name in different:
            print(f"DIFFERENT: {name}")
        print(f"{len(outputs) - len(different)} of {len(outputs)} cases identical")
        return 1 if different else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
