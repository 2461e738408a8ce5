"""Launch-time checks of ``pipeoffload train``: the data and the memory, before any file is written.

``validate`` (``config``) checks the values; this module checks what they point at, in the launcher,
before ``config.toml`` or ``train.log`` exist and before any rank starts: a token file that is empty,
truncated, not an array, of a non-integer dtype, with negative ids or ids implying an absurd
vocabulary; too little text for one training and one validation sequence; and a run whose memory
cannot fit on this machine, by a lower bound (weights, gradients and AdamW's state, the held-out
batches every rank materializes (eval_batches, capped as the ranks cap it), the text as each rank
holds it, one microbatch's activations, the GPT's s x s attention scores of one layer among them), so
a run that is refused could not have run. Torch-free (numpy reads the token file's header and ids).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeoffload.errors import ConfigError, Naming
from pipeoffload.fileio import folder_write_error
from pipeoffload.train.config import TrainConfig

MAX_VOCAB = 1 << 20  # 1,048,576: above every vocabulary in use (Llama 3: 128k, Qwen2: 152k)
GIB = 1024**3


@dataclass(frozen=True)
class DataFacts:
    tokens: int  # tokens in the stream (with a BPE: at most this many, the text's bytes)
    vocab: int  # 0: unknown until the BPE is trained
    resident_bytes: int  # what one rank holds of the data while loading it
    exact: bool = True  # False: ``tokens`` is an upper bound (a BPE merges bytes)


def check_run(cfg: TrainConfig, *, own_model: bool = False, available: int | None = None) -> None:
    """Every launch-time check of a validated config (``own_model``: ``train_model``, no data or GPT)."""
    check_out(cfg.run.out, cfg.metrics.tensorboard)
    if own_model:
        return
    facts = data_facts(cfg)
    if cfg.model.vocab and facts.vocab > cfg.model.vocab:
        if cfg.model.source.startswith("hf:"):  # its vocabulary is the model's: --vocab is refused there
            raise ConfigError(f"data={cfg.data.path!r}: holds token id {facts.vocab - 1}, but model="
                              f"{cfg.model.source!r} has vocab_size={cfg.model.vocab} (its config.json); tokenize "
                              "the data with the model's tokenizer.json, or give it as text")
        raise ConfigError(f"vocab={cfg.model.vocab}: the data needs {facts.vocab} token ids (its tokenizer or token "
                          "file); raise --vocab or leave it at 0 (the data's)")
    check_sequences(facts.tokens, cfg, at_most=not facts.exact)
    check_memory(cfg, facts, available if available is not None else available_memory())


# what a run writes in its --out folder: name -> (a file or a folder, what it is)
RUN_ENTRIES = {
    "config.toml": ("file", "the resolved configuration"),
    "metrics.jsonl": ("file", "the metrics records"),
    "train.log": ("file", "the ranks' log"),
    "tokenizer.json": ("file", "the tokenizer"),
    "hf_config.json": ("file", "the model's config.json"),
    "generation_config.json": ("file", "the model's generation_config.json"),
    ".lock": ("file", "the run's lock"),
    "checkpoints": ("folder", "the checkpoints"),
    "tensorboard": ("folder", "the TensorBoard event files"),
}


def check_out(out: str, tensorboard: bool = False) -> None:
    """The run directory is a folder, or can be created as one, and each entry the run writes there
    (``RUN_ENTRIES``; tensorboard/ only with ``tensorboard``) is absent or of its kind: checked here, before
    anything is written, not found by a rank part-way through the run."""
    if not out:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out={out!r}: exists and is not a folder; give a folder for the run (--out DIR)")
    if path.is_dir():
        for name, (kind, what) in RUN_ENTRIES.items():
            entry = path / name
            if name == "tensorboard" and not tensorboard or not (entry.exists() or entry.is_symlink()):
                continue
            if (entry.is_dir() if kind == "folder" else entry.is_file()):
                continue
            found = "a folder" if entry.is_dir() else "a file" if entry.is_file() else "not a file or a folder"
            raise ConfigError(f"out={out!r}: {str(entry)!r} is {found}, where the run writes {what} (a {kind}); "
                              "move or remove it, or choose another --out")
    parent = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"out={out!r}: {str(parent)!r} is not a writable folder; choose another --out")
    err = folder_write_error(parent)
    if err is not None:
        raise ConfigError(f"out={out!r}: a folder cannot be made in {str(parent)!r} ({err.strerror}); choose "
                          "another --out")


# ---- data ------------------------------------------------------------------------------------------
def data_facts(cfg: TrainConfig) -> DataFacts:
    from pipeoffload.train.data import is_token_file, jsonl_texts, text_files

    path = cfg.data.path
    if is_token_file(path):
        tokens, top = check_token_file(path)
        return DataFacts(tokens, top + 1, 0)  # memory-mapped: nothing resident
    files = text_files(path)
    for f in files:  # one that cannot be read is one line here, before anything is written (not in the ranks)
        try:
            with f.open("rb") as handle:
                handle.read(1)
        except OSError as err:
            raise ConfigError(f"data={path!r}: {str(f)!r} cannot be read ({err.strerror}); give text files "
                              "you can read") from None
    for f in files:  # a bad line is one line here, before anything is written (not in the ranks)
        if f.suffix == ".jsonl":
            jsonl_texts(f, f.read_text(encoding="utf-8", errors="replace"))
    size = sum(p.stat().st_size for p in files)
    if cfg.data.tokenizer == "hf":  # the model's tokenizer: at most one token per byte, plus one EOS per file
        return DataFacts(size + len(files), cfg.model.vocab, 5 * size, exact=False)
    if cfg.data.tokenizer == "byte":  # one token per byte; each rank holds the text, its bytes and uint16 ids
        return DataFacts(size, 256, 5 * size)
    if importlib.util.find_spec("tokenizers") is None:
        raise ConfigError(f"tokenizer={cfg.data.tokenizer!r} needs the 'tokenizers' package: pip install tokenizers")
    return DataFacts(size, int(cfg.data.tokenizer.partition(":")[2]), 5 * size, exact=False)


def check_token_file(data: str) -> tuple[int, int]:
    """(number of tokens, largest id) of a ``.npy``/``.bin`` token file; ``ConfigError`` naming the fault."""
    path = Path(data)
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(f"data={data!r}: the token file is empty")
    if path.suffix == ".bin":
        if size % 2:
            raise ConfigError(f"data={data!r}: {size} bytes is not a whole number of uint16 tokens (2 bytes "
                              "each); the file is truncated or not a .bin token file")
        arr: np.ndarray = np.memmap(path, dtype=np.uint16, mode="r")
    else:
        arr = _load_npy(data)
    if arr.size < 2:
        raise ConfigError(f"data={data!r}: {arr.size} token(s); a token file needs at least a sequence")
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise ConfigError(f"data={data!r}: token id {low} at index {int(np.argmin(arr))}: ids must be >= 0")
    if high >= MAX_VOCAB:
        raise ConfigError(f"data={data!r}: token id {high} at index {int(np.argmax(arr))} implies a vocabulary of "
                          f"{high + 1:,}; ids must be < {MAX_VOCAB:,} (is this a token file?)")
    return int(arr.size), high


def _load_npy(data: str) -> np.ndarray:
    try:
        arr = np.load(data, mmap_mode="r", allow_pickle=False)
    except ValueError as err:  # not an .npy header, or an object array (which would need pickle)
        raise ConfigError(f"data={data!r}: not a .npy array of integer tokens ({str(err).splitlines()[0]})") from None
    except (OSError, EOFError) as err:
        raise ConfigError(f"data={data!r}: cannot read the .npy file ({err})") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"data={data!r}: a token file must hold one flat array of integers, got "
                          f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}")
    return arr


def check_sequences(tokens: int, cfg: TrainConfig, at_most: bool = False) -> None:
    """At least one training and one validation sequence (the rule ``data.Corpus`` applies in the ranks);
    ``at_most``: ``tokens`` is an upper bound, so only a certain failure is refused here."""
    from pipeoffload.train.data import sequence_counts

    seq = cfg.model.seq_len
    _, train, val = sequence_counts(tokens, seq, cfg.data.val_fraction)
    if train < 1 or val < 1:
        raise ConfigError.named(lambda n: (
            f"data: {'at most ' if at_most else ''}{tokens} tokens give {train} training and {val} validation "
            f"sequences of {n.given('seq_len', seq)}; use more text or a smaller {n('seq_len')}"))


# ---- memory ----------------------------------------------------------------------------------------
def gpt_parameters(cfg: TrainConfig, vocab: int) -> int:
    """Parameters of the reference GPT (``models.gpt``): embeddings, blocks, final norm and head."""
    h, m = cfg.model.hidden, cfg.model
    block = 4 * h * h + 4 * h + 2 * h * 4 * h + 4 * h + h + 4 * h  # attention, MLP (4h) and two LayerNorms
    return vocab * h + m.seq_len * h + m.layers * block + 2 * h + h * vocab + vocab


def model_parameters(cfg: TrainConfig, vocab: int) -> int:
    """Parameters of the run's model: the reference GPT, or the Llama family's (``train.family``)."""
    from pipeoffload.train.family import kind, llama_parameters, run_shape

    if kind(cfg.model.source) == "gpt":
        return gpt_parameters(cfg, vocab)
    return llama_parameters(run_shape(cfg.model, vocab, None))


def model_state_bytes(cfg: TrainConfig, vocab: int) -> int:
    """fp32 weights and gradients in every replica; AdamW's two moments too, or once shared with ZeRO-1."""
    p = cfg.parallel
    return model_parameters(cfg, vocab) * (8 * p.dp + 8 * (1 if p.zero else p.dp))


