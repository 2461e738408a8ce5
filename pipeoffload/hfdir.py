"""A local Hugging Face checkpoint directory, checked whole before any rank starts (no torch, no reads of weights).

``open_hf_dir(path)`` reads ``config.json`` (onto ``LlamaShape``), ``tokenizer.json`` and the
safetensors headers (``model.safetensors``, or the files named by ``model.safetensors.index.json``),
and refuses, with one line naming the file, field or tensor, anything a run could only discover
later: a field we cannot honour, a missing tensor, a wrong shape, a truncated file, a tensor the
config does not describe (it would be dropped), a tied config whose stored ``lm_head.weight`` differs
from the embedding (transformers would use it as the head). A safetensors header is 8 bytes of
length, a JSON table of ``name -> dtype, shape, data_offsets``, then the data; each entry must span
exactly shape x dtype bytes, the entries tile the data, and the file must end exactly where the table
says. Nothing is downloaded: a path that is not a local directory is refused.

Names: our layers are ``layers.<i>.<local name>`` (``Embed``, ``Block`` x L, ``Head``, see
``models.llama``); ``hf_rows`` maps them onto the Hugging Face names (``model.layers.<i-1>.<...>``) and, in
Phi-3's fused tensors, onto their rows (``qkv_proj``: q's, then k's, then v's; ``gate_up_proj``: gate's, then
up's); ``export_parts`` is the way back, each Hugging Face tensor the rows of our parameters in order.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import why_not_a_file
from pipeoffload.llama_config import LlamaShape, json_kind

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
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if shape.fused:  # in the order a refusal meets them: attention, then MLP
            out.update({p + FUSED_QKV: (q + 2 * kv, h), p + "self_attn.o_proj.weight": (h, q),
                        p + FUSED_GATE_UP: (2 * f, h), p + "mlp.down_proj.weight": (h, f)})
        else:
            out.update({
                p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f),
            })
        if shape.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        if shape.o_bias:
            out[p + "self_attn.o_proj.bias"] = (h,)
        if shape.mlp_bias:
            out.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,), p + "mlp.down_proj.bias": (h,)})
        if shape.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    if not shape.tie_embeddings:
        out["lm_head.weight"] = (v, h)
    return out


FUSED_QKV, FUSED_GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"


def fused_parts(shape: LlamaShape) -> dict[str, tuple[tuple[str, int], ...]]:
    """Phi-3's fused local names -> (our local name, its rows) in the order the rows are stacked (as
    transformers' Phi3 slices ``qkv_proj``'s output and chunks ``gate_up_proj``'s); empty for the others."""
    if not shape.fused:
        return {}
    q, kv, f = shape.heads * shape.dim_head, shape.n_kv_heads * shape.dim_head, shape.ffn
    return {FUSED_QKV: (("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv),
                        ("self_attn.v_proj.weight", kv)),
            FUSED_GATE_UP: (("mlp.gate_proj.weight", f), ("mlp.up_proj.weight", f))}


def _fused_rows(shape: LlamaShape) -> dict[str, tuple[str, int | None]]:
    """Our local name -> (the fused local name holding it, its first row there)."""
    out: dict[str, tuple[str, int | None]] = {}
    for fused, parts in fused_parts(shape).items():
        row = 0
        for local, rows in parts:
            out[local] = (fused, row)
            row += rows
    return out


def hf_rows(full: str, shape: LlamaShape) -> tuple[str, int | None]:
    """(Hugging Face name, first row in it) of our ``layers.<i>.<local>`` parameter: None (the whole tensor)
    but in Phi-3's fused tensors (the head of a tied model reads the embedding)."""
    _, i_text, local = full.split(".", 2)
    i = int(i_text)
    if i == 0:
        return "model.embed_tokens.weight", None
    if i == shape.layers + 1:
        if local == "lm_head.weight":
            return ("model.embed_tokens.weight" if shape.tie_embeddings else "lm_head.weight"), None
        return "model." + local, None
    fused, row = _fused_rows(shape).get(local, (local, None))
    return f"model.layers.{i - 1}.{fused}", row


def export_parts(shape: LlamaShape) -> dict[str, tuple[str, ...]]:
    """Hugging Face name -> our full names whose rows it stacks (one but in Phi-3's fused tensors), for every
    tensor an export writes."""
    names: dict[str, tuple[str, ...]] = {"model.embed_tokens.weight": ("layers.0.embed_tokens.weight",),
                                         "model.norm.weight": (f"layers.{shape.layers + 1}.norm.weight",)}
    fused = fused_parts(shape)
    for name in expected_tensors(shape):
        if name.startswith("model.layers."):
            _, _, i, local = name.split(".", 3)
            names[name] = tuple(f"layers.{int(i) + 1}.{part}" for part, _ in fused.get(local, ((local, 0),)))
    if not shape.tie_embeddings:
        names["lm_head.weight"] = (f"layers.{shape.layers + 1}.lm_head.weight",)
    return names


def read_header(path: Path) -> dict[str, Any]:
    """The tensor table of a safetensors file, checked as safetensors checks it on load: every entry has a
    dtype, a shape and ``data_offsets`` spanning exactly shape x dtype bytes, the entries tile the data
    without gaps or overlaps, and the file ends where the last one does. The offsets of the returned
    entries count from the start of the data (``data_start(path, table)`` bytes into the file)."""
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
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: not a safetensors file (its header is not a table of tensors); re-copy the "
                          "checkpoint")
    table.pop("__metadata__", None)
    end = 0
    for name, begin, stop in sorted(_spans(path, table), key=lambda span: span[1]):
        if begin != end:
            raise ConfigError(f"{path}: tensor {name} starts at data byte {begin} where the one before it ends at "
                              f"{end}: the header's data_offsets overlaps or leaves a gap; re-copy the checkpoint")
        end = stop
    if 8 + n + end != size:
        raise ConfigError(f"{path}: truncated or padded safetensors file: its table needs {8 + n + end} bytes, "
                          f"the file has {size}; re-copy the checkpoint")
    return table


