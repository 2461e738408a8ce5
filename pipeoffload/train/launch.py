"""Starting a training run: in this process, spawned local ranks, or under torchrun.

``run_ranks(fn, cfg)`` calls ``fn(ctx)`` on every rank with the process group and the device mesh
set up: under torchrun (``RANK``/``WORLD_SIZE`` in the environment) in this process, with
``cfg.parallel.nproc > 1`` in that many spawned processes (``pipeoffload.runtime.launch.spawn``: torch's
elastic agent; gloo on CPU), else in this process as a one-rank group. The launcher supervises spawned ranks
(see ``runtime.launch.spawn``) and names the rank that failed: once one fails by its own error or dies, the
others get ``SETTLE`` seconds to exit before they are killed, ``GRACE`` where the first to fail only lost a
peer (so that the rank it lost is seen to); a stopped rank is found by its peers' ``--timeout``.
SIGINT/SIGTERM are forwarded to the ranks, which finish their step, save and exit (or are killed
``--stop-grace`` seconds later: ``Interrupted``); ranks die with the launcher.

Two bounds on the waits between ranks: ``--startup-timeout`` bounds every wait before the first step
(joining the process group, here or under torchrun; a torchrun rank waiting for rank 0's run folder;
building the mesh; the collectives of loading the data, building the model and resuming a checkpoint),
``--timeout`` every wait from the first step on (``RankContext.started``, called by the trainer once every
rank has set up: the pipeline's messages, the gradient and metric all-reduces, evaluation, saves) and how
long the launcher tolerates a stopped rank (SIGSTOP), whenever it is stopped.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.runtime import GRACE, SETTLE  # the launchers' waits after a failure, shared
from pipeoffload.train.config import TrainConfig, continue_with

log = logging.getLogger(__name__)
RankFn = Callable[..., Any]
LOG_FORMAT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"
MESH = "building the device mesh (the dp, pp and tp process groups)"  # what a rank's error at start-up names


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


class _RunLog(logging.FileHandler):
    """``train.log``: a line that cannot be written (a full disk) is dropped, and the first such failure
    is said once on stderr, where logging's default prints a traceback for every line (a full disk gave
    about 150 of them before the run's own one-line error)."""

    def __init__(self, path: Path, rank: int, delay: bool = False) -> None:
        super().__init__(path, delay=delay)
        self.rank, self.failed = rank, False  # rank -1: the launcher

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self._dropped(sys.exc_info()[1])

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as err:
            self._dropped(err)

    def close(self) -> None:
        try:
            super().close()  # closing flushes what could not be written
        except OSError:
            pass

    def _dropped(self, err: BaseException | None) -> None:
        if not self.failed:
            self.failed = True
            who = f"rank {self.rank}" if self.rank >= 0 else "the launcher"
            sys.stderr.write(f"{who}: cannot write {self.baseFilename} ({err}); its lines are "
                             "dropped from here on\n")


