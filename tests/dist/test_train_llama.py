"""`pipeoffload train --model hf:DIR` on 4 gloo ranks equals transformers + torch.optim.AdamW in one process.

Tiny random Hugging Face checkpoints are made locally (tests/hf_fixtures.py). The reference trains
transformers' own model on the same batches (the run's corpus), with the loop's learning-rate
schedule (``optim.lr_at``), global-norm clipping and AdamW settings; 5 steps' losses agree within 1e-5.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.models import lm_loss  # noqa: E402
from pipeoffload.train.config import TrainConfig, validate  # noqa: E402
from pipeoffload.train.data import load_corpus  # noqa: E402
from pipeoffload.train.job import train  # noqa: E402
from pipeoffload.train.optim import lr_at  # noqa: E402
from tests.hf_fixtures import TEXT, make_hf_dir  # noqa: E402

pytestmark = pytest.mark.dist

STEPS = 5


def _config(tmp: Path, source: Path, **keys: object) -> TrainConfig:
    data = tmp / "data.txt"
    data.write_text(TEXT * 6)
    return validate(TrainConfig.build(model=f"hf:{source}", data=str(data), seq_len=16, global_batch=8,
                                      microbatches=4, steps=STEPS, warmup=2, lr=3e-3, eval_every=100,
                                      out=str(tmp / "run"), progress=False, timeout=60, **keys))


def _reference(cfg: TrainConfig, source: Path) -> list[float]:
    """transformers' model + AdamW in one process, on the run's batches, as the training loop steps."""
    return reference_run(cfg, source)[0]


def reference_run(cfg: TrainConfig, source: Path) -> tuple[list[float], torch.nn.Module]:
    """``_reference``'s losses and the transformers model they leave (its weights after the last step)."""
    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path(cfg.run.out), cfg.model.seq_len,
                            cfg.data.val_fraction)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa",
                                                              dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.optim.weight_decay)
    out = []
    for step in range(1, STEPS + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        x, y = corpus.train_batch(step - 1, cfg.data.global_batch, cfg.run.seed, 1, 0)
        loss = lm_loss(model(torch.from_numpy(x)).logits, torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    return out, model


def _losses(cfg: TrainConfig) -> list[float]:
    result = train(cfg)
    return [r["loss"] for r in result["history"]]


def test_pp2_tp2_tied_qwen_equals_transformers(tmp_path: Path) -> None:
    """Qwen2 (tied embeddings, q/k/v biases): the embedding on pipeline rank 0 and the head on rank 1 are
    two copies whose gradients are summed; tensor parallel 2 shards the blocks."""
    source = tmp_path / "qwen"
    make_hf_dir(source, "qwen2")
    cfg = _config(tmp_path, source, pp=2, tp=2, nproc=4)
    got = _losses(cfg)
    want = _reference(cfg, source)
    assert len(got) == STEPS and max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)
    _assert_tied_copies_equal(Path(cfg.run.out))


def test_pp4_group_interleaved_offload_llama_equals_transformers(tmp_path: Path) -> None:
    """Llama 3 (untied, rope scaling), 6 blocks over 8 stages: group-interleaved v=2 with offload all."""
    source = tmp_path / "llama"
    make_hf_dir(source, "llama3", seed=2, num_hidden_layers=6)
    cfg = _config(tmp_path, source, pp=4, nproc=4, schedule="group-interleaved", offload="all")
    got = _losses(cfg)
    want = _reference(cfg, source)
    assert len(got) == STEPS and max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)


def _assert_tied_copies_equal(run: Path) -> None:
    """The two copies of the tied weight end bitwise equal (their gradients were summed across ranks)."""
    from pipeoffload.train.generate import load_run

    model, _, cfg = load_run(run)
    layers = model.layers
    assert torch.equal(layers[0].embed_tokens.weight, layers[-1].lm_head.weight)
    start = json.loads((run / "hf_config.json").read_text())
    assert start["tie_word_embeddings"] and cfg.model.tie_embeddings


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float], list[float]]:
    """--model llama (tied, GQA) in one process: 4 steps in run a; 2 steps then --resume to 4 in run b."""
    tmp = tmp_path_factory.mktemp("llama")
    data = tmp / "data.txt"
    data.write_text(TEXT * 6)
    keys = dict(model="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=48, tie_embeddings=True,
                rope_theta=500000.0, data=str(data), seq_len=16, global_batch=4, microbatches=2, steps=4,
                warmup=1, lr=3e-3, eval_every=100, progress=False)
    whole = train(validate(TrainConfig.build(out=str(tmp / "a"), **keys)))["history"]
    train(validate(TrainConfig.build(out=str(tmp / "b"), stop_at=2, **keys)))
    resumed = train(validate(TrainConfig.build(out=str(tmp / "b"), **keys)), resume=str(tmp / "b"))["history"]
    return tmp / "b", [r["loss"] for r in whole], [r["loss"] for r in whole[:2] + resumed]


