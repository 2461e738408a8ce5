"""Data sources and tokenizers of `pipeoffload train`, and `pipeoffload generate` from its checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeoffload.train.data import ByteTokenizer, load_corpus, prepare

TINY = ["--layers", "1", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--global-batch", "4",
        "--microbatches", "2", "--steps", "2", "--eval-every", "1", "--no-progress"]


def pipeoffload(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", *args], capture_output=True, text=True, timeout=240)


def test_bpe_tokenizer_is_trained_saved_and_used_by_generate(tmp_path: Path) -> None:
    text = tmp_path / "corpus"
    text.mkdir()
    (text / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 300)
    (text / "b.md").write_text("pack my box with five dozen liquor jugs\n" * 300)
    run = tmp_path / "run"
    done = pipeoffload("train", *TINY, "--data", str(text), "--tokenizer", "bpe:300", "--out", str(run))
    assert done.returncode == 0, done.stderr
    vocab = json.loads((run / "tokenizer.json").read_text())["model"]["vocab"]
    assert 256 < len(vocab) <= 300
    corpus, tok = load_corpus(str(text), "bpe:300", run, 16, 0.05)
    assert tok is not None and corpus.vocab_size == tok.vocab_size and corpus.tokens.max() < tok.vocab_size
    assert len(corpus.tokens) < len("the quick brown fox jumps over the lazy dog\n") * 600 / 2  # merges happened
    from pipeoffload.train.generate import generate_text  # what `pipeoffload generate RUN_DIR` prints

    assert generate_text(run, "the quick", 5, temperature=0.0).startswith("the quick")


def test_pretokenized_npy_is_memory_mapped_and_trains(tmp_path: Path) -> None:
    tokens = (np.arange(20_000) * 7 % 97).astype(np.uint16)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    corpus, tok = load_corpus(str(path), "byte", tmp_path, 16, 0.05)
    assert tok is None and corpus.vocab_size == 97 and isinstance(corpus.tokens, np.memmap)
    done = pipeoffload("train", *TINY, "--data", str(path), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["val_loss"] > 0 for r in rows)


def test_byte_tokenizer_round_trip_and_prepare_is_a_no_op(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo")) == "héllo"
    prepare("", "byte", tmp_path, 0.05)
    assert not list(tmp_path.iterdir())


def test_raw_uint16_bin_is_memory_mapped(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    (np.arange(5_000) % 300).astype("<u2").tofile(path)
    corpus, tok = load_corpus(str(path), "byte", tmp_path, 16, 0.1)
    assert tok is None and corpus.vocab_size == 300 and len(corpus.tokens) == 5_000
    x, y = corpus.batch(np.array([0, 1]))
    assert x.shape == (2, 16) and np.array_equal(x[0], np.arange(16)) and np.array_equal(y[0], np.arange(1, 17))


LEAK_BIGRAMS = ("zq", "qx", "xj", "jv", "vw", "wk")  # the tail word's pairs; none occurs in the training text


def test_bpe_is_trained_on_the_training_text_only(tmp_path: Path) -> None:
    train = "the quick brown fox jumps over the lazy dog\n" * 300
    tail = "zqxjvwk " * 300  # 2400 of 15600 characters: inside the last 20 %
    path = tmp_path / "text.txt"
    path.write_text(train + tail)
    prepare(str(path), "bpe:400", tmp_path, 0.2)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert not [t for t in vocab if any(b in t for b in LEAK_BIGRAMS)]  # the validation word left no merge
    corpus, tok = load_corpus(str(path), "bpe:400", tmp_path, 16, 0.2)
    assert tok is not None and len(tok.encode(" zqxjvwk")) >= 6
    text = train + tail
    cut = int(len(text) * 0.8)  # the validation tail: the last 20 % of the text, split before tokenizing
    assert corpus.val_start == len(tok.encode(text[:cut]))
    assert tok.decode([int(t) for t in corpus.tokens[corpus.val_start:]]) == text[cut:]


def test_byte_corpus_splits_the_tokens_as_before(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_text("héllo wörld, " * 500)
    corpus, tok = load_corpus(str(path), "byte", tmp_path, 16, 0.1)
    raw = path.read_text().encode("utf-8")
    assert isinstance(tok, ByteTokenizer) and bytes(corpus.tokens.astype(np.uint8)) == raw
    assert corpus.val_start == int(len(raw) * 0.9)


def test_bpe_run_resumes_bit_identically(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("pack my box with five dozen liquor jugs\n" * 400 + "sphinx of black quartz judge my vow\n" * 40)
    runs = {}
    for name, extra in (("full", []), ("stopped", ["--stop-at", "1"])):
        runs[name] = tmp_path / name
        done = pipeoffload("train", *TINY, "--data", str(text), "--tokenizer", "bpe:300", "--save-every", "1",
                           "--out", str(runs[name]), *extra)
        assert done.returncode == 0, done.stderr
    done = pipeoffload("train", "--resume", str(runs["stopped"]), "--stop-at", "0")
    assert done.returncode == 0, done.stderr
    rows = {name: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for name, run in runs.items()}
    assert len(rows["full"]) == 2 and [(r["loss"], r["val_loss"]) for r in rows["stopped"]] == [(r["loss"], r["val_loss"]) for r in rows["full"]]
    assert (runs["stopped"] / "tokenizer.json").read_bytes() == (runs["full"] / "tokenizer.json").read_bytes()


def test_jsonl_documents(tmp_path: Path) -> None:
    """A .jsonl file's `text` fields are the documents (a folder mixes them with text files); a bad line is
    refused naming the file and line."""
    import pytest

    from pipeoffload.errors import ConfigError
    from pipeoffload.train.data import read_documents, read_text

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "first doc", "id": 1}\n\n{"text": "second\\ndoc"}\n')
    (folder / "b.txt").write_text("plain")
    assert read_documents(str(folder)) == ["first doc", "second\ndoc", "plain"]
    assert read_text(str(folder / "a.jsonl")) == "first doc\nsecond\ndoc"
    corpus, _ = load_corpus(str(folder / "a.jsonl"), "byte", tmp_path, 4, 0.3)
    assert bytes(corpus.tokens.tolist()) == b"first doc\nsecond\ndoc"
    (folder / "c.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ConfigError, match=r"c\.jsonl:2: no string field 'text'"):
        read_documents(str(folder))
    (folder / "c.jsonl").write_text("not json\n")
    with pytest.raises(ConfigError, match=r"c\.jsonl:1: not a JSON object"):
        read_documents(str(folder))


def test_model_tokenizer_ends_each_document_with_eos(tmp_path: Path) -> None:
    """With an hf:DIR run's tokenizer every document (a file, a .jsonl line) is followed by the model's EOS."""
    import pytest

    pytest.importorskip("tokenizers")
    from pipeoffload.train.data import load_tokenizer
    from tests.hf_fixtures import make_tokenizer

    run = tmp_path / "run"
    run.mkdir()
    make_tokenizer(run / "tokenizer.json")
    (run / "hf_config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 64, "eos_token_id": 1}))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["The quick brown fox", "jumps over", "the dog"]))
    tok = load_tokenizer("hf", run)
    corpus, _ = load_corpus(str(data), "hf", run, 2, 0.2)
    ids = corpus.tokens.tolist()
    want: list[int] = []
    for t in ["The quick brown fox", "jumps over", "the dog"]:
        want += tok.encode(t) + [1]
    assert ids == want and ids.count(1) == 3