def setup_logging(rank: int, run_dir: Path | None, verbose: bool = False) -> None:
    """Rank-tagged lines (the rank once per line): INFO to ``train.log`` of the run, warnings to stderr."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(LOG_FORMAT.format(rank=rank))
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.INFO if verbose else logging.WARNING)
    err.setFormatter(fmt)
    err.addFilter(lambda record: not getattr(record, "file_only", False))  # the launcher reports those
    root.addHandler(err)
    if run_dir is not None and run_dir.is_dir():
        fh = _RunLog(run_dir / "train.log", rank)
        fh.setFormatter(fmt)
        root.addHandler(fh)
    root.setLevel(logging.INFO)


def _rank_entry(rank: int, world: int, fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> Any:
    """Inside a spawned rank: the default group is up; build the mesh and run ``fn``."""
    import torch
    import torch.distributed as dist

    from pipeoffload.train.mesh import build_context, doing

    run_dir = Path(cfg.run.out) if cfg.run.out else None
    setup_logging(rank, run_dir, verbose)
    torch.manual_seed(cfg.run.seed)
    device = torch.device("cpu")
    if _cuda() and (dist.get_backend() == "nccl" or world == 1):  # one GPU per local rank
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    log.info("rank %d of %d: pid %d on %s", rank, world, os.getpid(), socket.gethostname())
    with doing(rank, MESH):
        ctx = build_context(cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, device, timeout=cfg.run.timeout,
                            startup=cfg.run.startup_timeout)
    try:
        with deterministic_kernels(cfg.run.deterministic):
            return fn(ctx, cfg, *args)
    except BaseException as exc:  # train.log keeps every rank's own error (the launcher shows one)
        log.error("%s: %s", type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                  extra={"file_only": True})
        raise
    finally:
        ctx.close()


@contextlib.contextmanager
def callers_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were before, once a rank run in the caller's process
    (one rank, a torchrun worker) is done, its own (``setup_logging``) closed: ``train_model`` in a
    notebook lost the notebook's handlers for good and left the run's ``train.log`` open."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            if handler not in saved:
                handler.close()
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """With ``enabled``, deterministic kernels for the duration (torch's flags restored after: a one-rank
    run shares the caller's process; ``CUBLAS_WORKSPACE_CONFIG`` stays set, as cuBLAS reads it only when
    it starts).

    CUDA's fused attention backward and cuBLAS's default workspace accumulate in an order that varies
    from run to run, so on a GPU two identical steps differ in the last bits; the math attention kernel
    and a fixed cuBLAS workspace make them agree. Entered before the rank's first CUDA work.
    """
    import torch

    if not enabled:
        yield
        return
    flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
             torch.backends.cuda.cudnn_sdp_enabled())
    setters = (torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.enable_mem_efficient_sdp,
               torch.backends.cuda.enable_cudnn_sdp)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    for set_flag in setters:
        set_flag(False)
    log.info("deterministic kernels: torch.use_deterministic_algorithms(True), math attention")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        for set_flag, flag in zip(setters, flags):
            set_flag(flag)


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


class Interrupted(RuntimeError):
    """The run was stopped by SIGINT/SIGTERM before its ranks could finish (e.g. during start-up)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


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
                                timeout=datetime.timedelta(seconds=cfg.run.startup_timeout))
        try:
            with callers_logging():
                return _rank_entry(0, 1, fn, cfg, args, verbose)
        except (ConfigError, Interrupted):  # Interrupted: the CLI's SIGTERM before the trainer took the signal
            raise
        except Exception as exc:  # reported like a spawned rank's failure: one line, no traceback
            text = str(exc).strip()
            raise RankFailure(f"rank 0: {type(exc).__name__}: {text.splitlines()[0] if text else ''}") from exc
        finally:
            dist.destroy_process_group()
            del torch