def test_llama_from_keys_resumes_bitwise_and_generates(llama_runs: tuple[Path, list[float], list[float]]) -> None:
    """The resumed run's losses equal the uninterrupted run's bitwise; the tied copies stay equal;
    generate reads the run."""
    from pipeoffload.train.generate import continue_ids, generate_text, load_source

    run, whole, resumed = llama_runs
    assert whole == resumed
    model, tokenizer, context, eos = load_source(run)
    assert torch.equal(model.layers[0].embed_tokens.weight, model.layers[-1].lm_head.weight)
    ids = tokenizer.encode("The quick")  # type: ignore[attr-defined]
    want = tokenizer.decode(continue_ids(model, ids, 6, context=context, greedy=True))  # type: ignore[attr-defined]
    assert generate_text(run, "The quick", 6, greedy=True) == want


def test_export_loads_in_transformers_and_continues_as_generate(llama_runs: tuple[Path, list[float], list[float]],
                                                                tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`pipeoffload export RUN --hf OUT` (safetensors shards + index): transformers loads OUT and its greedy continuation equals
    `pipeoffload generate RUN --greedy`; OUT is never overwritten; a GPT run is refused in one line."""
    from tokenizers import Tokenizer

    from pipeoffload.cli import main
    from pipeoffload.train.config import to_toml

    run = llama_runs[0]
    out = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    capsys.readouterr()
    # 9 prompt tokens + 6 stay within the run's seq_len (16), the context generate keeps
    assert main(["generate", str(run), "--prompt", "The quick", "--tokens", "6", "--greedy"]) == 0
    ours = capsys.readouterr().out[:-1]
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("The quick").ids
    assert ids == list(b"The quick")  # the exported tokenizer is the run's byte tokenizer
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6)[0].tolist()
    assert ours == tok.decode(want) and len(want) == len(ids) + 6
    assert ref.config.tie_word_embeddings and ref.config.num_key_value_heads == 2
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(out)]) == 2
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.toml").write_text(to_toml(TrainConfig.build()))
    (gpt / "checkpoints" / "step-000001").mkdir(parents=True)  # past the run folder's check, to the model's
    assert main(["export", str(gpt), "--hf", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "already exists" in err[0] and "no Hugging Face architecture" in err[1] and len(err) == 2
    assert not (tmp_path / "x").exists()


def test_bf16_trains_with_fp32_master_weights(tmp_path: Path) -> None:
    """--dtype bf16 on CPU: autocast (bf16 activations between stages, offloaded too), the loss falls and
    stays finite, and the checkpoint's weights and AdamW moments are fp32."""
    from torch.distributed.checkpoint import FileSystemReader

    from pipeoffload.train.checkpoint import latest_checkpoint

    data = tmp_path / "data.txt"
    data.write_text(TEXT * 6)
    keys = dict(model="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=48, data=str(data), seq_len=16,
                global_batch=4, microbatches=2, steps=8, warmup=1, lr=1e-2, eval_every=100, progress=False,
                schedule="group-interleaved", offload="all")
    history = train(validate(TrainConfig.build(dtype="bf16", out=str(tmp_path / "run"), **keys)))["history"]
    fp32 = train(validate(TrainConfig.build(stop_at=1, out=str(tmp_path / "fp32"), **keys)))["history"][0]
    # bf16 activations: half the resident bytes of fp32's (the norms' float32 outputs aside), other rounding
    assert max(history[0]["peak_act_bytes"]) < 0.75 * max(fp32["peak_act_bytes"])
    assert history[0]["loss"] != fp32["loss"]
    losses = [r["loss"] for r in history]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.5, losses
    assert max(history[-1]["host_bytes"]) > 0  # activations were offloaded
    meta = FileSystemReader(str(latest_checkpoint(tmp_path / "run"))).read_metadata().state_dict_metadata
    dtypes = {name: m.properties.dtype for name, m in meta.items() if hasattr(m, "properties")}
    weights = [n for n in dtypes if n.startswith("model.")]
    assert weights and all(dtypes[n] == torch.float32 for n in weights)
    assert all(dtypes[n] == torch.float32 for n in dtypes if n.endswith(("exp_avg", "exp_avg_sq")))


def test_generate_past_seq_len_equals_transformers_on_the_export(tmp_path: Path) -> None:
    """An hf:DIR run trained at seq_len 16 whose config.json declares 4096 positions: `generate RUN --greedy`
    keeps the whole context up to the 4096 the export declares (not the last 16 tokens with positions
    restarted at 0), so its continuation far past seq_len equals transformers' on the export (probe J)."""
    from pipeoffload.cli import main
    from pipeoffload.train.generate import continue_ids, load_source

    source = tmp_path / "llama"
    make_hf_dir(source, "llama3", seed=3)
    data = tmp_path / "data.txt"
    data.write_text(TEXT * 6)
    # one step at a tiny learning rate: the random model stays far from a collapsed (repeating) one
    cfg = validate(TrainConfig.build(model=f"hf:{source}", data=str(data), seq_len=16, global_batch=4,
                                     microbatches=2, steps=1, warmup=0, lr=1e-5, eval_every=100,
                                     out=str(tmp_path / "run"), progress=False, timeout=60))
    train(cfg)
    run, out = Path(cfg.run.out), tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    ids = tok.encode("The quick brown fox")
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=40, eos_token_id=None,
                            pad_token_id=0)[0].tolist()
    assert len(want) == len(ids) + 40 > 3 * cfg.model.seq_len
    model, _, context, _ = load_source(run)
    assert continue_ids(model, ids, 40, context=context, greedy=True) == want
    assert context == json.loads((out / "config.json").read_text())["max_position_embeddings"] == 4096
