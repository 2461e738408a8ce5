"""Hugging Face checkpoints in and out of our Llama layers (``safetensors``, per tensor).

``load_parameters`` fills a rank's parameters from a checked ``HFDir`` (``pipeoffload.hfdir``):
each parameter is read on its own with ``safe_open(...).get_slice``, and a tensor-parallel
parameter (a ``DTensor``) reads only its local shard, so no rank ever holds the whole model. Phi-3's fused
``qkv_proj`` and ``gate_up_proj`` are read as their q, k, v and gate, up rows (``hfdir.hf_rows``), each into
its own parameter (and shard), and written back stacked.
``save_hf`` writes a directory that transformers' ``from_pretrained`` loads: ``config.json``,
safetensors shards with ``model.safetensors.index.json``, the tokenizer; written into a temporary
folder beside the target and renamed into place once complete.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import check_new_folder
from pipeoffload.hfdir import INDEX, HFDir, export_parts, hf_rows
from pipeoffload.llama_config import LlamaShape
from pipeoffload.models.llama import llama_layers

log = logging.getLogger(__name__)
DEFAULT_SHARD_BYTES = 2 << 30


def _local_slices(param: torch.Tensor) -> tuple[slice, ...] | None:
    """The index of this rank's shard of a ``DTensor`` parameter in the full tensor (None: plain tensor)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _rows_from(index: tuple[slice, ...] | None, param: torch.Tensor, row: int | None) -> tuple[slice, ...] | None:
    """The index of ``param``'s part (its shard, ``index``, or all of it) in a tensor where its rows start at
    ``row`` (Phi-3's fused tensors; None: the tensor is the parameter's own); None: the whole tensor."""
    if row is None:
        return index
    whole = index if index is not None else tuple(slice(0, n) for n in param.shape)
    return (slice(whole[0].start + row, whole[0].stop + row), *whole[1:])


@torch.no_grad()
def load_parameters(hf: HFDir, named: Mapping[str, torch.Tensor]) -> None:
    """Copy every parameter of ``named`` (our full names ``layers.<i>.<local>``) from ``hf``."""
    from safetensors import safe_open

    by_file: dict[str, list[tuple[str, str, int | None, torch.Tensor]]] = {}
    for full, param in named.items():
        name, row = hf_rows(full, hf.shape)
        by_file.setdefault(hf.files[name], []).append((full, name, row, param))
    for fname, entries in by_file.items():
        with safe_open(str(hf.path / fname), framework="pt") as fh:
            for full, name, row, param in entries:
                shard = _local_slices(param)
                index = _rows_from(shard, param, row)
                part = fh.get_slice(name)
                value = part[index] if index is not None else part[:]
                target = param.to_local() if shard is not None else param  # type: ignore[attr-defined]
                if tuple(value.shape) != tuple(target.shape):
                    raise ConfigError(f"{hf.path / fname}: tensor {name} gives shape {tuple(value.shape)} for "
                                      f"{full}, which needs {tuple(target.shape)}")
                target.copy_(value.to(target.dtype))


def hf_model(hf: HFDir, device: torch.device | str = "cpu") -> nn.Module:
    """The whole model in one process (``model.layers``: a ``StageModule``), weights from ``hf``."""
    from pipeoffload.models.split import StageModule

    with torch.device("meta"):
        layers = llama_layers(hf.shape, init=False, tie=False)
    model = nn.Module()
    model.layers = StageModule(*layers)
    model.to_empty(device=device)
    load_parameters(hf, {f"layers.{n}": p for n, p in model.layers.named_parameters()})
    return model


def _shards(tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def _stacked(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One Hugging Face tensor of our parameters' rows (several: Phi-3's fused q/k/v and gate/up), fp32 on the CPU."""
    whole = [p.detach().to("cpu", torch.float32) for p in parts]
    return (whole[0] if len(whole) == 1 else torch.cat(whole)).contiguous()


def save_hf(out: str | Path, shape: LlamaShape, state: Mapping[str, torch.Tensor], tokenizer: Path | None,
            max_shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer_files: Sequence[Path] = ()) -> Path:
    """Write ``state`` (our full names) as a Hugging Face directory at ``out`` (refused if it exists).
    ``tokenizer_files``: copied in beside ``tokenizer.json`` under their own names (the source folder's
    ``tokenizer_config.json`` and ``special_tokens_map.json``, which name its special tokens)."""
    from safetensors.torch import save_file

    target = Path(out)
    what = f"--hf {str(target)!r}"
    check_new_folder(target, what)
    try:  # a folder of its own beside the target (never a fixed name: a user's .tmp-<name> is left alone)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    except OSError as err:  # a special or read-only file system that access() did not reveal
        raise ConfigError(f"{what}: cannot write in folder {str(target.parent)!r} ({err.strerror}); "
                          "choose another place") from None
    try:
        tensors = [(hf, _stacked([state[name] for name in ours])) for hf, ours in export_parts(shape).items()]
        shards = _shards(tensors, max_shard_bytes)
        weight_map: dict[str, str] = {}
        for k, shard in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
        (tmp / "config.json").write_text(json.dumps(shape.to_hf(), indent=1))
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / "tokenizer.json")
        for extra in tokenizer_files:
            shutil.copyfile(extra, tmp / extra.name)
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.iterdir():  # safetensors writes its shards 0600: every file as open() would make it
            path.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700, likewise
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote %s: %d tensors in %d shard(s)", target, len(tensors), len(shards))
    return target