def _torchrun(fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> Any:
    import torch
    import torch.distributed as dist

    from pipeoffload.runtime.launch import init_from_env
    from pipeoffload.train.mesh import build_context, doing

    rank, world, device = init_from_env(timeout=cfg.run.startup_timeout)
    try:
        run_dir = Path(cfg.run.out) if cfg.run.out else None
        with callers_logging():
            setup_logging(rank, run_dir, verbose)
            torch.manual_seed(cfg.run.seed)
            with doing(rank, MESH):
                ctx = build_context(cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, device,
                                    timeout=cfg.run.timeout, startup=cfg.run.startup_timeout)
            try:
                with deterministic_kernels(cfg.run.deterministic):
                    return fn(ctx, cfg, *args)
            finally:
                ctx.close()
    finally:
        dist.destroy_process_group()


def _spawned(fn: RankFn, cfg: TrainConfig, args: tuple, verbose: bool) -> list[Any]:
    from pipeoffload.runtime.launch import spawn

    with _launcher_log(cfg):
        result = spawn(_rank_entry, cfg.world, (fn, cfg, args, verbose), timeout=cfg.run.timeout,
                       startup_timeout=cfg.run.startup_timeout, deadline=10 * 365 * 86400.0,
                       backend="nccl" if _cuda() else "gloo", grace=GRACE, forward_signals=True,
                       stop_grace=cfg.run.stop_grace, collect_faults=True, settle=SETTLE)
    logged = _log_faults(cfg, result.faults)
    if not result.ok:
        _remove_partial_saves(cfg)
    if result.ok and result.interrupted:
        # every rank returned although the run was signalled (it ended with the step that would have taken
        # the signal up): still an interrupted run, never a success
        for value in result.results:
            if isinstance(value, dict) and not value.get("interrupted"):
                value["interrupted"] = result.interrupted
    if result.ok:
        return result.results
    if result.interrupted:  # the ranks did not all report back (a second signal, a stuck rank): say what is saved
        message = interrupted_text(result.interrupted, cfg.run.out, started=True, forced=result.forced)
        _note_in_log(cfg, message, "run interrupted")
        raise Interrupted(result.interrupted, message)
    message = result.summary() + _fatal_signal_note(cfg, result, logged)
    failure = RankFailure(message)
    # a rank killed, stopped or failing: say what is saved and how to go on (not for the user's input, nor
    # for a run that diverged: resumed as it was, it would diverge again; nor twice, as a full disk says it)
    if not failure.config and "NonFiniteError:" not in message and "continue with:" not in message:
        hint = resume_hint(cfg.run.out)
        if hint:
            message = f"{message}; {hint}"
            failure = RankFailure(message)
    _note_in_log(cfg, message)
    raise failure


def _remove_partial_saves(cfg: TrainConfig) -> None:
    """A rank killed while a checkpoint was written (SIGKILL, ``os._exit``, a crash: no handler of its runs)
    left the save's ``.tmp-step-*`` folder, which only the run's next save would remove; every rank is gone
    now (``spawn`` returns after their exit) and the run folder is still locked, so the launcher removes it."""
    import shutil

    folder = Path(cfg.run.out) / "checkpoints" if cfg.run.out else None
    if folder is None or not folder.is_dir():
        return
    for partial in folder.glob(".tmp-*"):
        shutil.rmtree(partial, ignore_errors=True)


def _log_faults(cfg: TrainConfig, faults: dict[int, str]) -> Path | None:
    """The Python stacks of ranks that crashed (faulthandler's dumps: ``spawn(collect_faults=True)``),
    one rank after the other, into the run's ``train.log``; on stderr when the run has no folder. Returns
    the log they went to."""
    if not faults:
        return None
    text = "".join(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [launcher] ERROR rank {r} crashed; its Python stack "
                   f"(faulthandler):\n{dump.rstrip()}\n" for r, dump in sorted(faults.items()))
    path = Path(cfg.run.out) / "train.log" if cfg.run.out else None
    if path is not None and path.parent.is_dir():
        try:
            with open(path, "a") as fh:
                fh.write(text)
            return path
        except OSError:
            pass
    sys.stderr.write(text)
    return None


def _fatal_signal_note(cfg: TrainConfig, result: Any, logged: Path | None) -> str:
    """For a rank killed by a signal of a fatal error (SIGBUS, SIGSEGV, ...): the likely cause where the run
    gives one (SIGBUS reading a memory-mapped ``--data`` file that shrank), and where its Python stack is."""
    r = result.culprit
    code = result.exitcodes[r] if r is not None else None
    if r is None or code is None or code >= 0:
        return ""
    note = ""
    if -code == signal.SIGBUS and cfg.model.source != "own":
        from pipeoffload.train.data import memory_mapped

        if memory_mapped(cfg.data.path):
            note += (f": a memory-mapped --data file ({cfg.data.path}) changed or was truncated during the run; "
                     "do not modify it while training")
    if logged is not None and r in result.faults:
        note += f" (the rank's Python stack is in {logged})"
    return note


@contextlib.contextmanager
def _launcher_log(cfg: TrainConfig) -> Iterator[None]:
    """While the ranks run, the launcher's own warnings (``pipeoffload.runtime.launch``: a signal it
    ignored) go to the run's ``train.log`` too, tagged ``[launcher]``, beside the ranks' lines."""
    path = Path(cfg.run.out) / "train.log" if cfg.run.out else None
    if path is None or not path.parent.is_dir():
        yield
        return
    logger = logging.getLogger("pipeoffload.runtime.launch")
    handler = _RunLog(path, -1, delay=True)  # opened at its first line: train.log appears when the ranks start
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(LOG_FORMAT.replace("rank {rank}", "launcher")))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def interrupted_text(signum: int, out: str | None, *, started: bool, forced: int = 0) -> str:
    """What a run stopped by ``signum`` leaves: the last complete checkpoint in ``out`` (on disk, whether
    or not a rank got to report saving it) and how to continue, or that there is none. ``forced``: a
    second signal, which killed the ranks before they had finished their step and saved."""
    name = signal.Signals(signum).name
    head = f"interrupted ({name})"
    if forced:
        head += (f", then a second signal ({signal.Signals(forced).name}) killed the ranks at once, before they "
                 "had finished the step and saved")
    hint = resume_hint(out)
    if hint:
        return f"{head}; {hint}"
    if forced:
        return f"{head}; there is no checkpoint to resume from"
    when = "the ranks saved a checkpoint" if started else "the ranks started"
    return f"{head} before {when}; there is no checkpoint to resume from"


def resume_hint(out: str | None) -> str:
    """The run's way on, for the messages that end it: 'the last complete checkpoint is …; continue
    with: …' for the run in ``out`` (the checkpoints on disk, whether or not a rank got to report saving
    them), or '' when it has none."""
    from pipeoffload.train.checkpoint import list_checkpoints

    found = list_checkpoints(Path(out)) if out else []
    if not (out and found):
        return ""
    return f"the last complete checkpoint is {found[-1]}; continue with: {continue_with(out)}"


def _note_in_log(cfg: TrainConfig, message: str, what: str = "run failed") -> None:
    """The launcher's verdict as the last line of the run's ``train.log``."""
    path = Path(cfg.run.out) / "train.log" if cfg.run.out else None
    if path is None or not path.parent.is_dir():
        return
    try:
        with open(path, "a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [launcher] ERROR {what}: {message}\n")
    except OSError:
        pass
