"""config.json's token ids (session 17): ``pad_token_id`` is the embedding's ``padding_idx`` as in
transformers (its row gets no gradient, tied head or not) and survives an export; ``eos_token_id`` (which
ends every document of the data) and ``pad_token_id`` must be JSON integers naming tokens of the
vocabulary, ``bos_token_id`` a JSON integer, else one line (exit 2) naming the field; a token file
with ids past the model's vocabulary is refused naming the model's tokenizer."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.hfdir import open_hf_dir  # noqa: E402
from pipeoffload.llama_config import LlamaShape  # noqa: E402
from pipeoffload.models import lm_loss  # noqa: E402
from pipeoffload.models.hf import hf_model  # noqa: E402
from tests.conftest import refused  # noqa: E402
from tests.hf_fixtures import edit_config, make_hf_dir  # noqa: E402

PAD = 1  # the fixtures' eos_token_id: pad = eos, as many checkpoints set it, and eos ends every document


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_pad_row_trains_as_in_transformers(kind: str, tmp_path: Path) -> None:
    """Gradients of a batch holding the pad token equal transformers': none on the embedding's pad row
    (the tied head's own gradient on it still counts: the two copies' gradients sum to transformers')."""
    ref = make_hf_dir(tmp_path, kind, num_hidden_layers=1, pad_token_id=PAD)
    ours = hf_model(open_hf_dir(tmp_path))
    tokens = torch.tensor([[5, PAD, 7, 9, PAD, 11, 3, 2]])
    lm_loss(ours.layers(tokens[:, :-1], None, 0), tokens[:, 1:]).backward()
    ref.train()
    lm_loss(ref(tokens[:, :-1]).logits, tokens[:, 1:]).backward()
    embed, head = ours.layers[0].embed_tokens.weight.grad, ours.layers[-1].lm_head.weight.grad
    want = ref.model.embed_tokens.weight.grad
    got = embed + head if kind == "qwen2" else embed
    assert not embed[PAD].any() and (got - want).abs().max() < 1e-6


def test_an_export_keeps_pad_token_id() -> None:
    shape = LlamaShape(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2, ffn_hidden=96, eos_token_id=[1, 2],
                       pad_token_id=-1)
    assert LlamaShape.from_hf(shape.to_hf()) == shape and shape.to_hf()["pad_token_id"] == -1


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "llama"
    make_hf_dir(path, "llama", num_hidden_layers=1)
    return path


@pytest.mark.parametrize("field, value, words", [
    ("eos_token_id", 5000, "is not a token id of vocab_size="), ("eos_token_id", -1, "is not a token id"),
    ("eos_token_id", [1, 5000], "holds 5000, which is not a token id"), ("eos_token_id", "1", "not an integer"),
    ("eos_token_id", 1.5, "not an integer"), ("pad_token_id", 5000, "is not a token id"),
    ("pad_token_id", True, "not an integer"), ("bos_token_id", "<s>", "not an integer"),
])
def test_a_bad_token_id_is_refused(llama_dir: Path, tmp_path: Path, field: str, value: object, words: str) -> None:
    copy = Path(shutil.copytree(llama_dir, tmp_path / "m"))
    edit_config(copy, **{field: value})
    refused(f"generate hf:{copy} --tokens 1", "config.json", f"{field}={value!r}", words)
    refused(f"estimate --model hf:{copy} --global-batch 8", f"{field}={value!r}", words)


def test_a_token_file_beyond_the_models_vocabulary_names_its_tokenizer(llama_dir: Path, tmp_path: Path) -> None:
    """Token ids past the model's vocab_size: the advice was "raise --vocab", which hf:DIR refuses."""
    import json

    import numpy as np

    vocab = json.loads((llama_dir / "config.json").read_text())["vocab_size"]
    ids = np.arange(4000, dtype=np.int32) % vocab
    ids[7] = vocab + 100
    np.save(tmp_path / "t.npy", ids)
    err = refused(f"train --model hf:{llama_dir} --data {tmp_path / 't.npy'} --seq-len 16 --global-batch 8 "
                  f"--steps 1 --out {tmp_path / 'run'}", f"holds token id {vocab + 100}", f"vocab_size={vocab}",
                  "tokenizer.json")
    assert "--vocab" not in err and not (tmp_path / "run").exists()
