"""Checkpoints with ``torch.distributed.checkpoint`` (DCP), written atomically, verified before use.

Layout of ``RUN/checkpoints/step-000100/``: DCP's files (``.metadata`` and one ``*.distcp`` per
writing rank) holding ``model.<full name>``, ``optim.state.<full name>.<state>`` and
``optim.param_groups.<full name>.<option>`` (torch's ``get_state_dict``, optimizer flattened) under
the names the whole model has in one process (so DCP reshards them onto any layout, and one process
can load them; a checkpoint of the older ``optim.<full name>.<state>`` keys still loads), ``rng-rank<r>.pt`` (every random-number state of rank ``r``), ``trainer.json`` (step, layout)
and ``manifest.json`` (config fingerprint, step, sha256 of every other file, and the estimate the
free-space check before the save used). A checkpoint is written
to ``.tmp-step-000100/`` and renamed once the manifest is in place: a folder named ``step-*`` is
always complete; a leftover ``.tmp-*`` is an interrupted write and is removed at the next save.
The data position is the step number (see ``data``); the LR schedule is a function of the step.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import FULL_BELOW, no_space_text, write_atomic
from pipeoffload.train.config import (
    FINGERPRINT_KEYS,
    LAYOUT_KEYS,
    TrainConfig,
    continue_with,
    default_of,
    fingerprint,
    fingerprint_hash,
    layout,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# files of the run folder the ranks read on resume (the BPE or the model's tokenizer, an hf:DIR model's
# config): their sha256 is in every manifest (``run_files``), so an edited or corrupted one is refused
RUN_FILES = ("tokenizer.json", "hf_config.json")


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- pure checks (run in the launcher, before any rank starts) ---------------------------------------
def checkpoint_step(path: Path) -> int | None:
    """The step of a ``step-N`` folder name (``None`` for any other name)."""
    digits = path.name[len("step-"):] if path.name.startswith("step-") else ""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``step-N`` folders, oldest first by their step number (not by name: past step 999,999
    ``step-1000000`` sorts before ``step-999999`` as text, as the 6-digit padding runs out)."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(step, p) for p in folder.iterdir() if p.is_dir() and (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


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
                          f"checkpoint; {_fallback(path)}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"checkpoint {str(path)!r}: {MANIFEST} is corrupted ({err}); {_fallback(path)}") from None
    files = _check_manifest(manifest, path)
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise ConfigError(f"checkpoint {str(path)!r}: file {name} is missing; the checkpoint is incomplete; "
                              f"{_fallback(path)}")
        if _sha256(f) != digest:
            raise ConfigError(f"checkpoint {str(path)!r}: file {name} does not match its checksum (corrupted or "
                              f"truncated); {_fallback(path)}")
    run_dir = path.parent.parent
    for name, digest in _run_files(manifest, path).items():
        f = run_dir / name
        if f.is_file() and _sha256(f) != digest:  # a deleted one is made again (a BPE: on the same text)
            raise ConfigError(f"{str(f)!r} does not match the checksum {MANIFEST} of {path.name} holds for it: it "
                              f"was edited or corrupted since that save; restore it, or delete it to have it made "
                              "again (a BPE is retrained on the same training text; an hf:DIR run copies the "
                              "folder's)")
    return manifest  # type: ignore[no-any-return]


def _fallback(path: Path) -> str:
    """What to do about the damaged checkpoint ``path``: resume from the one before it, where the run has one
    (else there is nothing to fall back on)."""
    step = checkpoint_step(path)
    earlier = [p for p in list_checkpoints(path.parent.parent) if step is not None and (checkpoint_step(p) or 0) < step]
    if earlier:
        return f"delete it to resume from the previous one ({earlier[-1].name})"
    return ("it is the run's only checkpoint, so there is none to fall back on: restore it from a copy, or delete it "
            "and start the run again")


def _run_files(manifest: dict[str, Any], path: Path) -> dict[str, str]:
    """The checksums of the run folder's files (``RUN_FILES``) a manifest holds; none in an older one."""
    found = manifest.get("run_files", {})
    if not isinstance(found, dict) or any(name not in RUN_FILES or not isinstance(digest, str)
                                          for name, digest in found.items()):
        raise ConfigError(f"checkpoint {str(path)!r}: {MANIFEST} is not a pipeoffload manifest (key 'run_files' is "
                          f"{found!r}); {_fallback(path)}")
    return found


