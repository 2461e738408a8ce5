"""Tiny Hugging Face checkpoints made locally with random weights (tests only; nothing is downloaded)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEXT = ("The quick brown fox jumps over the lazy dog. Pipelines move activations between stages; "
        "offload moves them to the host and back before they are needed again. ") * 8


def make_tokenizer(path: Path, vocab: int = 300) -> Any:
    """A byte-level BPE ``tokenizer.json`` trained on a fixed sentence, with <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(path))
    return tok


def hf_config(kind: str, vocab: int, **over: Any) -> Any:
    import transformers

    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                  bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5)
    common.update(over)
    if kind == "llama":
        return transformers.LlamaConfig(tie_word_embeddings=False, rope_theta=50000.0, **common)
    if kind == "llama3":  # Llama 3.1's rope frequency scaling
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return transformers.LlamaConfig(tie_word_embeddings=False, rope_parameters=rope, **common)
    if kind == "qwen2":
        return transformers.Qwen2Config(tie_word_embeddings=True, rope_theta=10000.0, **common)
    if kind == "llama-bias":  # attention_bias (q, k, v and o) and mlp_bias (gate, up and down)
        return transformers.LlamaConfig(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, **common)
    if kind == "qwen3":  # q/k norms, a head width set apart (4 heads x 32 != 64); over: tied, attention_bias
        return transformers.Qwen3Config(**{"tie_word_embeddings": False, "head_dim": 32, "rope_theta": 1e6, **common})
    if kind == "phi3":  # fused qkv_proj and gate_up_proj; Phi3Config's padding id (32000) is outside this vocabulary
        return transformers.Phi3Config(**{"tie_word_embeddings": False, "pad_token_id": None, **common})
    if kind == "mistral":
        return transformers.MistralConfig(**{"tie_word_embeddings": False, "sliding_window": None, **common})
    raise ValueError(kind)


def make_hf_dir(path: Path, kind: str = "llama", seed: int = 0, shard: str | None = None, **over: Any) -> Any:
    """Save a random-weight ``*ForCausalLM`` (``shard``: e.g. ``"60KB"`` for an indexed multi-file
    checkpoint) and a tokenizer into ``path``; returns the transformers model (fp32, eval mode)."""
    import torch
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(path / "tokenizer.json")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(kind, tok.get_vocab_size(), **over),
                                                          attn_implementation="sdpa")
    with torch.no_grad():  # biases start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    return model


def edit_config(path: Path, **fields: Any) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


# ---- one process: what every Hugging Face family's folder must do (train, resume, generate, plan) ----------
def train_and_resume(tmp: Path, source: Path) -> dict[str, Any]:
    """``source`` trained 5 steps in one process (run "run"), and 2 steps then --resume to 5 (run "b")."""
    from pipeoffload.train.config import TrainConfig, validate
    from pipeoffload.train.job import train
    from tests.dist.test_train_llama import STEPS, _config

    whole = _config(tmp, source)
    got = [r["loss"] for r in train(whole)["history"]]
    keys = dict(model=f"hf:{source}", data=whole.data.path, seq_len=16, global_batch=8, microbatches=4, steps=STEPS,
                warmup=2, lr=3e-3, eval_every=100, out=str(tmp / "b"), progress=False)
    first = train(validate(TrainConfig.build(stop_at=2, **keys)))["history"]
    rest = train(validate(TrainConfig.build(**keys)), resume=str(tmp / "b"))["history"]
    return {"tmp": tmp, "source": source, "cfg": whole, "whole": got, "resumed": [r["loss"] for r in first + rest]}


def assert_trains_as_transformers_and_resumes(runs: dict[str, Any]) -> None:
    from tests.dist.test_train_llama import _reference

    want = _reference(runs["cfg"], runs["source"])
    assert max(abs(a - b) for a, b in zip(runs["whole"], want)) < 1e-5, (runs["whole"], want)
    assert runs["resumed"] == runs["whole"]


def assert_generates_as_transformers(run: Path, export: Path, ref: Any, capsys: Any) -> None:
    """`generate RUN --greedy` prints what transformers' greedy ``generate`` of ``ref`` (the export) makes."""
    import torch
    import transformers

    from pipeoffload.cli import main

    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "The quick", "--tokens", "6", "--greedy"]) == 0
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(export / "tokenizer.json"))
    ids = tok.encode("The quick")
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6, eos_token_id=None,
                            pad_token_id=0)[0].tolist()
    assert capsys.readouterr().out[:-1] == tok.decode(want)


def assert_plan_emits_and_auto_trains(source: Path, tmp_path: Path, capsys: Any) -> None:
    """`plan --model hf:DIR --emit` writes a config naming the folder, and `train --plan auto` trains it."""
    from pipeoffload.cli import main

    emit = tmp_path / "run.toml"
    assert main(["plan", "--model", f"hf:{source}", "--gpus", "2", "--global-batch", "8", "--seq", "16",
                 "--memory", "40", "--emit", str(emit)]) == 0
    assert f'source = "hf:{source.resolve()}"' in emit.read_text()
    capsys.readouterr()
    data = tmp_path / "data.txt"
    data.write_text(TEXT * 6)
    assert main(["train", "--model", f"hf:{source}", "--data", str(data), "--seq-len", "16", "--plan", "auto",
                 "--memory", "40", "--global-batch", "4", "--steps", "1", "--out", str(tmp_path / "run")]) == 0
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in row for row in history)