def memory_lower_bound(cfg: TrainConfig, facts: DataFacts, local_ranks: int | None = None) -> int:
    """Bytes the ranks on this machine need at least (fp32): their share of the model state, the
    held-out batches and data each rank holds, and one microbatch's layer outputs, logits and (the
    reference GPT) attention scores of one layer."""
    return sum(memory_parts(cfg, facts, local_ranks).values())


def memory_parts(cfg: TrainConfig, facts: DataFacts, local_ranks: int | None = None) -> dict[str, int]:
    """``memory_lower_bound`` by what takes it: ``model`` state, one microbatch's ``activations``, the
    ``held_out`` batches and the ``data`` every local rank holds."""
    p, m = cfg.parallel, cfg.model
    vocab = m.vocab or facts.vocab or 256
    world = cfg.world
    local = local_ranks if local_ranks is not None else _local_ranks(world)
    per_replica = cfg.data.global_batch // p.dp
    held_out = held_out_batches(cfg, facts) * per_replica * m.seq_len * 16  # int64 inputs and targets, every rank
    micro = per_replica // cfg.schedule.microbatches
    activations = p.dp * micro * (m.seq_len * (m.layers * m.hidden + 3 * vocab) + attention_scores(cfg)) * 4
    state = model_state_bytes(cfg, vocab)
    # the shares of the local ranks, rounded as one sum is (the parts add up to the bound exactly)
    shared = (state + activations) * local // world
    state_part = state * local // world
    return {"model": state_part, "activations": shared - state_part, "held_out": local * held_out,
            "data": local * facts.resident_bytes}


