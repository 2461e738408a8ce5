"""A fault-injection sweep of ``pipeoffload train`` (the real CLI, 2 and 4 gloo ranks, a tiny GPT) and of
``PipelineRunner`` (``python -m pipeoffload.runtime --spawn 2``): one rank fails (an exception, ``os._exit``,
SIGKILL, SIGTERM, a NaN loss, ENOSPC, a stuck rank) at each phase of a run in turn, or the run is given a
corrupt data file or checkpoint. Per case: the exit code, the seconds from the fault to the exit, whether
every rank exited, whether a traceback reached the terminal, files left half written, and the last line.

    .venv/bin/python benchmarks/fault_sweep.py [--root PATH] [--only NAME,...] [--out FILE.jsonl]
    .venv/bin/python benchmarks/fault_sweep.py --compare BEFORE.jsonl AFTER.jsonl   # the markdown table

The faults are injected from outside the project: ``tests/dist/fault_site/sitecustomize.py`` wraps one
function of one process (``PIPEOFFLOAD_TEST_FAULT``). ``--root`` runs another checkout (e.g. a worktree of
an older commit) with this checkout's injector. Every run has a wall limit of 60 s (``HANG``); ``--timeout``
of the runs is 20 s, so a stuck rank is found well inside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SITE = HERE / "tests" / "dist" / "fault_site"
LIMIT = 60.0
TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "4",
        "--warmup", "1", "--no-progress", "--tokenizer", "byte", "--timeout", "20"]
PP2 = ["--nproc", "2", "--pp", "2"]
DP2 = ["--nproc", "4", "--pp", "2", "--dp", "2"]
ZBV = [*PP2, "--schedule", "zb-v", "--offload", "all"]
GI = [*PP2, "--schedule", "group-interleaved", "--offload", "all"]
LLAMA = ["--model", "llama", "--heads", "4", "--kv-heads", "2"]


@dataclass
class Case:
    name: str
    args: list[str]  # of `pipeoffload train` (or of the command in ``cmd``)
    fault: str = ""  # PIPEOFFLOAD_TEST_FAULT
    prepare: str = ""  # a first run (these args) whose output the case then reads (resume, export)
    spoil: str = ""  # what to do to the data or the first run's folder before the case
    cmd: str = "train"  # train | runtime | export
    expect: int = 1


def cases() -> list[Case]:
    c: list[Case] = []
    add = c.append
    # start-up
    add(Case("mesh raise r1", [*PP2, "--steps", "4"], "mesh:1:raise"))
    add(Case("mesh os._exit r1", [*PP2, "--steps", "4"], "mesh:1:exit"))
    add(Case("mesh SIGKILL r0", [*PP2, "--steps", "4"], "mesh:0:kill"))
    add(Case("mesh SIGTERM r1", [*PP2, "--steps", "4"], "mesh:1:term", expect=143))
    add(Case("mesh raise r3 (dp2)", [*DP2, "--steps", "4"], "mesh:3:raise"))
    # data
    add(Case("launcher prepare EIO", [*PP2, "--steps", "4"], "prepare:-1:eio"))
    add(Case("corpus raise r1", [*PP2, "--steps", "4"], "corpus:1:raise"))
    add(Case("corpus os._exit r0", [*PP2, "--steps", "4"], "corpus:0:exit"))
    add(Case("batch EIO r1 step 1", [*PP2, "--steps", "4"], "batch:1:eio:1"))
    add(Case("batch raise r0 step 3", [*PP2, "--steps", "4"], "batch:0:raise:3"))
    add(Case("data: invalid UTF-8 (byte tokenizer)", [*PP2, "--steps", "4"], spoil="data:binary", expect=0))
    add(Case("data: bad .jsonl line", [*PP2, "--steps", "4"], spoil="data:jsonl", expect=2))
    add(Case("data: dangling symlink", [*PP2, "--steps", "4"], spoil="data:dangling", expect=2))
    add(Case("data: empty file", [*PP2, "--steps", "4"], spoil="data:empty", expect=2))
    add(Case("data: corrupt .npy", [*PP2, "--steps", "4"], spoil="data:npy", expect=2))
    add(Case("data: odd-sized .bin", [*PP2, "--steps", "4"], spoil="data:bin", expect=2))
    # the pipeline step
    add(Case("forward raise r1 step 1", [*PP2, "--steps", "4"], "forward:1:raise:1"))
    add(Case("forward raise r0 step 3", [*PP2, "--steps", "4"], "forward:0:raise:3"))
    add(Case("backward raise r1 step 3", [*PP2, "--steps", "4"], "backward:1:raise:3"))
    add(Case("forward SIGKILL r1 step 3", [*PP2, "--steps", "4"], "forward:1:kill:3"))
    add(Case("forward os._exit(0) r0 step 3", [*PP2, "--steps", "4"], "forward:0:exit0:3"))
    add(Case("forward stuck r1 step 3", [*PP2, "--steps", "4"], "forward:1:hang:3"))
    add(Case("forward SIGTERM r1 step 3", [*PP2, "--steps", "6"], "forward:1:term:3", expect=143))
    add(Case("loss NaN r1 step 3", [*PP2, "--steps", "4"], "loss:1:nan:3"))
    add(Case("dp2 loss NaN r3 step 3", [*DP2, "--steps", "4"], "loss:3:nan:3"))
    add(Case("zb-v forward raise r1 step 3", [*ZBV, "--steps", "4"], "forward:1:raise:3"))
    add(Case("zb-v I raise r0 step 3", [*ZBV, "--steps", "4"], "backward_input:0:raise:3"))
    add(Case("zb-v reload os._exit r1 step 3", [*ZBV, "--steps", "4"], "reload:1:exit:3"))
    add(Case("gi offload raise r0 step 3", [*GI, "--steps", "4"], "offload:0:raise:3"))
    add(Case("gi reload SIGKILL r1 step 3", [*GI, "--steps", "4"], "reload:1:kill:3"))
    add(Case("recompute raise r0 step 3", [*PP2, "--recompute", "all", "--steps", "4"], "recompute:0:raise:3"))
    # gradient reduction
    add(Case("dp2 all-reduce raise r2 step 3", [*DP2, "--steps", "4"], "reduce:2:raise:3"))
    add(Case("dp2 all-reduce SIGKILL r3 step 3", [*DP2, "--steps", "4"], "reduce:3:kill:3"))
    add(Case("fsdp reduce raise r1 step 3", [*DP2, "--fsdp", "--steps", "4"], "fsdp:1:raise:3"))
    add(Case("fsdp reduce os._exit r2 step 3", [*DP2, "--fsdp", "--steps", "4"], "fsdp:2:exit:3"))
    # the optimizer step, metrics, evaluation
    add(Case("optimizer raise r1 step 3", [*PP2, "--steps", "4"], "optim:1:raise:3"))
    add(Case("optimizer SIGKILL r0 step 3", [*PP2, "--steps", "4"], "optim:0:kill:3"))
    add(Case("metrics ENOSPC r0 step 3", [*PP2, "--steps", "4"], "metrics:0:enospc:3"))
    add(Case("metrics raise r0 step 3", [*PP2, "--steps", "4"], "metrics:0:raise:3"))
    add(Case("eval raise r1 step 2", [*PP2, "--steps", "4", "--eval-every", "2"], "eval:1:raise:2"))
    add(Case("eval SIGKILL r0 step 2", [*PP2, "--steps", "4", "--eval-every", "2"], "eval:0:kill:2"))
    add(Case("eval NaN loss r1 step 2", [*PP2, "--steps", "4", "--eval-every", "2"], "eval:1:nan:2"))
    # checkpoint save
    add(Case("save raise r1 step 2", [*PP2, "--steps", "4", "--save-every", "2"], "save:1:raise:2"))
    add(Case("save SIGKILL r0 step 2", [*PP2, "--steps", "4", "--save-every", "2"], "save:0:kill:2"))
    add(Case("save SIGTERM r1 step 2", [*PP2, "--steps", "6", "--save-every", "2"], "save:1:term:2", expect=143))
    add(Case("DCP write ENOSPC r1 step 2", [*PP2, "--steps", "4", "--save-every", "2"], "dcp_write:1:enospc:2"))
    add(Case("DCP write os._exit r0 step 2", [*PP2, "--steps", "4", "--save-every", "2"], "dcp_write:0:exit:2"))
    add(Case("manifest ENOSPC r0 step 2", [*PP2, "--steps", "4", "--save-every", "2"], "finish_save:0:enospc:2"))
    add(Case("async DCP write ENOSPC r1 step 2", [*PP2, "--steps", "4", "--save-every", "2", "--async-save"],
             "dcp_write:1:enospc:2"))
    add(Case("async DCP write SIGKILL r0 step 2", [*PP2, "--steps", "4", "--save-every", "2", "--async-save"],
             "dcp_write:0:kill:2"))
    add(Case("async manifest ENOSPC r0 step 2", [*PP2, "--steps", "4", "--save-every", "2", "--async-save"],
             "finish_save:0:enospc:2"))
    add(Case("dp2 async save raise r3 step 2", [*DP2, "--steps", "4", "--save-every", "2", "--async-save"],
             "save:3:raise:2"))
    # resume
    first = [*PP2, "--steps", "4", "--save-every", "2", "--stop-at", "2"]
    add(Case("resume: load raise r1", ["--resume"], "load:1:raise", prepare=" ".join(first)))
    add(Case("resume: load SIGKILL r0", ["--resume"], "load:0:kill", prepare=" ".join(first)))
    add(Case("resume: corrupt shard", ["--resume"], prepare=" ".join(first), spoil="ckpt:shard", expect=2))
    add(Case("resume: truncated manifest", ["--resume"], prepare=" ".join(first), spoil="ckpt:manifest", expect=2))
    add(Case("resume: missing rng file", ["--resume"], prepare=" ".join(first), spoil="ckpt:rng", expect=2))
    add(Case("resume: garbage rng file", ["--resume"], prepare=" ".join(first), spoil="ckpt:rng-garbage",
             expect=2))
    add(Case("resume: corrupt metrics.jsonl", ["--resume"], prepare=" ".join(first), spoil="run:metrics",
             expect=2))
    add(Case("resume: corrupt config.toml", ["--resume"], prepare=" ".join(first), spoil="run:config", expect=2))
    add(Case("resume: corrupt trainer.json", ["--resume"], prepare=" ".join(first), spoil="ckpt:trainer",
             expect=2))
    # export (a one-process command)
    llama = " ".join([*PP2, *LLAMA, "--steps", "2", "--save-every", "2"])
    add(Case("export: ENOSPC writing", [], "export:-1:enospc", prepare=llama, cmd="export"))
    add(Case("export: corrupt shard", [], prepare=llama, spoil="ckpt:shard", cmd="export", expect=2))
    add(Case("export: truncated manifest", [], prepare=llama, spoil="ckpt:manifest", cmd="export", expect=2))
    # the end of the run
    add(Case("shutdown raise r1", [*PP2, "--steps", "2"], "shutdown:1:raise"))
    add(Case("shutdown SIGKILL r0", [*PP2, "--steps", "2"], "shutdown:0:kill"))
    add(Case("shutdown os._exit(0) r1", [*PP2, "--steps", "2"], "shutdown:1:exit0"))
    # PipelineRunner directly (python -m pipeoffload.runtime --spawn 2: a GPT, AdamW, 3 steps)
    rt = ["--spawn", "2", "--layers", "4", "--timeout", "20"]
    add(Case("runner: forward raise r1", rt, "forward:1:raise:2", cmd="runtime"))
    add(Case("runner: backward SIGKILL r0", rt, "backward:0:kill:2", cmd="runtime"))
    add(Case("runner: zb-v reload raise r1", [*rt, "--schedule", "zb-v", "--offload", "all"], "reload:1:raise:2",
             cmd="runtime"))
    add(Case("runner: gi offload os._exit r0", [*rt, "--schedule", "group-interleaved", "--offload", "all"],
             "offload:0:exit:2", cmd="runtime"))
    add(Case("runner: recompute raise r0", [*rt, "--recompute", "all"], "recompute:0:raise:2", cmd="runtime"))
    add(Case("runner: forward stuck r0", rt, "forward:0:hang:2", cmd="runtime"))
    return c


@dataclass
class Outcome:
    code: int | str
    seconds: float
    ranks_gone: bool
    traceback: bool
    leftovers: list[str] = field(default_factory=list)
    last: str = ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pids(out: Path) -> list[int]:
    log = out / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [int(p) for p in re.findall(r"rank \d+ of \d+: pid (\d+)", text)]


def _spoil(how: str, data: Path, run: Path) -> Path:
    """Damage the data (returns the --data path to use) or the first run's folder."""
    kind, what = how.split(":")
    if kind == "data":
        if what == "binary":
            bad = data.with_name("bad.txt")
            bad.write_bytes(b"text\n" + bytes(range(128, 256)) * 50)
        elif what == "jsonl":
            bad = data.with_name("bad.jsonl")
            bad.write_text('{"text": "one document"}\n{"text": "two" \n')
        elif what == "dangling":
            bad = data.with_name("gone.txt")
            bad.symlink_to(data.with_name("nowhere.txt"))
        elif what == "empty":
            bad = data.with_name("empty.txt")
            bad.write_text("")
        elif what == "npy":
            bad = data.with_name("tokens.npy")
            bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
        else:
            bad = data.with_name("tokens.bin")
            bad.write_bytes(b"\x01\x02\x03" * 5001)
        return bad
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    if what == "shard":
        shard = sorted(ckpt.glob("*.distcp"))[0]
        blob = bytearray(shard.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        shard.write_bytes(bytes(blob))
    elif what == "manifest":
        manifest = ckpt / "manifest.json"
        manifest.write_text(manifest.read_text()[:40])
    elif what == "rng":
        next(ckpt.glob("rng-rank1*")).unlink()
    elif what == "rng-garbage":
        next(ckpt.glob("rng-rank1*")).write_bytes(b"not a torch file")
    elif what == "trainer":
        (ckpt / "trainer.json").write_text("{")
    elif what == "metrics":
        path = run / "metrics.jsonl"
        path.write_text("{broken\n" + path.read_text())
    elif what == "config":
        (run / "config.toml").write_text("[run\nsteps = ")
    return data


def _leftovers(root: Path) -> list[str]:
    left = [str(p.relative_to(root)) for p in root.rglob(".tmp-*")]
    left += [str(p.relative_to(root)) for p in (root / "tmp").glob("pipeoffload-*")]
    hf = root / "hf"
    if hf.exists():
        left.append("hf (a half-written export)")
    return left


def run_case(case: Case, root: Path, python: str, data: Path, work: Path) -> Outcome:
    run = work / "run"
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    base_env = {**os.environ, "TMPDIR": str(work / "tmp"), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(root), str(SITE)])}
    base_env.pop("PIPEOFFLOAD_TEST_FAULT", None)
    if case.prepare:
        done = subprocess.run([python, "-m", "pipeoffload", "train", *TINY, "--eval-every", "1000", "--data", str(data),
                               "--out", str(run),
                               *case.prepare.split()], env=base_env, capture_output=True, text=True, timeout=300,
                              cwd=root)
        if done.returncode != 0:
            return Outcome(f"prep {done.returncode}", 0.0, True, False, last=done.stderr.strip()[-150:])
    if case.spoil:
        data = _spoil(case.spoil, data, run)
    if case.cmd == "train":
        every = [] if "--eval-every" in case.args else ["--eval-every", "1000"]
        argv = ["train", *case.args, str(run)] if case.args == ["--resume"] else \
            ["train", *TINY, *every, "--data", str(data), "--out", str(run), *case.args]
        argv = [python, "-m", "pipeoffload", *argv]
    elif case.cmd == "export":
        argv = [python, "-m", "pipeoffload", "export", str(run), "--hf", str(work / "hf")]
    else:
        argv = [python, "-m", "pipeoffload.runtime", *case.args]
    env = {**base_env, "PIPEOFFLOAD_TEST_FAULT": case.fault} if case.fault else base_env
    start = time.time()
    with open(work / "stdout", "w") as so, open(work / "stderr", "w") as se:
        # in --root: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH's --root, so from
        # another checkout's folder a sweep of --root ran that checkout's package instead
        proc = subprocess.Popen(argv, stdout=so, stderr=se, env=env, start_new_session=True, cwd=root)
        try:
            code: int | str = proc.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            code = "HANG"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    end = time.time()
    err = (work / "stderr").read_text(errors="replace")
    struck = re.search(r"\[fault_site\] rank -?\d+: \w+ at step \d+ t=([\d.]+)", err)
    pids = _pids(run)
    time.sleep(0.3)
    gone = not [p for p in pids if _alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[fault_site]")]
    return Outcome(code, end - (float(struck.group(1)) if struck else start), gone, "Traceback" in err,
                   _leftovers(work), lines[-1] if lines else "")


def _brief(row: dict) -> str:
    """One cell: exit code, seconds from the fault to the exit, and what went wrong."""
    bad = [] if row["ranks_gone"] else ["ranks left running"]
    bad += ["traceback"] * row["traceback"] + [f"left {p}" for p in row["leftovers"]]
    if row["code"] != row["expect"]:
        bad.append(f"expected {row['expect']}")
    named = _named(row)
    return f"{row['code']}, {row['s']:.1f} s" + (f", {named}" if named else "") + "".join(f", **{b}**" for b in bad)


def _named(row: dict) -> str:
    """Whether the last line names the failing rank (faults of one rank only) and what it was doing."""
    m = re.match(r"\w+:(-?\d+):", row["fault"])
    if not m or m.group(1) == "-1" or row["code"] in (0, 143, "HANG"):
        return ""
    last = row["last"]
    rank = f"rank {m.group(1)}" in last
    action = re.search(r"failed (while|at)|reading the|while \w+ing|saving the checkpoint|not finite|still running",
                       last)
    gone = re.search(r"killed by signal|exited with code", last)  # a process that died says nothing itself
    return ("rank" if rank else "**rank not named**") + (" + action" if action else " (died)" if gone else
                                                         " **no action**")


def compare(before: Path, after: Path) -> str:
    """The markdown table of two sweeps' JSON lines: case, fault, result before, result after."""
    old = {r["case"]: r for r in map(json.loads, before.read_text().splitlines())}
    lines = ["| case | fault (target:rank:kind[:step]) | before | after |", "|---|---|---|---|"]
    for r in map(json.loads, after.read_text().splitlines()):
        was = old.get(r["case"])
        lines.append(f"| {r['case']} | `{r['fault']}` | {_brief(was) if was else '(new)'} | {_brief(r)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="print the table of two sweeps' --out JSON lines instead of running one")
    parser.add_argument("--root", default=str(HERE))
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    parser.add_argument("--out", default="", help="also write each case's result here, as JSON lines")
    args = parser.parse_args()
    if args.compare:
        print(compare(Path(args.compare[0]), Path(args.compare[1])), end="")
        return
    chosen = [c for c in cases() if not args.only or any(s in c.name for s in args.only.split(","))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fault-sweep-") as tmp:
        data = Path(tmp) / "data.txt"
        data.write_text("".join(p.read_text() for p in sorted((HERE / "pipeoffload" / "train").glob("*.py"))))
        for i, case in enumerate(chosen):
            work = Path(tmp) / f"case{i}"
            work.mkdir()
            o = run_case(case, Path(args.root), sys.executable, data, work)
            ok = o.code == case.expect and o.ranks_gone and not o.traceback and not o.leftovers
            row = {"case": case.name, "fault": case.fault or case.spoil, "code": o.code, "expect": case.expect,
                   "s": round(o.seconds, 1), "ranks_gone": o.ranks_gone, "traceback": o.traceback,
                   "leftovers": o.leftovers, "last": o.last, "ok": ok}
            rows.append(row)
            print(f"{'ok ' if ok else 'BAD'} {case.name:36s} exit {o.code!s:>4} {o.seconds:5.1f}s "
                  f"{'' if o.ranks_gone else 'RANKS-LEFT '}{'TRACEBACK ' if o.traceback else ''}"
                  f"{' '.join(o.leftovers)} | {o.last[:240]}", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