def _check_manifest(manifest: Any, path: Path) -> dict[str, str]:
    """The structure ``save`` writes, and every file a checkpoint of ``world`` ranks must have listed
    (an edited manifest must not hide a deleted shard)."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"checkpoint {str(path)!r}: {MANIFEST} is not a pipeoffload manifest ({what}); "
                           f"{_fallback(path)}")

    if not isinstance(manifest, dict):
        raise bad(f"a JSON {type(manifest).__name__}, not an object")
    for key, kind in (("step", int), ("world", int), ("files", dict), ("fingerprint", dict)):
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(f"key {key!r} is {value!r}, not {'an integer' if kind is int else 'an object'}")
    if manifest["step"] < 0 or manifest["world"] < 1:
        raise bad(f"step={manifest['step']}, world={manifest['world']}")
    files = manifest["files"]
    for name, digest in files.items():
        if not isinstance(digest, str) or "/" in name or name in ("", ".", ".."):
            raise bad(f"files entry {name!r}: {digest!r}")
    world = manifest["world"]
    needed = [".metadata", "trainer.json"] + [f"__{r}_0.distcp" for r in range(world)]
    needed += [f"rng-rank{r}.pt" for r in range(world)]
    for name in needed:
        if name not in files:
            raise ConfigError(f"checkpoint {str(path)!r}: {MANIFEST} does not list {name}, which a checkpoint of "
                              f"{world} ranks has: edited or incomplete; {_fallback(path)}")
    return files


def check_compatible(manifest: dict[str, Any], cfg: TrainConfig, path: Path) -> None:
    """Refuse a checkpoint of another model or data order, naming the first difference; and one whose
    data (same path) holds other content now (``data.data_content``; not in an older manifest)."""
    saved = manifest.get("fingerprint", {})
    mine = fingerprint(cfg)
    for key in FINGERPRINT_KEYS:
        theirs = saved.get(key, default_of(key))  # a key newer than the checkpoint had its default then
        if key == "data" and theirs:  # an older run stored the path as given; now it is stored resolved
            theirs = str(Path(theirs).resolve())
        if theirs != mine[key]:
            raise ConfigError(
                f"checkpoint {str(path)!r} has {key}={theirs!r} but this run has {key}={mine[key]!r}; "
                f"only the layout ({', '.join(LAYOUT_KEYS)}), dtype and run options may change on resume"
            )
    theirs = saved.get(DATA_CONTENT)
    if isinstance(theirs, dict):
        now = _data_content(cfg).get(DATA_CONTENT)
        if now is not None and now != theirs:
            shown = cfg.data.path or "the standard library's sources (no --data)"
            raise ConfigError(
                f"data={shown!r}: its content changed since checkpoint {str(path)!r} was saved ({_described(theirs)} "
                f"then, {_described(now)} now): resuming would train on other text in another order; restore the "
                "data the run was trained on, or start a new run (--out) on this data")


DATA_CONTENT = "data_content"


def _data_content(cfg: TrainConfig) -> dict[str, Any]:
    """``{"data_content": ...}`` of the run's data (``data.data_content``); nothing for a model of your own
    (``train_model`` reads its batches, not ``data``) or data that cannot be read now (refused elsewhere)."""
    from pipeoffload.train.data import data_content

    if cfg.model.source == "own":
        return {}
    try:
        return {DATA_CONTENT: data_content(cfg.data.path)}
    except (OSError, ConfigError):
        return {}


def _described(content: dict[str, Any]) -> str:
    files = content.get("files")
    return (f"{files} file{'' if files == 1 else 's'}, {content.get('bytes')} bytes, sampled sha256 "
            f"{str(content.get('sha256'))[:12]}")


# ---- state dicts ------------------------------------------------------------------------------------
def holder(named: dict[str, Any]) -> Any:
    """A module whose parameters are this rank's, at their full single-process names (``named``'s
    keys): torch's state-dict API (``get_state_dict``) takes fully-qualified names from a module,
    and a pipeline rank holds only its stages (their own names are local: ``0.attn.weight``)."""
    from torch import nn

    root = nn.Module()
    for name, p in named.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]  # type: ignore[assignment]
        module.register_parameter(leaf, p)
    return root


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # flattened: every optimizer entry is keyed by its parameter's name (``state.<name>.exp_avg``,
    # ``param_groups.<name>.lr``), so a checkpoint reshards onto other pipeline layouts
    return StateDictOptions(flatten_optimizer_state_dict=True)


def train_state(named: dict[str, Any], opt: Any) -> dict[str, Any]:
    """``model.<name>`` and ``optim.state.<name>.<key>`` / ``optim.param_groups.<name>.<key>`` of this
    rank, from ``get_state_dict`` (which creates AdamW's state if no step made it yet)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from pipeoffload.train.optim import local_opt

    if not named:  # a rank of parameterless stages: nothing of its own (torch refuses an empty model)
        return {}
    model, optim = get_state_dict(holder(named), local_opt(opt), options=_options())
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"optim.{k}": v for k, v in optim.items()}}


