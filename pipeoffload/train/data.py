"""Training text: where it comes from, how it becomes tokens, and which sequences each step reads.

Sources: a text file, a ``.jsonl`` file (one JSON object per line, its ``text`` field a document), a
folder of them (sorted, recursively), a pre-tokenized token file
(``.npy``: any integer dtype; ``.bin``: raw little-endian uint16 as written by nanoGPT-style
preprocessors), both memory-mapped. Without ``--data`` the standard library's own ``.py`` sources
(a sorted, size-capped subset) serve as real text present on every machine with Python.

The last ``val_fraction`` is held out for validation: of the tokens with the byte tokenizer or a
token file; of the text with a BPE, split before the BPE is trained on the training part only (so
the validation text cannot shape the vocabulary) and each part tokenized on its own. Training sequences are the
non-overlapping windows of ``seq_len + 1`` tokens of the rest, visited in an order drawn from
``seed`` (a new permutation per epoch). Step ``t`` reads the ``global_batch`` windows at positions
``t*global_batch ...`` of that stream and data-parallel replica ``r`` the ``r``-th slice of them,
so the data position is the step number alone (nothing else to checkpoint).

Documents (a file, a ``.jsonl`` line) are joined by a newline for the byte and BPE tokenizers; with a
model's own tokenizer (``hf``: an ``hf:DIR`` run) each document is encoded on its own and followed by
the model's end-of-sequence token, and the last ``val_fraction`` of the tokens is held out.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeoffload.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_TEXT_BYTES = 4_000_000  # stdlib sources read when no --data is given
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text", ".jsonl", "")
TOKEN_SUFFIXES = (".npy", ".bin")


SKIPPED_DIRS = frozenset({"test", "tests", "site-packages", "idlelib", "lib2to3"})


def default_text_files(limit_bytes: int = DEFAULT_TEXT_BYTES) -> list[Path]:
    """Sorted ``.py`` files of the standard library (no tests, no site-packages), up to ``limit_bytes``.

    The files of ``sorted(root.rglob("*.py"))`` less those under a ``SKIPPED_DIRS`` folder, in that order,
    found by a walk that visits each folder's entries sorted by name (the order of sorted paths), skips
    those folders without reading them and stops at the limit: each rank and every save reads this list,
    and the whole tree can hold tens of thousands of files (a Python's own site-packages)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0

    def walk(folder: Path) -> bool:  # False once the limit is reached
        nonlocal total
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return True
        for entry in entries:
            if entry.name.endswith(".py"):  # rglob's "*.py" matches any kind of entry
                path = folder / entry.name
                size = path.stat().st_size
                if total + size > limit_bytes:
                    return False
                chosen.append(path)
                total += size
            try:
                recurse = entry.is_dir() and not entry.is_symlink()  # as rglob: a linked folder is not entered
            except OSError:
                recurse = False
            if recurse and entry.name not in SKIPPED_DIRS and not walk(folder / entry.name):
                return False
        return True

    walk(root)
    if not chosen:
        raise ConfigError(f"no default text: no .py files under the standard library at {root}; pass --data")
    return chosen


def text_files(data: str) -> list[Path]:
    if not data:
        return default_text_files()
    path = Path(data)
    if path.is_file():
        return [path]
    try:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    except OSError as err:  # a sub-folder that cannot be listed (e.g. --data /proc)
        raise ConfigError(f"data={data!r}: {str(err.filename or path)!r} cannot be listed ({err.strerror}); give a "
                          "folder of text files you can read") from None
    if not files:
        raise ConfigError(f"data={data!r}: the folder has no text files ({', '.join(s or 'no suffix' for s in TEXT_SUFFIXES)})")
    return files


def read_documents(data: str) -> list[str]:
    """The documents of ``data``: each text file whole, each line of a ``.jsonl`` file its ``text``."""
    docs: list[str] = []
    for path in text_files(data):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.extend(jsonl_texts(path, text) if path.suffix == ".jsonl" else [text])
    return docs


def jsonl_texts(path: Path, text: str) -> list[str]:
    """The ``text`` field of every non-blank line; ``ConfigError`` naming the first bad line."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise ConfigError(f"{path}:{number}: not a JSON object ({err}); a .jsonl file holds one object per line") from None
        value = record.get("text") if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise ConfigError(f"{path}:{number}: no string field 'text' in this line; each line of a .jsonl file "
                              'must be an object like {"text": "..."}')
        out.append(value)
    return out


def read_text(data: str) -> str:
    return "\n".join(read_documents(data))


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(training text, validation tail): the last ``val_fraction`` of the characters is held out.
    Decided from the config alone, before any tokenizer exists, so the BPE never sees the tail."""
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


DIGEST_BLOCK = 1 << 16  # bytes of each sampled block
DIGEST_BLOCKS = 8  # blocks sampled per file, evenly spaced, the first and the last among them


def data_files(data: str) -> list[Path]:
    """The files ``data`` reads: the token file, or the text files."""
    return [Path(data)] if is_token_file(data) else text_files(data)


def data_content(data: str) -> dict[str, Any]:
    """A cheap fingerprint of what ``data`` holds: its files' count and bytes and a sha256 over their
    names, sizes and ``DIGEST_BLOCKS`` sampled blocks each (a whole small file). Stored in every
    checkpoint's manifest (computed at each save), so a resume refuses data changed under the same path."""
    files = data_files(data)
    root = Path(data) if data and Path(data).is_dir() else None
    h = hashlib.sha256()
    total = 0
    for path in files:
        size = path.stat().st_size
        total += size
        name = str(path.relative_to(root)) if root is not None else path.name
        h.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as fh:
            if size <= DIGEST_BLOCK * DIGEST_BLOCKS:
                h.update(fh.read())
                continue
            last = size - DIGEST_BLOCK
            for i in range(DIGEST_BLOCKS):
                fh.seek(last * i // (DIGEST_BLOCKS - 1))
                h.update(fh.read(DIGEST_BLOCK))
    return {"files": len(files), "bytes": total, "sha256": h.hexdigest()[:32]}


def is_token_file(data: str) -> bool:
    return bool(data) and Path(data).suffix in TOKEN_SUFFIXES and Path(data).is_file()


def memory_mapped(data: str) -> bool:
    """Whether a run reads ``data`` through a memory map (``load_token_file``): a rank then dies of SIGBUS
    when the file shrinks under it."""
    return bool(data) and Path(data).suffix in TOKEN_SUFFIXES


# ---- tokenizers -------------------------------------------------------------------------------------
class ByteTokenizer:
    """UTF-8 bytes; vocabulary 256."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """A tokenizer of the ``tokenizers`` package, stored as ``tokenizer.json`` in the run (a BPE trained
    there, or an ``hf:DIR`` model's, whose end-of-sequence id ``eos`` separates documents)."""

    def __init__(self, path: Path, eos: int | None = None) -> None:
        from tokenizers import Tokenizer

        self.inner = Tokenizer.from_file(str(path))
        self.vocab_size = self.inner.get_vocab_size()
        self.eos = eos

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)


Tokenizer = ByteTokenizer | BPETokenizer


def train_bpe(text: str, vocab_size: int, path: Path) -> None:
    """Train a byte-level BPE on ``text`` offline and save it to ``path`` (done once, before the ranks)."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ConfigError("tokenizer=bpe:N needs the 'tokenizers' package: pip install tokenizers") from None
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_pieces(text), trainer=trainer)
    tok.save(str(path))


def _pieces(text: str, size: int = 1 << 16) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def check_tokenizer_file(spec: str, data: str, run_dir: Path) -> None:
    """The run's ``tokenizer.json``, if there is one to use, is readable (checked in the launcher: in the
    ranks a damaged file fails with the ``tokenizers`` package's bare error)."""
    path = run_dir / "tokenizer.json"
    if spec == "byte" or is_token_file(data) or not path.is_file():
        return
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        return  # the run refuses it with its own message (data_facts)
    try:
        HFTokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the package raises a bare Exception for a bad file
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{str(path)!r}: not a readable tokenizer ({text}); the run's tokenizer={spec!r} is "
                          "read from it: restore it, or delete it to have it made again (a BPE is retrained on "
                          "the same training text; an hf:DIR run copies the folder's)") from None


def load_tokenizer(spec: str, run_dir: Path) -> Tokenizer:
    if spec == "byte":
        return ByteTokenizer()
    path = run_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"tokenizer={spec!r}: {path} is missing; it is written when the run starts")
    if spec == "hf":
        return BPETokenizer(path, _model_eos(run_dir))
    return BPETokenizer(path)


