"""Test-side fault injection for a real ``pipeoffload train`` (launcher and spawned ranks alike).

With this folder on ``PYTHONPATH`` every Python process of the run imports this module at start-up
(``sitecustomize``); with ``PIPEOFFLOAD_TEST_FAULT=target:rank:kind[:step]`` set, the named function
of the project is wrapped as its module is imported, and the fault strikes in process ``rank`` (its
``RANK``; ``-1``: the launcher, or a one-process run) at the wrapped function's first call of
training step ``step`` or later (default: its first call). Nothing happens without the variable;
several faults are separated by commas.

kinds: ``raise`` (RuntimeError), ``eio`` (OSError EIO), ``enospc`` (OSError ENOSPC), ``exit``
(``os._exit(3)``), ``exit0`` (``os._exit(0)``), ``kill`` (SIGKILL itself), ``term`` (SIGTERM itself,
then go on), ``nan`` (the call's tensor result times NaN), ``hang`` (sleep for ever), ``sleepS``
(sleep S seconds, then go on: a slow start-up or step)."""
from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from typing import Any

# target: (module, dotted attribute)
TARGETS = {
    "init": ("torch.distributed", "init_process_group"),  # start-up: joining the default process group
    "mesh": ("pipeoffload.train.mesh", "build_context"),  # start-up: the device mesh
    "prepare": ("pipeoffload.train.data", "prepare"),  # the launcher: tokenizing --data
    "corpus": ("pipeoffload.train.data", "load_corpus"),  # a rank loading the data
    "batch": ("pipeoffload.train.job", "TokenBatches.train"),  # a step's batch
    "forward": ("pipeoffload.runtime.executor", "PipelineRunner._forward"),
    "backward": ("pipeoffload.runtime.executor", "PipelineRunner._backward"),
    "backward_input": ("pipeoffload.runtime.executor", "PipelineRunner._backward_input"),
    "offload": ("pipeoffload.runtime.executor", "PipelineRunner._offload"),
    "reload": ("pipeoffload.runtime.executor", "PipelineRunner._reload"),
    "recompute": ("pipeoffload.runtime.executor", "PipelineRunner._recompute"),
    "loss": ("pipeoffload.models.gpt", "lm_loss"),
    "reduce": ("pipeoffload.train.optim", "OverlappedAverage.wait"),  # --dp: the gradients' all-reduce
    "fsdp": ("pipeoffload.train.fsdp", "ShardedStages.finish"),  # --fsdp: the reduce-scatter
    "optim": ("pipeoffload.train.loop", "clip_gradients"),  # just before the optimizer step
    "metrics": ("pipeoffload.train.metrics", "append_whole"),  # metrics.jsonl's write
    "eval": ("pipeoffload.runtime.executor", "PipelineRunner.evaluate"),
    "save": ("pipeoffload.train.checkpoint", "start_save"),
    "rng_write": ("pipeoffload.train.checkpoint", "_rng_bytes"),
    "dcp_write": ("torch.distributed.checkpoint.filesystem", "_write_files_from_queue"),
    "finish_save": ("pipeoffload.train.checkpoint", "PendingSave._finish"),
    "load": ("pipeoffload.train.checkpoint", "load"),
    "shutdown": ("pipeoffload.runtime.executor", "PipelineRunner.close"),
    "export": ("safetensors.torch", "save_file"),  # export: a shard of the --hf folder
    "rank_setup": ("pipeoffload.runtime.launch", "_faults_to_file"),  # a spawned rank, before it joins the group
}
# the training step being run, for ``step``: set by the wrapped Trainer.train_step
_STEP = {"now": 0}


def _specs() -> list[tuple[str, int, str, int]]:
    raw = os.environ.get("PIPEOFFLOAD_TEST_FAULT", "")
    specs = []
    for one in filter(None, raw.split(",")):
        parts = one.split(":")
        specs.append((parts[0], int(parts[1]), parts[2], int(parts[3]) if len(parts) > 3 else 0))
    return specs


def _strike(kind: str) -> None:
    if kind == "raise":
        raise RuntimeError("injected fault")
    if kind == "eio":
        raise OSError(errno.EIO, "Input/output error (injected)")
    if kind == "enospc":
        raise OSError(errno.ENOSPC, "No space left on device (injected)")
    if kind == "exit":
        os._exit(3)
    if kind == "exit0":
        os._exit(0)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    if kind == "hang":
        while True:
            time.sleep(1)
    if kind.startswith("sleep"):
        time.sleep(float(kind[len("sleep"):]))


def _wrap(fn: Any, rank: int, kind: str, step: int) -> Any:
    done = [False]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        here = int(os.environ.get("RANK", "-1"))
        if not done[0] and here == rank and _STEP["now"] >= step:
            done[0] = True
            sys.stderr.write(f"[fault_site] rank {here}: {kind} at step {_STEP['now']} t={time.time():.3f}\n")
            sys.stderr.flush()
            if kind == "nan":  # a tensor, or a list of them (PipelineRunner.evaluate's losses)
                out = fn(*args, **kwargs)
                return [x * float("nan") for x in out] if isinstance(out, list) else out * float("nan")
            _strike(kind)
        return fn(*args, **kwargs)

    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapped


def _patch(module: Any, attr: str, rank: int, kind: str, step: int) -> None:
    owner_path, name = attr.rsplit(".", 1) if "." in attr else ("", attr)
    owner = module
    for part in filter(None, owner_path.split(".")):
        owner = getattr(owner, part)
    setattr(owner, name, _wrap(getattr(owner, name), rank, kind, step))


def _track_steps(module: Any) -> None:
    real = module.Trainer.train_step

    def train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        _STEP["now"] = self.step + 1
        return real(self, *args, **kwargs)

    module.Trainer.train_step = train_step


def _track_runner_steps(module: Any) -> None:
    """``PipelineRunner`` driven directly (no Trainer): its own count of steps, or the step it is told."""
    real = module.PipelineRunner.step

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        _STEP["now"] = kwargs.get("step") or _STEP["now"] + 1
        return real(self, *args, **kwargs)

    module.PipelineRunner.step = step


class _Hook(importlib.abc.MetaPathFinder):
    """Patches a module right after it is first executed."""

    def __init__(self, patches: dict[str, list[Any]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, todo = spec.loader, self.patches.pop(name)
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            for apply in todo:
                apply(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    specs = _specs()
    if not specs:
        return
    patches: dict[str, list[Any]] = {"pipeoffload.train.loop": [_track_steps],
                                     "pipeoffload.runtime.executor": [_track_runner_steps]}
    for target, rank, kind, step in specs:
        module, attr = TARGETS[target]
        patches.setdefault(module, []).append(
            lambda m, attr=attr, rank=rank, kind=kind, step=step: _patch(m, attr, rank, kind, step))
    sys.meta_path.insert(0, _Hook(patches))


_install()
