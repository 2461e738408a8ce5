"""Checkpoints with ``torch.distributed.checkpoint`` (DCP), written atomically, verified before use.

Layout of ``RUN/checkpoints/step-000100/``: DCP's files (``.metadata`` and one ``*.distcp`` per
writing rank) holding ``model.<full name>`` and ``optim.<full name>.<state>`` under the names the
whole model has in one process (so DCP reshards them onto any layout, and one process can load
them), ``rng-rank<r>.pt`` (every random-number state of rank ``r``), ``trainer.json`` (step, layout)
and ``manifest.json`` (config fingerprint, step, sha256 of every other file). A checkpoint is written
to ``.tmp-step-000100/`` and renamed once the manifest is in place: a folder named ``step-*`` is
always complete; a leftover ``.tmp-*`` is an interrupted write and is removed at the next save.
The data position is the step number (see ``data``); the LR schedule is a function of the step.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import write_atomic
from pipeoffload.train.config import (
    FINGERPRINT_KEYS,
    LAYOUT_KEYS,
    TrainConfig,
    default_of,
    fingerprint,
    fingerprint_hash,
    layout,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- pure checks (run in the launcher, before any rank starts) ---------------------------------------
def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step-"))


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"--resume {str(run_dir)!r}: no checkpoint under {run_dir / 'checkpoints'}; "
                          "train with --save-every first")
    return found[-1]


def verify(path: Path) -> dict[str, Any]:
    """The manifest of a complete, intact checkpoint; ``ConfigError`` naming the damage otherwise."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(f"checkpoint {str(path)!r} has no {MANIFEST}: incomplete or not a pipeoffload "
                          "checkpoint; delete it to resume from the previous one")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as err:
        raise ConfigError(f"checkpoint {str(path)!r}: {MANIFEST} is corrupted ({err})") from None
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise ConfigError(f"checkpoint {str(path)!r}: file {name} is missing; the checkpoint is incomplete")
        if _sha256(f) != digest:
            raise ConfigError(f"checkpoint {str(path)!r}: file {name} does not match its checksum (corrupted or "
                              "truncated); delete the checkpoint to resume from the previous one")
    return manifest  # type: ignore[no-any-return]


def check_compatible(manifest: dict[str, Any], cfg: TrainConfig, path: Path) -> None:
    """Refuse a checkpoint of another model or data order, naming the first difference."""
    saved = manifest.get("fingerprint", {})
    mine = fingerprint(cfg)
    for key in FINGERPRINT_KEYS:
        theirs = saved.get(key, default_of(key))  # a key newer than the checkpoint had its default then
        if key == "data" and theirs:  # an older run stored the path as given; now it is stored resolved
            theirs = str(Path(theirs).resolve())
        if theirs != mine[key]:
            raise ConfigError(
                f"checkpoint {str(path)!r} has {key}={theirs!r} but this run has {key}={mine[key]!r}; "
                f"only the layout ({', '.join(LAYOUT_KEYS)}) and run options may change on resume"
            )


# ---- state dicts ------------------------------------------------------------------------------------
def model_state(named: dict[str, Any]) -> dict[str, Any]:
    return {f"model.{n}": p.detach() for n, p in named.items()}


def optim_state(named: dict[str, Any], opt: Any) -> dict[str, Any]:
    from pipeoffload.train.optim import local_opt

    state = local_opt(opt).state
    out = {}
    for n, p in named.items():
        for key, value in state.get(p, {}).items():
            out[f"optim.{n}.{key}"] = value
    return out


def rng_state() -> dict[str, Any]:
    import torch

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- save / load (collective: every rank calls) ----------------------------------------------------
def save(run_dir: Path, step: int, cfg: TrainConfig, named: dict[str, Any], opt: Any, rank: int, world: int,
         extra: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step`` atomically and keep the newest ``cfg.checkpoint.keep``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    final = step_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}"
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    state = {**model_state(named), **optim_state(named, opt)}
    dcp.save(state, checkpoint_id=str(tmp))
    torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        shape = layout(cfg)
        write_atomic(tmp / "trainer.json", json.dumps({"step": step, "world": world, "layout": shape, **extra}))
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {"step": step, "fingerprint": fingerprint(cfg), "fingerprint_hash": fingerprint_hash(cfg),
                    "layout": shape, "world": world, "files": files}
        write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(run_dir)[:-cfg.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: Path, named: dict[str, Any], opt: Any, rank: int, world: int) -> dict[str, Any]:
    """Load into this rank's parameters and optimizer state (DCP reshards); returns ``trainer.json``."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = {**model_state(named), **optim_state(named, opt)}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as err:  # DCP's errors are long; keep the first line and say what to do
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"checkpoint {str(path)!r} cannot be loaded onto this layout: {first}") from err
    info: dict[str, Any] = json.loads((path / "trainer.json").read_text())
    rng_file = path / f"rng-rank{rank}.pt"
    if info.get("world") == world and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        log.warning("checkpoint written by %s ranks, now %d: random-number states start from the seed",
                    info.get("world"), world)
    return info
