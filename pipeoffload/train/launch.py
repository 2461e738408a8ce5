"""Starting a training run: in this process, spawned local ranks, or under torchrun.

``run_ranks(fn, cfg)`` calls ``fn(ctx)`` on every rank with the process group and the device mesh
set up: under torchrun (``RANK``/``WORLD_SIZE`` in the environment) in this process, with
``cfg.parallel.nproc > 1`` in that many spawned processes (``pipeoffload.runtime.launch.spawn``: gloo on CPU),
else in this process as a one-rank group. The launcher forwards SIGINT/SIGTERM to spawned ranks,
which finish their step, save and exit.
"""
from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeoffload.train.config import TrainConfig

log = logging.getLogger(__name__)
RankFn = Callable[..., Any]
LOG_FORMAT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup_logging(rank: int, run_dir: Path | None, verbose: bool = False) -> None:
    """Rank-tagged lines (the rank once per line): INFO to ``train.log`` of the run, warnings to stderr."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(LOG_FORMAT.format(rank=rank))
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.INFO if verbose else logging.WARNING)
    err.setFormatter(fmt)
    root.addHandler(err)
    if run_dir is not None and run_dir.is_dir():
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)
    root.setLevel(logging.INFO)


def _rank_entry(rank: int, world: int, fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> Any:
    """Inside a spawned rank: the default group is up; build the mesh and run ``fn``."""
    import torch
    import torch.distributed as dist

    from pipeoffload.train.mesh import build_context

    run_dir = Path(cfg.run.out) if cfg.run.out else None
    setup_logging(rank, run_dir, verbose)
    torch.manual_seed(cfg.run.seed)
    device = torch.device("cpu")
    if _cuda() and (dist.get_backend() == "nccl" or world == 1):  # one GPU per local rank
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    ctx = build_context(cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, device)
    return fn(ctx, cfg, *args)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def run_ranks(fn: RankFn, cfg: TrainConfig, args: tuple = (), *, verbose: bool = False) -> list[Any]:
    """Run ``fn(ctx, cfg, *args)`` on every rank; returns what each rank returned (under torchrun: this
    rank's only). Raises ``RankFailure`` with the first error of any rank."""
    if under_torchrun():
        return [_torchrun(fn, cfg, args, verbose)]
    if cfg.world > 1:
        return _spawned(fn, cfg, args, verbose)
    return [_single(fn, cfg, args, verbose)]


class RankFailure(RuntimeError):
    """A rank failed; ``config`` when its error was a ``ConfigError`` (the user's input: exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.config = "ConfigError:" in message


def _single(fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> Any:
    import torch
    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="pipeoffload-") as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=cfg.run.timeout))
        try:
            return _rank_entry(0, 1, fn, cfg, args, verbose)
        finally:
            dist.destroy_process_group()
            del torch


def _torchrun(fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> Any:
    import torch
    import torch.distributed as dist

    from pipeoffload.runtime.launch import init_from_env
    from pipeoffload.train.mesh import build_context

    rank, world, device = init_from_env(timeout=cfg.run.timeout)
    try:
        run_dir = Path(cfg.run.out) if cfg.run.out else None
        setup_logging(rank, run_dir, verbose)
        torch.manual_seed(cfg.run.seed)
        ctx = build_context(cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, device)
        return fn(ctx, cfg, *args)
    finally:
        dist.destroy_process_group()


def _spawned(fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> list[Any]:
    from pipeoffload.runtime.launch import spawn

    def forward(signum: int, _frame: Any) -> None:  # the ranks save and exit; we wait for them
        for child in mp.active_children():
            if child.pid:
                os.kill(child.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = spawn(_rank_entry, cfg.world, (fn, cfg, args, verbose), timeout=cfg.run.timeout,
                       deadline=10 * 365 * 86400.0, backend="nccl" if _cuda() else "gloo")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if not result.ok:
        raise RankFailure(_first_error(result.errors, result.exitcodes))
    return result.results


def _first_error(errors: list[str | None], codes: list[int | None]) -> str:
    """The most informative failure: a rank's own error before peers' consequences."""
    found = [(r, e) for r, e in enumerate(errors) if e]
    if not found:
        return f"ranks exited with codes {codes}"
    for r, e in found:  # a ConfigError anywhere is the user's problem: say it
        if e.startswith("ConfigError"):
            return f"rank {r}: {e.splitlines()[0]}"
    r, e = found[0]
    return f"rank {r}: {e.splitlines()[0]}"