# bytes per element of each safetensors dtype (sub-byte float types are left unchecked)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _spans(path: Path, table: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, begin, end) of every entry of a header, each checked to be well formed."""
    spans = []
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: header entry {name} is a {type(entry).__name__}, not an object (dtype, "
                              "shape, data_offsets); re-copy the checkpoint")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise ConfigError(f"{path}: header entry {name} has no {key}; re-copy the checkpoint")
        shape, offsets, dtype = entry["shape"], entry["data_offsets"], entry["dtype"]
        if not isinstance(shape, list) or not all(_count(d) for d in shape):
            raise ConfigError(f"{path}: tensor {name}: shape {shape!r} is not a list of sizes >= 0; "
                              "re-copy the checkpoint")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            raise ConfigError(f"{path}: tensor {name}: data_offsets {offsets!r} is not [begin, end] with "
                              "0 <= begin <= end; re-copy the checkpoint")
        if not isinstance(dtype, str):
            raise ConfigError(f"{path}: tensor {name}: dtype {dtype!r} is not a dtype name; re-copy the checkpoint")
        width = _DTYPE_BYTES.get(dtype)
        if width is not None:
            need = width * math.prod(shape)
            if offsets[1] - offsets[0] != need:
                raise ConfigError(f"{path}: tensor {name}: data_offsets span {offsets[1] - offsets[0]} bytes; "
                                  f"shape {shape} of {dtype} needs {need}: the header does not match the data "
                                  "(edited?); re-copy the checkpoint")
        spans.append((name, offsets[0], offsets[1]))
    return spans


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _weight_files(path: Path) -> dict[str, str]:
    index = path / INDEX
    if index.is_file():
        try:
            data = json.loads(index.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"{index}: not a safetensors index ({err})") from None
        if not isinstance(data, dict) or "weight_map" not in data:
            raise ConfigError(f"{index}: not a safetensors index (no weight_map); re-copy the checkpoint")
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{index}: weight_map={weight_map!r} is not an object of tensor name -> file name; "
                              "re-copy the checkpoint")
        for name, fname in weight_map.items():
            if not isinstance(fname, str) or not fname:
                raise ConfigError(f"{index}: weight_map gives {name} the file {fname!r}, not a file name; "
                                  "re-copy the checkpoint")
        return dict(weight_map)
    if (path / SINGLE).is_file():
        return {name: SINGLE for name in read_header(path / SINGLE)}
    raise ConfigError(f"hf:{path}: neither {SINGLE} nor {INDEX}; only safetensors checkpoints are read "
                      "(convert .bin weights with transformers' save_pretrained)")


def open_hf_dir(path: str | Path, *, check_tokenizer: bool = True, compare_tied_head: bool = True) -> HFDir:
    """The checked directory; ``ConfigError`` naming the first problem. ``compare_tied_head``: read the
    bytes of a tied config's stored ``lm_head.weight`` and of the embedding to compare them (ranks pass
    False: the launcher did it)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(f"hf:{root}: no such local directory (models are never downloaded; save one with "
                          "transformers' save_pretrained and pass its folder)")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"hf:{root}: config.json {'is missing' if not cfg_path.exists() else why_not_a_file(cfg_path)}")
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
    _refuse_undescribed(root, shape, files)
    if shape.tie_embeddings and TIED_HEAD in files and compare_tied_head:
        _refuse_own_head(root, files)
    if check_tokenizer:
        check_tokenizer_file(root / "tokenizer.json", shape.vocab)
    return HFDir(root, shape, files)


TIED_HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"
SHOWN = 3  # undescribed tensors named in the refusal


def _refuse_undescribed(root: Path, shape: LlamaShape, files: dict[str, str]) -> None:
    """Tensors the config does not describe (an ``o_proj.bias``, a layer past ``num_hidden_layers``) would be
    dropped silently; old checkpoints' ``rotary_emb.inv_freq`` buffers are ignored, as transformers does,
    and a tied config's ``lm_head.weight`` is compared with the embedding instead."""
    known = expected_tensors(shape)
    extra = [name for name in files if name not in known and not name.endswith("rotary_emb.inv_freq")
             and not (shape.tie_embeddings and name == TIED_HEAD)]
    if extra:
        more = f" and {len(extra) - SHOWN} more" if len(extra) > SHOWN else ""
        plural = "tensor" if len(extra) == 1 else "tensors"
        raise ConfigError(f"hf:{root}: the checkpoint holds {len(extra)} {plural} config.json does not describe: "
                          f"{', '.join(extra[:SHOWN])}{more} ({shape.architecture}, num_hidden_layers="
                          f"{shape.layers}); they would be dropped: fix config.json or use the matching checkpoint")


