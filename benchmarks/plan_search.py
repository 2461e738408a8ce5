"""Planner search speed: candidates enumerated/simulated per second on a few realistic searches.

Run: .venv/bin/python benchmarks/plan_search.py [--save benchmarks/results/plan_search.txt]
The headline is the command ``plan --model llama3-70b --gpu h100 --gpus 64 --global-batch 512 --memory 80``
as a fresh process (CPU seconds, user + sys, best of --repeat; target 2.5 s on a 2-core machine, 7.5 s
before the fast core) and in-process (each search owns its memo, so each run starts cold); then where the
headline's CPU time goes (``--breakdown``: the search and the confirmation of the shown plans, the memory
passes, the offload pass and its slower-copy plans, full-size lowerings by layout and schedule); with
``--count``, every simulation the headline's search runs, by what it is for (plain schedules, estimates
at small sizes, memory policies simulated at full size, confirmations of shown and of other plans), with
its CPU time and whether the output depends on it; then a few searches with their best plans.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pipeoffload.passes.lower as lower_module
import pipeoffload.passes.offload as offload_module
import pipeoffload.planner.evaluate as evaluate_module
import pipeoffload.planner.search as search_module
from pipeoffload.cli import main as cli_main
from pipeoffload.planner.evaluate import lowering_options
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.report import format_table
from pipeoffload.planner.search import PlanRequest, find_plans

CASES = [  # (model, gpu, gpus, global batch)
    ("llama3-70b", "h100", 64, 256),
    ("gpt3-175b", "a100", 64, 128),
    ("llama3-8b", "a100", 8, 64),
    ("gpt3-13b", "a100", 16, 128),
]


HEADLINE = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "512",
            "--memory", "80"]


def headline(repeat: int) -> tuple[float, float, str]:
    """Best CPU seconds of the headline command as a fresh process (interpreter start and imports
    included: what a user waits for) and in-process (cold: the search owns its memo); and its output."""
    command = [sys.executable, "-m", "pipeoffload", *HEADLINE]
    process, inside, out = float("inf"), float("inf"), ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(command, capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        process = min(process, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        buffer = io.StringIO()
        cpu = time.process_time()
        with contextlib.redirect_stdout(buffer):
            cli_main(HEADLINE)
        inside = min(inside, time.process_time() - cpu)
        out = buffer.getvalue()
    return process, inside, out


@contextlib.contextmanager
def _timed(owner: Any, name: str, label: str, calls: Counter[str], cpu: defaultdict[str, float],
           detail: Callable[..., str | None] | None = None) -> Iterator[None]:
    """Count the calls and CPU seconds of ``owner.name`` under ``label`` (and under ``detail(*args)``
    when that gives a text) while the block runs; the attribute is restored after. Nested calls of one
    label are counted once (outermost)."""
    original = getattr(owner, name)
    depth = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent = time.process_time() - start
                keys = [label] + ([extra] if detail is not None and (extra := detail(*args)) else [])
                for key in keys:
                    calls[key] += 1
                    cpu[key] += spent

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _full_size_label(choice: Any, pp: int, m: int, *_: Any) -> str | None:
    if choice.is_plain():
        return None
    return f"  full-size lowering: PP {pp} m={m} {choice.label()}"


def breakdown() -> list[str]:
    """Where the headline's CPU time goes (one in-process run, cold): the search loop and the
    confirmation of the shown plans; inside them the memory passes (``lower_with_report``), the offload
    pass (``plan_offload``) and its plans for slower copies (``best_with_slower_copies``, tried where a
    copy lane is overloaded); and every full-size simulation of a choice with a memory policy."""
    calls: Counter[str] = Counter()
    cpu: defaultdict[str, float] = defaultdict(float)
    with contextlib.ExitStack() as stack:
        for owner, name, label, detail in (
                (search_module._Search, "run", "search loop (simulate candidates in bound order)", None),
                (search_module, "_confirm", "confirm the shown plans at full size", None),
                (evaluate_module, "lower_with_report", "memory passes (lower_with_report)", None),
                (lower_module, "plan_offload", "offload pass (plan_offload)", None),
                (offload_module._Planning, "best_with_slower_copies", "slower-copy plans (best_with_slower_copies)",
                 None),
                (evaluate_module, "_full", "full-size simulations with a memory policy", _full_size_label)):
            stack.enter_context(_timed(owner, name, label, calls, cpu, detail))
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli_main(HEADLINE)
        total = time.process_time() - start
    lines = [f"# where the headline's {total:.2f} CPU s go (in-process, cold; nested: each line includes the "
             "ones below it that it calls)"]
    rest_calls, rest_cpu = 0, 0.0
    for key in sorted(cpu, key=lambda k: (k.startswith("  "), -cpu[k])):
        if key.startswith("  ") and cpu[key] < 0.01 * total:
            rest_calls += calls[key]
            rest_cpu += cpu[key]
            continue
        lines.append(f"#   {key:<92} {calls[key]:>4} calls {cpu[key]:>7.2f} s {100 * cpu[key] / total:>5.1f}%")
    if rest_calls:
        lines.append(f"#   {'  full-size lowerings under 1% each':<92} {rest_calls:>4} calls {rest_cpu:>7.2f} s "
                     f"{100 * rest_cpu / total:>5.1f}%")
    return lines


def _run_kind(plan: Any, confirm: bool, shown: bool) -> str:
    if confirm:
        return "confirm at full size: a shown plan" if shown else "confirm at full size: walked past (not shown)"
    if plan.choice.is_plain():
        return "search: plain schedule"
    return "search: memory policy, full size" if not plan.sim.extrapolated else "search: memory policy, estimate"


def count_runs() -> list[str]:
    """Every ``search._run`` of one cold in-process headline (the search's simulations and the
    confirmations), by kind: runs, CPU seconds, how many fit, changed nothing, or are shown. The text
    output prints the number simulated, the number that fit and each skip reason, so every run of the
    search is visible in it through those counts (issue #19: what an exact pruning could still skip)."""
    runs: list[tuple[float, bool, Any]] = []
    original, found = search_module._run, search_module._find_plans
    results: list[Any] = []

    def run(req: Any, cand: Any, exact: bool = False, base: Any = None, memo: Any = None) -> Any:
        start = time.process_time()
        plan = original(req, cand, exact, base, memo)
        runs.append((time.process_time() - start, exact, plan))
        return plan

    def find(req: Any) -> Any:
        results.append(found(req))
        return results[-1]

    search_module._run, search_module._find_plans = run, find  # type: ignore[assignment]
    try:
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli_main(HEADLINE)
        total = time.process_time() - start
    finally:
        search_module._run, search_module._find_plans = original, found  # type: ignore[assignment]
    result = results[-1]
    shown = {(str(p.layout), p.choice) for p in result.best(5) + result.pareto()}
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0])
    for cpu, confirm, plan in runs:
        row = rows[_run_kind(plan, confirm, (str(plan.layout), plan.choice) in shown)]
        row[0] += 1
        row[1] += cpu
        row[2] += plan.fits
        row[3] += not plan.choice.is_plain() and not plan.sim.changed
        row[4] += (str(plan.layout), plan.choice) in shown
    lines = [f"# every simulation of the headline (in-process, cold, {total:.2f} CPU s): {result.candidates} candidates, "
             f"{result.evaluated} simulated plans kept, {len(result.fitting)} fit, {len(shown)} distinct plans shown",
             f"#   {'kind':<48} {'runs':>5} {'cpu s':>7} {'fit':>4} {'same as plain':>13} {'shown':>5}"]
    for kind in sorted(rows, key=lambda k: -rows[k][1]):
        n, cpu, fit, same, seen = rows[kind]
        lines.append(f"#   {kind:<48} {n:>5.0f} {cpu:>7.2f} {fit:>4.0f} {same:>13.0f} {seen:>5.0f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="also write the report to this file")
    parser.add_argument("--no-prune", action="store_true", help="simulate every candidate (exhaustive)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the headline command (best is shown)")
    parser.add_argument("--breakdown", action="store_true", help="also show where the headline's time goes")
    parser.add_argument("--count", action="store_true", help="also count the headline's simulations by kind")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    process, inside, output = headline(args.repeat)
    best_line = next((ln for ln in output.splitlines() if ln.strip().startswith("1 ")), "")
    lines = [f"# headline: pipeoffload {' '.join(HEADLINE)}",
             f"#   {process:.2f} CPU s as a fresh process (user + sys, imports included), {inside:.2f} s in-process "
             f"(best of {args.repeat}); best plan: {best_line.strip()}",
             f"# plan_search ({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
             f"load average {load:.1f} at start, "
             f"lower() policies: {', '.join(lowering_options()) or 'none'}; prune={not args.no_prune})",
             f"{'model':<12} {'gpu':<5} {'gpus':>4} {'batch':>5} {'cands':>6} {'simulated':>9} {'seconds':>8} "
             f"{'cpu s':>6} {'cands/s':>8} {'sims/s':>7}  best plan"]
    if args.breakdown:
        lines[2:2] = breakdown()
    if args.count:
        lines[2:2] = count_runs()
    details = []
    for model, gpu, gpus, batch in CASES:
        hw = hardware_preset(gpu)
        req = PlanRequest(model=model_preset(model), hardware=hw, gpus=gpus, global_batch=batch,
                          memory_budget=0.9 * hw.memory_bytes, prune=not args.no_prune)
        start, cpu = time.perf_counter(), time.process_time()
        result = find_plans(req)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        best = result.best(1)[0]
        lines.append(f"{model:<12} {gpu:<5} {gpus:>4} {batch:>5} {result.candidates:>6} {result.evaluated:>9} "
                     f"{seconds:>8.1f} {cpu:>6.1f} {result.candidates / seconds:>8.1f} {result.evaluated / seconds:>7.1f}  "
                     f"{best.layout} {best.choice.label()} {best.tokens_per_second:,.0f} tok/s")
        details += ["", f"## {model} on {gpus} x {gpu}, global batch {batch}: best 3 and Pareto frontier",
                    format_table(result.best(3)), format_table(result.pareto())]
    text = "\n".join(lines + details)
    print(text)
    if args.save:
        Path(args.save).write_text(text + "\n")


if __name__ == "__main__":
    main()
