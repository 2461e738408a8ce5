"""Sampling from a run's last checkpoint or a Hugging Face directory, in one process.

A run's checkpoint holds the whole model under its single-process names, so DCP loads it into
``model.full_gpt`` (``model.full_llama`` for a Llama-family run) directly (whatever layout trained it; no process group needed). An ``hf:DIR``
source is read with ``models.hf``. Generation recomputes the whole context at every token (no
cache): slower, and the same arithmetic as training's forward.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch

from pipeoffload.errors import ConfigError
from pipeoffload.train import checkpoint
from pipeoffload.train.config import TrainConfig, build_config, check_run_dir, load_saved
from pipeoffload.train.data import load_tokenizer
from pipeoffload.train.model import full_gpt, full_llama


def load_hf(path: Path) -> tuple[torch.nn.Module, object, int, tuple[int, ...]]:
    """(model, tokenizer, context length, end-of-text ids) of a checked Hugging Face directory."""
    from pipeoffload.hfdir import GENERATION_CONFIG, open_hf_dir, stop_ids
    from pipeoffload.models.hf import hf_model
    from pipeoffload.train.data import BPETokenizer

    hf = open_hf_dir(path)
    return hf_model(hf).eval(), BPETokenizer(hf.tokenizer), hf.shape.context, \
        stop_ids(hf.shape, hf.path / GENERATION_CONFIG)


def load_source(source: str | Path) -> tuple[torch.nn.Module, object, int, tuple[int, ...]]:
    """(model in eval mode, tokenizer, context length, the ids generation stops at) of a run or ``hf:DIR``."""
    from pipeoffload.hfdir import parse_source

    hf_path = parse_source(str(source))
    if hf_path is not None:
        return load_hf(hf_path)
    model, tokenizer, seq = load_model(source)
    return model, tokenizer, seq, _run_eos_ids(Path(source), tokenizer)


def _run_eos_ids(run: Path, tokenizer: Any) -> tuple[int, ...]:
    """The ids generation of a run stops at: an ``hf:DIR`` run's by its copies of DIR's config.json and
    generation_config.json (``hfdir.stop_ids``), else its tokenizer's end-of-text id (none for the byte
    tokenizer and a BPE)."""
    import json

    from pipeoffload.hfdir import GENERATION_CONFIG, stop_ids
    from pipeoffload.llama_config import LlamaShape
    from pipeoffload.train.family import HF_CONFIG

    copy = run / HF_CONFIG
    if copy.is_file():
        return stop_ids(LlamaShape.from_hf(json.loads(copy.read_text()), str(copy)), run / GENERATION_CONFIG)
    eos = getattr(tokenizer, "eos", None)
    return () if eos is None else (eos,)


def load_model(run_dir: str | Path) -> tuple[torch.nn.Module, object, int]:
    """(model in eval mode, tokenizer, context length) from the run's config and last checkpoint."""
    model, tokenizer, cfg = load_run(Path(run_dir))
    return model, tokenizer, run_context(cfg, tokenizer.vocab_size, Path(run_dir))


def run_context(cfg: TrainConfig, vocab: int, run: Path) -> int:
    """The most tokens generation keeps of a run: the positions its model declares, what ``export --hf``
    writes as ``max_position_embeddings`` (an ``hf:DIR`` run: DIR's config.json, and no more than its sliding
    window; ``--model llama``: its ``seq_len``); the GPT's learned position table (``seq_len`` rows)."""
    from pipeoffload.train.family import kind, run_shape

    if kind(cfg.model.source) == "gpt":
        return cfg.model.seq_len
    return run_shape(cfg.model, vocab, run).context