def set_train_state(named: dict[str, Any], opt: Any, state: dict[str, Any]) -> None:
    """Put ``state`` (as ``train_state`` keys it, loaded by DCP) into the parameters and the optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from pipeoffload.train.optim import local_opt

    if not named:
        return
    model = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    optim = {k[len("optim."):]: v for k, v in state.items() if k.startswith("optim.")}
    set_state_dict(holder(named), local_opt(opt), model_state_dict=model, optim_state_dict=optim, options=_options())


def _old_keys(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` under the keys a checkpoint written before ``get_state_dict`` has (``optim.<name>.<key>``,
    no parameter groups: they keep this run's values), when ``path`` is one; else ``state``."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if any(k.startswith("optim.state.") for k in saved) or not any(k.startswith("optim.") for k in saved):
        return state
    out = {k: v for k, v in state.items() if k.startswith("model.")}
    out.update({"optim." + k[len("optim.state."):]: v for k, v in state.items() if k.startswith("optim.state.")})
    return out


def rng_state() -> dict[str, Any]:
    """Every random-number state of this process as tensors only (``torch.load(weights_only=True)``
    reads them back: a checkpoint folder cannot run code)."""
    import torch

    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy.key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "numpy.rest": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy.gauss": torch.tensor([gauss], dtype=torch.float64),
        "python.version": torch.tensor([version], dtype=torch.int64),
        "python.internal": torch.tensor(internal, dtype=torch.int64),
        "python.gauss": torch.tensor([0.0 if gauss_next is None else gauss_next, gauss_next is not None],
                                     dtype=torch.float64),
    }
    assert kind == "MT19937"
    if torch.cuda.is_available():
        for i, t in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda.{i}"] = t
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    rest = state["numpy.rest"].tolist()
    np.random.set_state(("MT19937", state["numpy.key"].numpy().astype(np.uint32), int(rest[0]), int(rest[1]),
                         float(state["numpy.gauss"][0])))
    gauss, has = state["python.gauss"].tolist()
    random.setstate((int(state["python.version"][0]), tuple(int(x) for x in state["python.internal"].tolist()),
                     gauss if has else None))
    cuda = [state[k] for k in sorted(k for k in state if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def load_rng(path: Path) -> dict[str, Any] | None:
    """The states saved in ``path``, read as plain tensors; ``None`` (with a warning) for a file of
    the old pickled format, which is not unpickled because that could run code."""
    import pickle

    import torch

    try:
        state: dict[str, Any] = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, TypeError) as err:
        log.warning("%s holds random-number states in the old pickled format, which is not loaded (it could run "
                    "code): they start from the seed (%s)", path, str(err).strip().splitlines()[0][:120])
        return None
    if not isinstance(state, dict) or "torch" not in state or "python.internal" not in state:
        log.warning("%s holds no random-number states of this format: they start from the seed", path)
        return None
    return state


# ---- save / load (collective: every rank calls) ----------------------------------------------------
class SaveError(RuntimeError):
    """A checkpoint could not be written (every rank raises it); the partial save was removed."""


_OK, _FAILED, _DISK_FULL = 0.0, 1.0, 2.0
# a save needs this times its estimate free, plus SLACK: file-system metadata (directory entries, extent
# maps) the estimate cannot see; the estimate itself counts every byte of every file (see ``written_bytes``)
MARGIN = 1.05
SLACK = 64 << 10
BLOCK = 4096  # each file's last block, counted whole (most file systems allocate 4 KiB blocks)
# bytes of ``.metadata`` an item may take beyond twice its name: its storage record, chunk and properties
# (measured: 115 to 160 at torch 2.13, on pp/dp/tp layouts)
METADATA_PER_ITEM = 320
SMALL_FILES = 16 << 10  # trainer.json and the manifest's fixed part (its fingerprint: about 1 KiB)
MANIFEST_PER_FILE = 160  # a manifest line: the file's name and its sha256


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else 0


def _tensor_overhead() -> int:
    """What ``torch.save`` adds to a tensor's bytes (DCP writes every tensor as one ``torch.save``: a zip of
    a pickle, records, a 64-byte-aligned data record), with room for longer shapes and zip64 fields."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(torch.zeros(64), buf)
    measured = len(buf.getvalue()) - 64 * 4  # 1,577 bytes at torch 2.13
    return measured + 256  # up to 63 bytes of alignment, a longer pickle for more dimensions, zip64 fields


