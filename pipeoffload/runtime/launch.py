"""Starting pipeline processes: under ``torchrun`` (environment variables) or spawned from Python.

``spawn`` starts one process per rank with the ``spawn`` start method, joins them through a
``FileStore`` in a private temporary directory (no port to choose, so parallel runs cannot clash),
runs ``fn(rank, world_size, *args)`` in each, and returns what every rank returned or raised. Every
wait is bounded: processes still alive at the deadline are killed and reported as such.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


def init_from_env(backend: str | None = None, timeout: float = 300.0) -> tuple[int, int, torch.device]:
    """Initialise the default process group from torchrun's variables; returns (rank, world, device).

    NCCL and one GPU per local rank when CUDA is available, else gloo on CPU."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    return rank, world, device


@dataclass
class SpawnResult:
    exitcodes: list[int | None]
    results: list[Any]
    errors: list[str | None]
    seconds: list[float] = field(default_factory=list)  # per rank, from start to exit (or kill)

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exitcodes)


def _child(fn: Callable[..., Any], rank: int, world: int, args: tuple, folder: str, backend: str,
           timeout: float, threads: int) -> None:
    code = 0
    try:
        torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        result = fn(rank, world, *args)
        with open(f"{folder}/result-{rank}.pkl", "wb") as fh:
            pickle.dump(result, fh)
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit non-zero
        code = 1
        with open(f"{folder}/error-{rank}.txt", "w") as fh:
            fh.write(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
    os._exit(code)  # skip interpreter teardown: a peer that died must not hang our exit


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = 60.0,
    deadline: float = 300.0,
    threads: int = 1,
    grace: float | None = None,
) -> SpawnResult:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; collect the results.

    ``timeout`` is the process group's; ``deadline`` bounds the whole run (stragglers are killed);
    ``grace``: once a rank has failed, the others get this many seconds to exit before being killed
    (a stopped process never exits by itself)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pipeoffload-") as folder:
        procs = [
            ctx.Process(target=_child, args=(fn, r, world_size, args, folder, backend, timeout, threads), daemon=True)
            for r in range(world_size)
        ]
        start = time.monotonic()
        for p in procs:
            p.start()
        seconds: list[float] = [0.0] * world_size
        pending = set(range(world_size))
        limit = deadline
        while pending and time.monotonic() - start < limit:
            for r in list(pending):
                if procs[r].exitcode is not None:
                    seconds[r] = time.monotonic() - start
                    pending.discard(r)
                    if procs[r].exitcode != 0 and grace is not None:
                        limit = min(limit, seconds[r] + grace)
            time.sleep(0.05)
        for r in pending:
            procs[r].kill()
            procs[r].join(5)
            seconds[r] = time.monotonic() - start
        results, errors = [], []
        for r in range(world_size):
            path = f"{folder}/result-{r}.pkl"
            results.append(pickle.load(open(path, "rb")) if os.path.exists(path) else None)
            epath = f"{folder}/error-{r}.txt"
            err = open(epath).read() if os.path.exists(epath) else None
            if r in pending:
                why = f"the {deadline:.0f} s deadline" if limit == deadline else f"{grace:g} s after a rank failed"
                err = (err or "") + f"rank {r} still running: killed {why} (stuck or stopped?)"
            errors.append(err)
        codes = [p.exitcode for p in procs]
    return SpawnResult(codes, results, errors, seconds)
