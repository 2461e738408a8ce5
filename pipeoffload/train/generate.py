"""Sampling from a run's last checkpoint in one process (whatever layout trained it).

The checkpoint holds the whole model under its single-process names, so DCP loads it into
``model.full_gpt`` directly (no process group needed).
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipeoffload.errors import ConfigError
from pipeoffload.train import checkpoint
from pipeoffload.train.config import build_config, load_saved
from pipeoffload.train.data import ByteTokenizer, load_tokenizer
from pipeoffload.train.model import full_gpt


def load_model(run_dir: str | Path) -> tuple[torch.nn.Module, object, int]:
    """(model in eval mode, tokenizer, sequence length) from the run's config and last checkpoint."""
    run = Path(run_dir)
    if not (run / "config.toml").is_file():
        raise ConfigError(f"RUN_DIR {str(run)!r}: no config.toml; give the --out folder of `pipeoffload train`")
    cfg = build_config(load_saved(run))
    if cfg.model.source != "gpt":
        raise ConfigError(f"run {str(run)!r} trained model={cfg.model.source!r} (made with train_model: your own "
                          "model); generate rebuilds only the reference GPT: sample with your model's code")
    if cfg.data.path and Path(cfg.data.path).suffix in (".npy", ".bin"):
        raise ConfigError(f"run {str(run)!r} trained on pre-tokenized {cfg.data.path}: no tokenizer to decode text")
    tokenizer = load_tokenizer(cfg.data.tokenizer, run)
    ckpt = checkpoint.latest_checkpoint(run)
    checkpoint.verify(ckpt)
    model = full_gpt(cfg, tokenizer.vocab_size)
    state = {f"model.{n}": p.detach() for n, p in model.named_parameters()}
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        try:
            dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
        except Exception as err:  # e.g. an older train_model run, whose config.toml did not say so
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"checkpoint {str(ckpt)!r} does not hold the reference GPT its config.toml describes "
                              f"({first}); a run made with train_model cannot be sampled here") from None
    model.eval()
    return model, tokenizer, cfg.model.seq_len


@torch.no_grad()
def generate_text(run_dir: str | Path, prompt: str, tokens: int, temperature: float = 0.8, seed: int = 0) -> str:
    model, tokenizer, seq = load_model(run_dir)
    ids = tokenizer.encode(prompt) or ByteTokenizer().encode("\n")[:1]  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(seed)
    out = list(ids)
    for _ in range(tokens):
        context = torch.tensor([out[-seq:]], dtype=torch.long)
        logits = model.layers(context, None, 0)[0, -1].float()  # type: ignore[operator]
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        out.append(nxt)
    return tokenizer.decode(out)  # type: ignore[attr-defined,no-any-return]