def write_items(state: dict[str, Any]) -> dict[str, int]:
    """DCP's items of this rank's ``state`` (its ``DefaultSavePlanner``'s local plan), each keyed by its
    name and chunk offset (a replica has the same keys: DCP writes those once) with an upper bound of
    its bytes in the ``.distcp`` file and in ``.metadata``.

    Per item, not per tensor byte: a small tensor (a bias, an optimizer's ``step``) takes about 1.5 KiB
    of ``torch.save`` framing, and every optimizer option (``param_groups.<name>.lr``, 11 a parameter)
    is a pickled object of about 1.3 KiB, so a small model's checkpoint is some 40 % larger than its
    tensors."""
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    if not state:
        return {}
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=False)
    overhead = _tensor_overhead()
    pickled: dict[tuple[type, str], int] = {}  # the options repeat: each value is pickled once
    items: dict[str, int] = {}
    for item in planner.create_local_plan().items:
        fqn = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            value = planner.lookup_object(item.index)
            key = (type(value), repr(value))
            if key not in pickled:
                pickled[key] = len(planner.transform_object(item, value).getbuffer())  # type: ignore[union-attr]
            size = pickled[key]
        else:
            assert item.tensor_data is not None
            numel = 1
            for n in item.tensor_data.chunk.sizes:
                numel *= int(n)
            itemsize = item.tensor_data.properties.dtype.itemsize
            size = numel * itemsize + overhead
        offset = tuple(item.index.offset) if item.index.offset is not None else ()
        items[f"{fqn}@{offset}"] = size + 2 * len(fqn.encode()) + METADATA_PER_ITEM
    return items