def load_run(run: Path) -> tuple[torch.nn.Module, Any, TrainConfig]:
    """(model in eval mode with the last checkpoint's weights, tokenizer, config) of a run directory."""
    from pipeoffload.train.family import kind, run_shape

    check_run_dir(run)
    cfg = build_config(load_saved(run))
    if cfg.model.source == "own":
        raise ConfigError(f"run {str(run)!r} trained model={cfg.model.source!r} (made with train_model: your own "
                          "model); generate rebuilds only the gpt and llama models: sample with your model's code")
    if cfg.data.path and Path(cfg.data.path).suffix in (".npy", ".bin"):
        raise ConfigError(f"run {str(run)!r} trained on pre-tokenized {cfg.data.path}: no tokenizer to decode text")
    tokenizer = load_tokenizer(cfg.data.tokenizer, run)
    ckpt = checkpoint.latest_checkpoint(run)
    checkpoint.verify(ckpt)
    family = kind(cfg.model.source)
    if family == "gpt":
        model = full_gpt(cfg, tokenizer.vocab_size)
    else:
        model = full_llama(run_shape(cfg.model, tokenizer.vocab_size, run))
    state = {f"model.{n}": p.detach() for n, p in model.named_parameters()}
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        try:
            dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
        except Exception as err:  # e.g. an older train_model run, whose config.toml did not say so
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"checkpoint {str(ckpt)!r} does not hold the {family} model its config.toml describes "
                              f"({first}); a run made with train_model cannot be sampled here") from None
    model.eval()
    return model, tokenizer, cfg


def continue_ids(model: torch.nn.Module, ids: list[int], tokens: int, *, context: int, greedy: bool = False,
                 temperature: float = 0.8, seed: int = 0, eos: int | Collection[int] | None = None) -> list[int]:
    """``ids`` followed by up to ``tokens`` new ones (argmax when ``greedy`` or ``temperature <= 0``;
    stops after ``eos``, or after any of several)."""
    return [*ids, *new_ids(model, ids, tokens, context=context, greedy=greedy, temperature=temperature, seed=seed,
                           eos=eos)]


def new_ids(model: torch.nn.Module, ids: list[int], tokens: int, *, context: int, greedy: bool = False,
            temperature: float = 0.8, seed: int = 0, eos: int | Collection[int] | None = None) -> Iterator[int]:
    """The tokens ``continue_ids`` adds, one at a time as each is chosen (a caller can show them as they come,
    and keep what came when it is interrupted)."""
    stops = {eos} if isinstance(eos, int) else set(eos or ())
    gen = torch.Generator().manual_seed(seed)
    out = list(ids)
    for _ in range(tokens):
        with torch.no_grad():
            window = torch.tensor([out[-context:]], dtype=torch.long)
            logits = model.layers(window, None, 0)[0, -1].float()  # type: ignore[operator]
        if greedy or temperature <= 0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        out.append(nxt)
        yield nxt
        if nxt in stops:
            return


def start_ids(tokenizer: Any, eos: tuple[int, ...]) -> list[int]:
    """What an empty prompt (one that encodes to no tokens) starts from: the model's end-of-sequence token
    where it has one (an ``hf:DIR`` model: it precedes every document the run trained on), else the
    tokenizer's own newline (the byte tokenizer's byte 10; a BPE's id 10 is some other piece)."""
    return [eos[0]] if eos else tokenizer.encode("\n")  # type: ignore[no-any-return]


class Generation:
    """Text being continued: ``steps()`` adds one token at a time to ``ids``; ``text()`` decodes them all
    (the prompt, or the start token, and the tokens so far)."""

    def __init__(self, source: str | Path, prompt: str, tokens: int, temperature: float = 0.8, seed: int = 0,
                 greedy: bool = False) -> None:
        model, self.tokenizer, context, eos = load_source(source)
        self.ids: list[int] = self.tokenizer.encode(prompt) or start_ids(self.tokenizer, eos)  # type: ignore[attr-defined]
        self.given = len(self.ids)
        self._new = new_ids(model, self.ids, tokens, context=context, greedy=greedy, temperature=temperature,
                            seed=seed, eos=eos)

    def steps(self) -> Iterator[int]:
        for nxt in self._new:
            self.ids.append(nxt)
            yield nxt

    @property
    def generated(self) -> int:
        return len(self.ids) - self.given

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)  # type: ignore[attr-defined,no-any-return]


def generate_text(source: str | Path, prompt: str, tokens: int, temperature: float = 0.8, seed: int = 0,
                  greedy: bool = False) -> str:
    generation = Generation(source, prompt, tokens, temperature, seed, greedy)
    for _ in generation.steps():
        pass
    return generation.text()
