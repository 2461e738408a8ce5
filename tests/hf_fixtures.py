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