def _model_eos(run_dir: Path) -> int | None:
    """The end-of-sequence id of an ``hf:DIR`` run's model (its copied config.json)."""
    from pipeoffload.hfdir import eos_id
    from pipeoffload.llama_config import LlamaShape
    from pipeoffload.train.family import HF_CONFIG

    path = run_dir / HF_CONFIG
    return eos_id(LlamaShape.from_hf(json.loads(path.read_text()), str(path)))


# ---- tokens ------------------------------------------------------------------------------------------
def load_token_file(data: str) -> np.ndarray:
    """Memory-map a pre-tokenized file."""
    path = Path(data)
    if path.suffix == ".npy":
        arr = np.load(path, mmap_mode="r")
    else:
        arr = np.memmap(path, dtype=np.uint16, mode="r")
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"data={data!r}: a token file must hold one flat array of integers, got {arr.dtype} {arr.shape}")
    return arr


def tokenize(data: str, tokenizer: Tokenizer, val_fraction: float) -> tuple[np.ndarray, int | None]:
    """The token stream and where its validation tail starts (None: the last ``val_fraction`` of the
    tokens, the byte tokenizer's split). A BPE encodes the training text and the validation tail
    separately, at the text split it was trained with."""
    if isinstance(tokenizer, ByteTokenizer):
        return np.frombuffer(read_text(data).encode("utf-8"), dtype=np.uint8).astype(np.uint16), None
    dtype = np.int32 if tokenizer.vocab_size > 65535 else np.uint16
    if tokenizer.eos is not None:  # a model's tokenizer: documents end with its EOS; the tail of the tokens held out
        ids: list[int] = []
        for doc in read_documents(data):
            ids.extend(tokenizer.encode(doc))
            ids.append(tokenizer.eos)
        return np.asarray(ids, dtype=dtype), None
    train, val = (tokenizer.encode(part) for part in split_text(read_text(data), val_fraction))
    return np.asarray(train + val, dtype=dtype), len(train)