def written_bytes(per_rank: list[tuple[dict[str, int], int]]) -> int:
    """An upper bound of the bytes of a checkpoint whose ranks hold ``(write_items, rng bytes)`` each: DCP's
    items, a replicated one once; every rank's random-number states; ``trainer.json`` and the manifest;
    and each file's last block whole."""
    unique: dict[str, int] = {}
    for items, _ in per_rank:
        for key, size in items.items():
            unique[key] = max(size, unique.get(key, 0))
    world = len(per_rank)
    files = 2 * world + 3  # a .distcp and an rng-rank file each; .metadata, trainer.json, manifest.json
    return (sum(unique.values()) + sum(rng for _, rng in per_rank) + SMALL_FILES + MANIFEST_PER_FILE * files
            + BLOCK * files)


def estimated_bytes(run_dir: Path, computed: int) -> int:
    """What the next save will take: ``computed`` (``written_bytes``), or the previous checkpoint's size
    where that is larger (the same state on the same layout writes the same bytes)."""
    found = list_checkpoints(run_dir)
    return max(computed, checkpoint_bytes(found[-1]) if found else 0)


def _checkpoint_exception() -> type[BaseException]:
    """DCP's ``CheckpointException``: a ``BaseException`` (not an ``Exception``) gathering the ranks' errors."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _failures(exc: BaseException) -> list[BaseException]:
    """The ranks' own errors a ``CheckpointException`` gathers (none for any other error)."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return []
    found = []
    for value in failures.values():
        inner = value[0] if isinstance(value, tuple) and value else value
        if isinstance(inner, BaseException):
            found.append(inner)
    return found


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps: DCP gathers the ranks' errors) is ENOSPC."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if any(_disk_full(inner) for inner in _failures(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    text = f"{exc} {getattr(exc, 'failures', '')!r}"
    return "No space left on device" in text or "Errno 28" in text


