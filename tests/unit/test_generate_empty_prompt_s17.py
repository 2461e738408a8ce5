"""`pipeoffload generate SRC` without --prompt (session 17): an empty prompt starts from the model's
end-of-sequence token where it has one (hf:DIR: what precedes every document a run trains on), else
the tokenizer's newline; it started from token id 10, the byte tokenizer's newline but some other
piece of a BPE vocabulary (here ')')."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.train.data import BPETokenizer, ByteTokenizer  # noqa: E402
from tests.hf_fixtures import make_hf_dir, make_tokenizer  # noqa: E402


def test_an_empty_prompt_starts_from_the_end_of_sequence_token(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    ref = make_hf_dir(tmp_path, "llama", seed=1, num_hidden_layers=1)
    eos = ref.config.eos_token_id
    assert main(["generate", f"hf:{tmp_path}", "--tokens", "5", "--greedy"]) == 0
    with torch.no_grad():
        want = ref.generate(torch.tensor([[eos]]), do_sample=False, max_new_tokens=5, eos_token_id=None,
                            pad_token_id=0)[0].tolist()  # a pad equal to eos would mask the prompt out
    tok = BPETokenizer(tmp_path / "tokenizer.json")
    assert want[1] != eos and capsys.readouterr().out == tok.decode(want) + "\n"


def test_without_an_end_of_sequence_token_an_empty_prompt_is_the_newline(tmp_path: Path) -> None:
    from pipeoffload.train.generate import start_ids

    make_tokenizer(tmp_path / "t.json")
    bpe = BPETokenizer(tmp_path / "t.json")
    assert bpe.decode(start_ids(bpe, None)) == "\n" and start_ids(bpe, None) != [10]
    assert start_ids(ByteTokenizer(), None) == [10] and start_ids(bpe, 1) == [1]