def _refuse_own_head(root: Path, files: dict[str, str]) -> None:
    """A tied config (``tie_word_embeddings: true``) whose checkpoint also stores an ``lm_head.weight``:
    accepted when its bytes equal the embedding's (as many tied checkpoints store it); a different one is
    what transformers keeps as its head, while the tied model here would read the embedding."""
    (head_file, head), (emb_file, emb) = (_entry(root, files, n) for n in (TIED_HEAD, EMBEDDING))
    if (head["dtype"], head["shape"]) != (emb["dtype"], emb["shape"]) or \
            not _same_bytes(root / head_file, head, root / emb_file, emb):
        raise ConfigError(f"hf:{root}: config.json says tie_word_embeddings=true but the checkpoint's "
                          f"{TIED_HEAD} differs from {EMBEDDING} (transformers would use it as the head, this "
                          f"model the embedding): set tie_word_embeddings to false in config.json to train it "
                          f"as its own head, or drop {TIED_HEAD} to tie it")


def _entry(root: Path, files: dict[str, str], name: str) -> tuple[str, dict[str, Any]]:
    entry: dict[str, Any] = read_header(root / files[name])[name]
    return files[name], entry


def data_start(path: Path) -> int:
    """Where a safetensors file's data begins (after the 8-byte length and the header)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    return 8 + int(n)


def _same_bytes(a_path: Path, a: dict[str, Any], b_path: Path, b: dict[str, Any], chunk: int = 1 << 24) -> bool:
    """The data of entry ``a`` equals that of ``b``, read in chunks and stopped at the first difference."""
    (a0, a1), (b0, _) = a["data_offsets"], b["data_offsets"]
    with open(a_path, "rb") as fa, open(b_path, "rb") as fb:
        fa.seek(data_start(a_path) + a0)
        fb.seek(data_start(b_path) + b0)
        left = a1 - a0
        while left:
            n = min(chunk, left)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


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


def eos_ids(shape: LlamaShape) -> tuple[int, ...]:
    """Every end-of-sequence id of config.json (``eos_token_id``: one or a list, as Llama 3.1 Instruct's
    end-of-text, end-of-message and end-of-turn ids): generation stops at any, as transformers' does."""
    eos = shape.eos_token_id
    return tuple(int(e) for e in eos) if isinstance(eos, list) else () if eos is None else (int(eos),)


GENERATION_CONFIG = "generation_config.json"


def stop_ids(shape: LlamaShape, generation_config: Path) -> tuple[int, ...]:
    """The ids generation stops at, read as transformers' generate reads them: a folder's
    ``generation_config.json`` replaces config.json's (Llama 3 Instruct's adds its end-of-turn id there), so
    where that file exists its ``eos_token_id`` alone counts (none, null or ``[]``: generation runs to its
    length); without the file, config.json's (``eos_ids``). One id or a list, nested lists flattened (transformers
    tests each new token against every id of the tensor the list makes); each a token id of the vocabulary.
    A file that is not a JSON object, which transformers cannot load, is refused."""
    if not generation_config.is_file():
        return eos_ids(shape)
    try:
        data = json.loads(generation_config.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{generation_config}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{generation_config}: holds a JSON {json_kind(data)}, not an object of generation "
                          "fields (eos_token_id, ...), which transformers cannot load either; fix it or delete the file")
    eos = data.get("eos_token_id")
    found = ((), []) if eos is None else _nested_ids(eos)
    if found is None or not all(0 <= i < shape.vocab for i in found[1]):
        raise ConfigError(f"{generation_config}: eos_token_id={eos!r} is not a token id (or a list of them) of "
                          f"vocab_size={shape.vocab}; fix it or delete the file")
    return tuple(found[1])


def _nested_ids(value: Any) -> tuple[tuple[int, ...], list[int]] | None:
    """(shape, ids in order) of one integer or of lists of them nested evenly, as ``torch.tensor`` takes an
    ``eos_token_id`` (a ragged list fails there); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (), [value]
    if not isinstance(value, list):
        return None
    parts = [_nested_ids(v) for v in value]
    shapes = {p[0] if p is not None else None for p in parts}
    if None in shapes or len(shapes) > 1:
        return None
    inner = parts[0][0] if parts and parts[0] is not None else ()
    return (len(value), *inner), [i for p in parts if p is not None for i in p[1]]


def eos_id(shape: LlamaShape) -> int | None:
    """The first end-of-sequence id: the one ending every document of the data."""
    ids = eos_ids(shape)
    return ids[0] if ids else None