def _first_line(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``; of a ``CheckpointException``, of its first rank's error (its own
    first line only names the ranks)."""
    inner = _failures(exc)
    if inner:
        ranks = ", ".join(str(r) for r in getattr(exc, "failures", {}))
        return f"{_first_line(inner[0])} (rank {ranks})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _agree(code: float, device: Any) -> float:
    """The worst outcome over every rank (a collective: also a barrier)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([code], dtype=torch.float64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return float(flag[0])




def _no_room(where: Path) -> bool:
    """Whether the file system of ``where`` is (all but) full now."""
    for folder in (where, *where.parents):
        if folder.is_dir():
            return shutil.disk_usage(folder).free < FULL_BELOW
    return False


def _attempt(work: Any, where: Path) -> tuple[float, BaseException | None]:
    """Run ``work``, which writes under ``where``; its error, if any, as an outcome for ``_agree``: disk
    full when it is ENOSPC, or when the file system is full as it fails (``torch.save``, which DCP
    writes each item with, reports a short write as ``RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos``, not as ENOSPC). DCP's ``CheckpointException`` is a
    ``BaseException``: caught by name (a ``KeyboardInterrupt`` or ``SystemExit`` still propagates)."""
    try:
        work()
    except (Exception, _checkpoint_exception()) as exc:  # noqa: BLE001 - every rank learns of it through _agree
        return (_DISK_FULL if _disk_full(exc) or _no_room(where) else _FAILED), exc
    return _OK, None


def save(run_dir: Path, step: int, cfg: TrainConfig, named: dict[str, Any], opt: Any, rank: int, world: int,
         extra: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step`` atomically and keep the newest ``cfg.checkpoint.keep``.

    Free space is checked first (``estimated_bytes``); a save that fails on any rank (a full disk,
    above all) is removed on every rank's behalf, and every rank raises ``SaveError`` saying what
    happened: the last complete checkpoint stays as it was."""
    return start_save(run_dir, step, cfg, named, opt, rank, world, extra).wait()


def start_save(run_dir: Path, step: int, cfg: TrainConfig, named: dict[str, Any], opt: Any, rank: int, world: int,
               extra: dict[str, Any], background: Any = None) -> PendingSave:
    """``save`` up to the write of the shards; ``background``: a gloo process group of every rank on
    which ``dcp.async_save`` writes them in a thread, from a copy of the state taken now (else they
    are written before this returns). ``PendingSave.wait`` completes the checkpoint."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    final = step_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}"
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend()) else None
    state = train_state(named, opt)
    rng = _rng_bytes()
    estimate = _estimate(run_dir, state, len(rng), rank, world, device)
    need = int(MARGIN * estimate) + SLACK
    room: list[int] = []

    def make_folder() -> None:  # e.g. checkpoints/ replaced by a file, or removed with the run folder, mid-run
        final.parent.mkdir(parents=True, exist_ok=True)
        room.append(shutil.disk_usage(final.parent).free)

    code, exc = _attempt(make_folder, final.parent)
    free = room[0] if room else 0
    agreed = _agree(code if exc is not None else _DISK_FULL if free < need else _OK, device)
    if agreed == _DISK_FULL and exc is None:
        raise SaveError(_message(run_dir, step, True, need, free))
    _check(agreed, exc, run_dir, step, tmp, rank)

    def prepare() -> None:
        for stale in final.parent.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()

    code, exc = _attempt(prepare, tmp) if rank == 0 else (_OK, None)
    _check(_agree(code, device), exc, run_dir, step, tmp, rank)
    pending = PendingSave(run_dir, step, cfg, rank, world, extra, device, estimate)

    def write_rng() -> None:
        with open(tmp / f"rng-rank{rank}.pt", "wb") as fh:
            fh.write(rng)

    # agreed on before DCP's write: a rank failing alone here would otherwise leave its peers waiting in
    # DCP's collectives (and it in ``_agree``) until the timeout, each blaming the other
    code, exc = _attempt(write_rng, tmp)
    _check(_agree(code, device), exc, run_dir, step, tmp, rank)

    def write() -> None:
        if background is None:
            dcp.save(state, storage_writer=_writer(tmp))
        else:
            pending.future = dcp.async_save(state, storage_writer=_writer(tmp), process_group=background)

    code, exc = _attempt(write, tmp)
    _check(_agree(code, device), exc, run_dir, step, tmp, rank)
    return pending


def _writer(folder: Path) -> Any:
    """DCP's writer into ``folder``, which it never makes (rank 0 made it): a failed save removes the folder
    while a peer's background write may still be starting (its thread then waits in DCP's planning for a
    rank that never started its own), and DCP's writer would make the folder again as its first step,
    leaving a ``.tmp-*`` the failure said it had removed. Without the folder, that write fails instead."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class MadeAlready(FileSystem):
        def mkdir(self, path: Any) -> None:
            if not Path(path).is_dir():
                raise FileNotFoundError(errno.ENOENT, "the checkpoint's folder was removed", str(path))

    writer = FileSystemWriter(str(folder))
    writer.fs = MadeAlready()
    return writer


def _rng_bytes() -> bytes:
    """``rng-rank<r>.pt``'s content: this rank's random-number states, taken now."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    return buf.getvalue()


def _estimate(run_dir: Path, state: dict[str, Any], rng: int, rank: int, world: int, device: Any) -> int:
    """``estimated_bytes`` of the checkpoint (collective): rank 0 gathers every rank's ``write_items`` (to
    count a replicated item once, as DCP writes it) and the others learn the result."""
    import torch
    import torch.distributed as dist

    mine = (write_items(state), rng)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    computed = written_bytes(gathered) if gathered is not None else 0
    total = torch.tensor([float(estimated_bytes(run_dir, computed) if rank == 0 else 0)], dtype=torch.float64,
                         device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total[0])


class PendingSave:
    """A checkpoint whose files are written (or, with ``future``, being written in the background).
    ``wait`` (collective) waits for every rank's write, then rank 0 writes ``trainer.json`` and the
    manifest and renames the folder: until then it is a ``.tmp-*`` folder, which no resume reads and
    the next save removes, so a run stopped mid-write leaves no half checkpoint."""

    def __init__(self, run_dir: Path, step: int, cfg: TrainConfig, rank: int, world: int, extra: dict[str, Any],
                 device: Any, estimate: int = 0) -> None:
        self.run_dir, self.step, self.cfg, self.rank, self.world = run_dir, step, cfg, rank, world
        self.extra, self.device, self.estimate = extra, device, estimate
        self.final = step_dir(run_dir, step)
        self.tmp = self.final.parent / f".tmp-{self.final.name}"
        self.future: Any = None

    def wait(self) -> Path:
        if self.future is not None:
            code, exc = _attempt(self.future.result, self.tmp)
            _check(_agree(code, self.device), exc, self.run_dir, self.step, self.tmp, self.rank)
        code, exc = _attempt(self._finish, self.tmp) if self.rank == 0 else (_OK, None)
        _check(_agree(code, self.device), exc, self.run_dir, self.step, self.tmp, self.rank)
        if self.future is not None and self.rank == 0:
            log.info("saved checkpoint %s (written in the background)", self.final)
        return self.final

    def _finish(self) -> None:
        cfg, tmp, final = self.cfg, self.tmp, self.final
        shape = layout(cfg)
        write_atomic(tmp / "trainer.json", json.dumps({"step": self.step, "world": self.world, "layout": shape,
                                                       **self.extra}))
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {"step": self.step, "fingerprint": {**fingerprint(cfg), **_data_content(cfg)},
                    "fingerprint_hash": fingerprint_hash(cfg),
                    "layout": shape, "world": self.world, "files": files, "estimated_bytes": self.estimate,
                    "run_files": {name: _sha256(self.run_dir / name) for name in RUN_FILES
                                  if (self.run_dir / name).is_file()}}
        write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(self.run_dir)[:-cfg.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)


class Saver:
    """The run's saves: synchronous, or (``cfg.checkpoint.async_save``) written in the background
    while the next steps run, at most one at a time. Every rank calls ``save`` and ``wait`` at the
    same points (collectives); the writer thread's collectives use a gloo group of their own, so
    they never interleave with the training's on the same group."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.pending: PendingSave | None = None
        self._group: Any = None

    def save(self, run_dir: Path, step: int, named: dict[str, Any], opt: Any, rank: int, world: int,
             extra: dict[str, Any]) -> Path | None:
        """The checkpoint's folder once complete; ``None`` while it is written in the background."""
        self.wait()  # the previous background save completes (and is checked) before the next begins
        if not self.cfg.checkpoint.async_save:
            return save(run_dir, step, self.cfg, named, opt, rank, world, extra)
        if self._group is None:
            import datetime

            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.cfg.run.timeout))
        self.pending = start_save(run_dir, step, self.cfg, named, opt, rank, world, extra, background=self._group)
        return None

    def wait(self) -> Path | None:
        """Complete the background save, if one is in flight; its folder."""
        pending, self.pending = self.pending, None
        return pending.wait() if pending is not None else None


