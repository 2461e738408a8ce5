"""A run's last checkpoint as a Hugging Face directory that transformers' ``from_pretrained`` loads.

The checkpoint is loaded in one process (``generate.load_run``), its parameters are renamed onto the
Hugging Face names and written by ``models.hf.save_hf`` (config.json, safetensors shards with
their index, the tokenizer), into a temporary folder renamed into place when complete. Only the
Llama family has a Hugging Face architecture; the reference GPT (learned positions, LayerNorm, GELU,
its own layout) has none, so its runs are refused. A byte-tokenizer run gets a ``tokenizer.json``
that maps each UTF-8 byte to its own id, as the byte tokenizer does.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from pipeoffload.errors import ConfigError

log = logging.getLogger(__name__)


def export_hf(run_dir: str | Path, out: str | Path) -> Path:
    from pipeoffload.models.hf import save_hf
    from pipeoffload.train.config import build_config, check_run_dir, load_saved
    from pipeoffload.train.family import kind, run_shape
    from pipeoffload.train.generate import load_run

    run, target = check_run_dir(run_dir), Path(out)
    source = build_config(load_saved(run)).model.source
    if kind(source) not in ("llama", "hf"):
        raise ConfigError(f"run {str(run)!r} trained model={source!r}, which has no Hugging Face architecture; "
                          "export takes runs of --model llama or hf:DIR")
    if target.exists():
        raise ConfigError(f"--hf {str(target)!r} already exists; pick a new folder (nothing is overwritten)")
    model, tokenizer, cfg = load_run(run)
    shape = run_shape(cfg.model, tokenizer.vocab_size, run)
    state = {name: p for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as tmp:
        tok = run / "tokenizer.json"
        if cfg.data.tokenizer == "byte":
            tok = Path(tmp) / "tokenizer.json"
            byte_tokenizer(tok)
        return save_hf(target, shape, state, tok, tokenizer_files=_tokenizer_files(source, run))


# what an export carries over from an hf:DIR source besides tokenizer.json: its special tokens (the
# end-of-text token among them), its chat template (transformers >= 4.47 saves it on its own, as
# .jinja) and its generation defaults (end-of-turn ids, sampling settings)
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")


def _tokenizer_files(source: str, run: Path | None = None) -> list[Path]:
    """The files of ``TOKENIZER_FILES`` of an ``hf:DIR`` source: the run's copy (generation_config.json, kept
    when the run started), else the folder's where it still holds them. Without them transformers' tokenizer
    of the export has no ``eos_token`` or chat template, and its ``generate`` no end-of-turn ids."""
    from pipeoffload.train.family import hf_path

    folder = hf_path(source)
    if folder is None:
        return []
    found = [run / name if run is not None and (run / name).is_file() else folder / name for name in TOKENIZER_FILES]
    return [path for path in found if path.is_file()]


def byte_tokenizer(path: Path) -> None:
    """A ``tokenizer.json`` equal to ``data.ByteTokenizer``: byte b is token b (GPT-2's byte-to-character
    alphabet, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes onto printable characters (the ByteLevel alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out
