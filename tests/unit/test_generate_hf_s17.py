"""`pipeoffload generate` (session 17). Without --prompt it starts from the model's end-of-sequence token
where it has one (hf:DIR: what precedes every document a run trains on), else the tokenizer's newline;
it started from token id 10, the byte tokenizer's newline but some other piece of a BPE vocabulary
(here ')'). With an ``eos_token_id`` list (Llama 3.1 Instruct: end of text, of message, of turn) it
stops at any of them, as transformers' generate does, reading generation_config.json first as it does;
it stopped only at config.json's first."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.train.data import BPETokenizer, ByteTokenizer  # noqa: E402
from tests.hf_fixtures import edit_config, make_hf_dir, make_tokenizer  # noqa: E402


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
    assert bpe.decode(start_ids(bpe, ())) == "\n" and start_ids(bpe, ()) != [10]
    assert start_ids(ByteTokenizer(), ()) == [10] and start_ids(bpe, (1, 7)) == [1]



@pytest.mark.parametrize("where", ["generation_config.json", "config.json"])
def test_generation_stops_where_transformers_does(where: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """An end-of-turn id beside config.json's end of text, in generation_config.json (which transformers'
    generate reads first, as Llama 3 Instruct's folder has it) or, without that file, in config.json."""
    import json

    free, stop = free_run(tmp_path)
    gen = tmp_path / "generation_config.json"
    if where == "config.json":
        gen.unlink()
        edit_config(tmp_path, eos_token_id=[1, stop])
    else:
        gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [1, stop]}))
    stops_as_transformers(tmp_path, free, capsys)


PROMPT = "The quick"


def free_run(folder: Path) -> tuple[list[int], int]:
    """A one-layer Llama folder in ``folder`` and its greedy continuation of ``PROMPT`` with no stop id (8
    tokens), and the third of them (which a test makes an end-of-sequence id beside 1)."""
    ref = make_hf_dir(folder, "llama", seed=1, num_hidden_layers=1)
    ids = BPETokenizer(folder / "tokenizer.json").encode(PROMPT)
    with torch.no_grad():
        free = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8, eos_token_id=None,
                            pad_token_id=0)[0].tolist()[len(ids):]
    assert free[2] not in free[:2] + [1]
    return free, free[2]


def stops_as_transformers(folder: Path, free: list[int], capsys: pytest.CaptureFixture) -> None:
    """transformers' generate on ``folder`` as it is now stops after ``free``'s third token, and so does
    ``pipeoffload generate``, printing the same text."""
    tok = BPETokenizer(folder / "tokenizer.json")
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(folder).generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=8, pad_token_id=0)[0].tolist()
    assert want == ids + free[:3]
    assert main(["generate", f"hf:{folder}", "--prompt", PROMPT, "--tokens", "8", "--greedy"]) == 0
    assert capsys.readouterr().out == tok.decode(want) + "\n"


def test_a_run_keeps_the_generation_config_for_generate_and_export(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """A run from hf:DIR copies DIR's generation_config.json: `generate RUN` stops where transformers stops
    on the export, with DIR gone (generate and export read the run alone)."""
    import json
    import shutil

    from pipeoffload.train.generate import load_source
    from tests.hf_fixtures import TEXT

    src, run, data = tmp_path / "model", tmp_path / "run", tmp_path / "data.txt"
    make_hf_dir(src, "llama", num_hidden_layers=1)
    gen = src / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [1, 7]}))
    data.write_text(TEXT * 4)
    assert main(["train", "--model", f"hf:{src}", "--data", str(data), "--seq-len", "16", "--global-batch", "2",
                 "--microbatches", "1", "--steps", "1", "--out", str(run)]) == 0
    shutil.rmtree(src)
    assert load_source(run)[3] == (1, 7)
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "out").eos_token_id == [1, 7]