def _check(code: float, exc: BaseException | None, run_dir: Path, step: int, tmp: Path, rank: int) -> None:
    """After an agreement: on any failure, rank 0 removes the partial save and every rank raises."""
    if code == _OK:
        return
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    detail = f": {_failed_where(exc)}" if code != _DISK_FULL else ""
    free = shutil.disk_usage(run_dir).free if run_dir.is_dir() else 0
    raise SaveError(_message(run_dir, step, code == _DISK_FULL, None, free, detail)) from exc


def _failed_where(exc: BaseException | None) -> str:
    """The first failing rank and its error, known to every rank (a collective, on the failure path only:
    every rank reaches it after the same agreement), so that whichever rank's error the run's last line
    shows names where the save failed and why."""
    import torch.distributed as dist

    lines: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(lines, _first_line(exc) if exc is not None else None)
    failed = [(r, line) for r, line in enumerate(lines) if line is not None]
    if not failed:
        return "the error was not reported"
    also = f" (it failed on ranks {', '.join(str(r) for r, _ in failed[1:])} too)" if len(failed) > 1 else ""
    return f"on rank {failed[0][0]}, {failed[0][1]}{also}"


def sizes(a: int, b: int) -> tuple[str, str]:
    """``a`` and ``b`` bytes in MiB, with as many decimals as it takes (up to 3, then in bytes) for two
    different sizes to read differently ("needs 3.0 MiB and 3.0 MiB are free" said nothing)."""
    mib = 1 << 20
    for digits in (1, 2, 3):
        shown = f"{a / mib:.{digits}f} MiB", f"{b / mib:.{digits}f} MiB"
        if a == b or shown[0] != shown[1]:
            return shown
    return f"{a:,} bytes", f"{b:,} bytes"