def sequence_counts(tokens: int, seq_len: int, val_fraction: float, split: int | None = None) -> tuple[int, int, int]:
    """(where the validation tail starts, training sequences, validation sequences) of ``tokens`` tokens:
    the tail starts at ``split`` when given (a BPE corpus, split as text), else at the last ``val_fraction``;
    a window needs ``seq_len + 1`` tokens. ``Corpus`` and the launcher's preflight both count with it."""
    val_start = int(tokens * (1 - val_fraction)) if split is None else split
    return val_start, max(0, (val_start - 1) // seq_len), max(0, (tokens - val_start - 1) // seq_len)


def val_batches_held(num_val: int, global_batch: int) -> int:
    """Whole batches of ``global_batch`` of ``num_val`` held-out sequences (1 when there are fewer: that
    batch repeats some): the most validation batches a run evaluates, whatever ``eval_batches`` asks."""
    return max(1, num_val // global_batch)


@dataclass
class Corpus:
    """The token stream split into training windows and a held-out validation tail, which starts at
    ``split`` when given (a BPE corpus, split as text) or else at the last ``val_fraction`` of the tokens."""

    tokens: np.ndarray
    vocab_size: int
    seq_len: int
    val_fraction: float
    split: int | None = None
    # the permutation of the last (epoch, seed) asked for: consecutive steps read the same epoch's
    _permutation_of: tuple[tuple[int, int], np.ndarray] | None = field(default=None, init=False, repr=False,
                                                                      compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        self.val_start, self.num_train, self.num_val = sequence_counts(n, self.seq_len, self.val_fraction, self.split)
        if self.num_train < 1 or self.num_val < 1:
            raise ConfigError(
                f"data: {n} tokens give {self.num_train} training and {self.num_val} validation sequences of "
                f"seq_len={self.seq_len}; use more text or a smaller --seq-len"
            )

    def window(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        chunk = np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64)
        return chunk[:-1], chunk[1:]

    def train_indices(self, step: int, global_batch: int, seed: int) -> np.ndarray:
        """Window indices of 0-based ``step``: the step's slice of the per-epoch permuted stream."""
        out = []
        first = step * global_batch
        for pos in range(first, first + global_batch):
            epoch, i = divmod(pos, self.num_train)
            out.append(self._permutation(epoch, seed)[i])
        return np.asarray(out, dtype=np.int64)

    def _permutation(self, epoch: int, seed: int) -> np.ndarray:
        cached = self._permutation_of
        if cached is None or cached[0] != (epoch, seed):
            perm = np.random.default_rng([seed, epoch]).permutation(self.num_train)
            self._permutation_of = ((epoch, seed), perm)
            return perm
        return cached[1]

    def batch(self, indices: np.ndarray, val: bool = False) -> tuple[np.ndarray, np.ndarray]:
        base = self.val_start if val else 0
        pairs = [self.window(base + int(i) * self.seq_len) for i in indices]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    def train_batch(self, step: int, global_batch: int, seed: int, dp: int, dp_rank: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.train_indices(step, global_batch, seed)
        share = global_batch // dp
        return self.batch(idx[dp_rank * share:(dp_rank + 1) * share])

    def val_batches_held(self, global_batch: int) -> int:
        """Whole batches of ``global_batch`` held-out sequences (``val_batches_held`` of ``num_val``)."""
        return val_batches_held(self.num_val, global_batch)

    def val_batches(self, count: int, global_batch: int, dp: int, dp_rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The first ``count`` validation batches (fixed, the same every evaluation), this replica's slice;
        at most the held-out data's (``val_batches_held``): beyond them it would evaluate the same sequences again."""
        share = global_batch // dp
        out = []
        for b in range(min(count, self.val_batches_held(global_batch))):
            idx = (np.arange(b * global_batch, (b + 1) * global_batch) % self.num_val)[dp_rank * share:(dp_rank + 1) * share]
            out.append(self.batch(idx, val=True))
        return out


def load_corpus(data: str, tokenizer_spec: str, run_dir: Path, seq_len: int, val_fraction: float) -> tuple[Corpus, Tokenizer | None]:
    """The corpus every rank reads (deterministic); the tokenizer is None for a pre-tokenized file."""
    if is_token_file(data):
        tokens = load_token_file(data)
        vocab = int(tokens.max()) + 1
        return Corpus(tokens, vocab, seq_len, val_fraction), None
    tokenizer = load_tokenizer(tokenizer_spec, run_dir)
    tokens, split = tokenize(data, tokenizer, val_fraction)
    return Corpus(tokens, tokenizer.vocab_size, seq_len, val_fraction, split), tokenizer


def prepare(data: str, tokenizer_spec: str, run_dir: Path, val_fraction: float) -> None:
    """Launcher-side preparation: train the BPE once (saved in the run) so every rank loads the same,
    on the training text only (``val_fraction`` decides the held-out tail, as ``load_corpus`` does)."""
    if tokenizer_spec in ("byte", "hf") or is_token_file(data):  # hf: copied by the launcher (job.prepare_run)
        return
    path = run_dir / "tokenizer.json"
    if path.is_file():
        return
    vocab = int(tokenizer_spec.partition(":")[2])
    text = split_text(read_text(data), val_fraction)[0]
    log.info("training a byte-level BPE with %d tokens on the training text (%.1f M characters; saved as %s)",
             vocab, len(text) / 1e6, path)
    train_bpe(text, vocab, path)
    log.info("BPE trained")