def attention_scores(cfg: TrainConfig) -> int:
    """Elements of one sequence's attention scores in one layer that the model writes out: the reference
    GPT's ``heads x seq x seq`` (fp32 under autocast too: its softmax is); the Llama family's SDPA none."""
    from pipeoffload.train.family import kind

    m = cfg.model
    return m.heads * m.seq_len**2 if kind(m.source) == "gpt" else 0


def held_out_batches(cfg: TrainConfig, facts: DataFacts) -> int:
    """The validation batches each rank will hold: ``eval_batches``, capped at the whole batches the
    held-out data holds (``data.val_batches_held``, the ranks' own cap); where ``facts.tokens`` is only an
    upper bound (a BPE or a model's tokenizer), the one batch surely held, so the bound stays a lower one."""
    from pipeoffload.train.data import sequence_counts, val_batches_held

    if not facts.exact:
        return 1
    _, _, num_val = sequence_counts(facts.tokens, cfg.model.seq_len, cfg.data.val_fraction)
    return min(cfg.metrics.eval_batches, val_batches_held(num_val, cfg.data.global_batch))


def _local_ranks(world: int) -> int:
    """Ranks on this machine: all of them when spawned here, torchrun's local share otherwise."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        try:
            return max(1, min(world, int(os.environ["LOCAL_WORLD_SIZE"])))
        except ValueError:
            pass
    return world


def available_memory() -> int | None:
    """Bytes this machine can give (``MemAvailable``; else physical memory); None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: TrainConfig, facts: DataFacts, available: int | None) -> None:
    if not available:
        return
    parts = memory_parts(cfg, facts)
    need = sum(parts.values())
    if need <= available:
        return
    per_replica = cfg.data.global_batch // cfg.parallel.dp
    micro = per_replica // cfg.schedule.microbatches
    m, d, c = cfg.model, cfg.data, cfg.metrics
    held = held_out_batches(cfg, facts)
    largest = max(parts, key=lambda k: parts[k])

    def fix(n: Naming) -> str:  # what lowers the largest part
        return {
            "model": f"make the model smaller ({n.given('layers', m.layers)}, {n.given('hidden', m.hidden)})",
            "activations": f"make the microbatch smaller ({n.given('global_batch', d.global_batch)} over "
                           f"{n.given('microbatches', cfg.schedule.microbatches)} is {_count(micro, 'sequence')} of "
                           f"{n.given('seq_len', m.seq_len)}): lower {n('global_batch')} or {n('seq_len')}, or "
                           f"raise {n('microbatches')}",
            "held_out": f"lower {n('eval_batches')}",
            "data": "use a memory-mapped token file (.npy or .bin) instead of text each rank holds",
        }[largest]

    raise ConfigError.named(lambda n: (
        f"the run needs at least {_gib(need)} of memory on this machine (estimated: model state "
        f"{_gib(parts['model'])} for {n.given('layers', m.layers)} {n.given('hidden', m.hidden)}, activations of "
        f"one microbatch of {_count(micro, 'sequence')} {_gib(parts['activations'])}, "
        f"{_count(held, 'held-out batch', 'held-out batches')} for {n.given('eval_batches', c.eval_batches)} "
        f"{_gib(parts['held_out'])}, data {_gib(parts['data'])}) but {_gib(available)} are available; {fix(n)}"))


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n < 1e6 * GIB else f"{n / GIB:.3g} GiB"