def _message(run_dir: Path, step: int, disk_full: bool, need: int | None, free: int, detail: str = "") -> str:
    """One line: what failed (``detail``: where and why), the last complete checkpoint and the way on (the
    launcher adds its own way on only to a line without one: never twice)."""
    found = list_checkpoints(run_dir)
    if found:
        last, then = f"the last complete checkpoint is {found[-1].name}", f"continue with: {continue_with(run_dir)}"
    else:  # nothing to resume from: --resume would say "no checkpoint under ..."
        last = "no checkpoint was saved yet"
        then = f"start the run again (the same {_out_word(run_dir)} once space is freed, or another on a disk with room)"
    if disk_full:
        if need is not None:
            needed, left = sizes(need, free)
            what = (f"disk full: the checkpoint of step {step} needs about {needed} under {run_dir / 'checkpoints'} "
                    f"and {left} are free (nothing was written)")
        else:
            what = (no_space_text(f"saving the checkpoint of step {step} under {run_dir / 'checkpoints'}", free,
                                  removed=True) + "; the partial save was removed")
        return f"{what}; {last}; free some space, then {then}"
    return (f"saving the checkpoint of step {step} failed (the partial save was removed; {last}){detail}"
            + (f"; {then}" if found else ""))


def _out_word(run_dir: Path) -> str:
    """How the run's folder is given: ``out=`` for a run of ``train_model`` (its config.toml says so), else ``--out``."""
    return "out=" if continue_with(run_dir).startswith("train_model") else "--out"


def _peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or a rank's error DCP gathered in it) is a lost or silent peer (a closed connection,
    a timeout), which the training loop's ``collective`` reports as such, naming the ranks."""
    from pipeoffload.train.mesh import is_peer_error

    return is_peer_error(exc) or any(is_peer_error(inner) for inner in _failures(exc))


def load(path: Path, named: dict[str, Any], opt: Any, rank: int, world: int) -> dict[str, Any]:
    """Load into this rank's parameters and optimizer state (DCP reshards); returns ``trainer.json``."""
    import torch.distributed.checkpoint as dcp

    state = train_state(named, opt)
    try:
        dcp.load(_old_keys(path, state), checkpoint_id=str(path))  # the tensors of ``state``, filled in place
        set_train_state(named, opt, state)
    except (Exception, _checkpoint_exception()) as err:  # noqa: BLE001 - DCP's are long: the first line, what to do
        if _peer_lost(err):  # DCP's collectives lost a peer: not the checkpoint's fault, nor the user's input
            raise RuntimeError(f"loading checkpoint {path.name}: {_first_line(err)}") from err
        raise ConfigError(f"checkpoint {str(path)!r} cannot be loaded onto this layout: {_first_line(err)}") from err
    info: dict[str, Any] = json.loads((path / "trainer.json").read_text())
    rng_file = path / f"rng-rank{rank}.pt"
    if info.get("world") == world and rng_file.is_file():
        saved = load_rng(rng_file)
        if saved is not None:
            set_rng_state(saved)
    else:
        log.warning("checkpoint written by %s ranks, now %d: random-number states start from the seed",
                    info.get("world"), world)
    return info
