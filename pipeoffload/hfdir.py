"""A local Hugging Face checkpoint directory, checked whole before any rank starts (no torch, no reads of weights).

``open_hf_dir(path)`` reads ``config.json`` (onto ``LlamaShape``), ``tokenizer.json`` and the
safetensors headers (``model.safetensors``, or the files named by ``model.safetensors.index.json``),
and refuses, with one line naming the file, field or tensor, anything a run could only discover
later: a field we cannot honour, a missing tensor, a wrong shape, a truncated file. A safetensors
header is 8 bytes of length, a JSON table of ``name -> dtype, shape, data_offsets``, then the data;
the file must end exactly where the table says. Nothing is downloaded: a path that is not a local
directory is refused.

Names: our layers are ``layers.<i>.<local name>`` (``Embed``, ``Block`` x L, ``Head``, see
``models.llama``); ``hf_name`` maps them onto the Hugging Face names (``model.layers.<i-1>.<...>``).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.llama_config import LlamaShape

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_DTYPES = {"F32", "BF16", "F16"}


@dataclass(frozen=True)
class HFDir:
    path: Path
    shape: LlamaShape
    files: dict[str, str]  # Hugging Face tensor name -> file name in ``path``

    @property
    def tokenizer(self) -> Path:
        return self.path / "tokenizer.json"

    def file_of(self, name: str) -> Path:
        return self.path / self.files[name]


def parse_source(source: str) -> Path | None:
    """The directory of an ``hf:DIR`` model source, else None."""
    return Path(source[3:]).expanduser() if source.startswith("hf:") else None


def expected_tensors(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of ``shape`` and its shape (``lm_head`` only when untied)."""
    h, d, f, v = shape.hidden, shape.dim_head, shape.ffn, shape.vocab
    q, kv = shape.heads * d, shape.n_kv_heads * d
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f),
        })
        if shape.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
    if not shape.tie_embeddings:
        out["lm_head.weight"] = (v, h)
    return out


def hf_name(full: str, shape: LlamaShape) -> str:
    """Hugging Face name of our ``layers.<i>.<local>`` parameter (the head of a tied model reads the embedding)."""
    _, i_text, local = full.split(".", 2)
    i = int(i_text)
    if i == 0:
        return "model.embed_tokens.weight"
    if i == shape.layers + 1:
        if local == "lm_head.weight":
            return "model.embed_tokens.weight" if shape.tie_embeddings else "lm_head.weight"
        return "model." + local
    return f"model.layers.{i - 1}.{local}"


def our_names(shape: LlamaShape) -> dict[str, str]:
    """Hugging Face name -> our full name, for every tensor an export writes."""
    names = {"model.embed_tokens.weight": "layers.0.embed_tokens.weight",
             "model.norm.weight": f"layers.{shape.layers + 1}.norm.weight"}
    for name in expected_tensors(shape):
        if name.startswith("model.layers."):
            _, _, i, local = name.split(".", 3)
            names[name] = f"layers.{int(i) + 1}.{local}"
    if not shape.tie_embeddings:
        names["lm_head.weight"] = f"layers.{shape.layers + 1}.lm_head.weight"
    return names


def read_header(path: Path) -> dict[str, Any]:
    """The tensor table of a safetensors file, checked to cover the file exactly."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path}: truncated safetensors file (no header); re-copy the checkpoint")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ConfigError(f"{path}: truncated safetensors file (header of {n} bytes in a {size}-byte file)")
            table: dict[str, Any] = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a readable safetensors file ({err})") from None
    table.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in table.values()), default=0)
    if 8 + n + end != size:
        raise ConfigError(f"{path}: truncated or padded safetensors file: its table needs {8 + n + end} bytes, "
                          f"the file has {size}; re-copy the checkpoint")
    return table


def _weight_files(path: Path) -> dict[str, str]:
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as err:
            raise ConfigError(f"{index}: not a safetensors index ({err})") from None
        return {str(k): str(v) for k, v in weight_map.items()}
    if (path / SINGLE).is_file():
        return {name: SINGLE for name in read_header(path / SINGLE)}
    raise ConfigError(f"hf:{path}: neither {SINGLE} nor {INDEX}; only safetensors checkpoints are read "
                      "(convert .bin weights with transformers' save_pretrained)")


def open_hf_dir(path: str | Path, *, check_tokenizer: bool = True) -> HFDir:
    """The checked directory; ``ConfigError`` naming the first problem."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(f"hf:{root}: no such local directory (models are never downloaded; save one with "
                          "transformers' save_pretrained and pass its folder)")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"hf:{root}: config.json is missing")
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as err:
        raise ConfigError(f"{cfg_path}: not valid JSON ({err})") from None
    shape = LlamaShape.from_hf(raw, str(cfg_path))
    files = _weight_files(root)
    headers: dict[str, dict[str, Any]] = {}
    for name, want in expected_tensors(shape).items():
        if name not in files:
            raise ConfigError(f"hf:{root}: tensor {name} is missing from the checkpoint")
        fname = files[name]
        if fname not in headers:
            if not (root / fname).is_file():
                raise ConfigError(f"hf:{root}: file {fname} (holding {name}) is missing")
            headers[fname] = read_header(root / fname)
        entry = headers[fname].get(name)
        if entry is None:
            raise ConfigError(f"{root / fname}: tensor {name} is missing (the index names this file)")
        if tuple(entry["shape"]) != want:
            raise ConfigError(f"{root / fname}: tensor {name} has shape {tuple(entry['shape'])}, config.json "
                              f"implies {want}")
        if entry["dtype"] not in _DTYPES:
            raise ConfigError(f"{root / fname}: tensor {name} has dtype {entry['dtype']}; supported: F32, BF16, F16")
    if check_tokenizer:
        check_tokenizer_file(root / "tokenizer.json", shape.vocab)
    return HFDir(root, shape, files)


def check_tokenizer_file(path: Path, vocab: int) -> None:
    if not path.is_file():
        raise ConfigError(f"hf:{path.parent}: tokenizer.json is missing (a fast tokenizer file is needed)")
    from tokenizers import Tokenizer

    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size()
    except Exception as err:  # noqa: BLE001 - the tokenizers package raises plain Exceptions
        raise ConfigError(f"{path}: not a readable tokenizer ({str(err).splitlines()[0]})") from None
    if size > vocab:
        raise ConfigError(f"{path}: the tokenizer has {size} tokens but config.json vocab_size={vocab}")


def eos_id(shape: LlamaShape) -> int | None:
    eos = shape.eos_token_id
    if isinstance(eos, list):
        return int(eos[0]) if eos else None
    return None if eos is None else int(eos)
