"""Hugging Face directories in: per-tensor loading, greedy generation equal to transformers', refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pipeoffload.cli import main  # noqa: E402
from pipeoffload.errors import ConfigError  # noqa: E402
from pipeoffload.hfdir import INDEX, open_hf_dir  # noqa: E402
from pipeoffload.models.hf import hf_model  # noqa: E402
from pipeoffload.train.generate import continue_ids, load_source  # noqa: E402
from tests.hf_fixtures import edit_config, make_hf_dir  # noqa: E402


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("hf") / "qwen"
    return path, make_hf_dir(path, "qwen2", shard="60KB")  # tied, q/k/v biases, 11 shards


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("hf") / "llama"
    return path, make_hf_dir(path, "llama3", seed=3)  # one file, untied, llama3 rope scaling


@pytest.mark.parametrize("which", ["qwen", "llama"])
def test_loaded_model_equals_transformers(which: str, request) -> None:  # type: ignore[no-untyped-def]
    path, ref = request.getfixturevalue(which)
    ours = hf_model(open_hf_dir(path)).eval()
    tokens = torch.randint(0, ref.config.vocab_size, (2, 70))
    with torch.no_grad():
        diff = (ours.layers(tokens, None, 0) - ref(tokens).logits).abs().max().item()
    assert diff < 1e-5


@pytest.mark.parametrize("which", ["qwen", "llama"])
def test_greedy_continuation_equals_transformers(which: str, request) -> None:  # type: ignore[no-untyped-def]
    path, ref = request.getfixturevalue(which)
    model, tokenizer, context, eos = load_source(f"hf:{path}")
    ids = tokenizer.encode("The quick brown fox")  # type: ignore[attr-defined]
    ours = continue_ids(model, ids, 24, context=context, greedy=True, eos=eos)
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24, pad_token_id=eos[0])[0].tolist()
    assert ours == want and len(ours) > len(ids)


def test_generate_cli_greedy(qwen, capsys) -> None:  # type: ignore[no-untyped-def]
    path, ref = qwen
    assert main(["generate", f"hf:{path}", "--prompt", "The quick", "--tokens", "8", "--greedy"]) == 0
    text = capsys.readouterr().out.strip()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tok.encode("The quick").ids
    want = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8, pad_token_id=1)[0].tolist()
    assert text == tok.decode(want)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("edit, fragment", [
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 0, "layer_types": None},
     "sliding_window=4096"),
    ({"num_local_experts": 8}, "num_local_experts=8"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type='yarn'"),
    ({"architectures": ["GPT2LMHeadModel"]}, "architectures=['GPT2LMHeadModel']"),
    ({"intermediate_size": 128}, "model.layers.0.mlp.gate_proj.weight has shape (96, 64)"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_unsupported_fields_are_refused(qwen, tmp_path, capsys, edit, fragment) -> None:  # type: ignore[no-untyped-def]
    path = _copy(qwen[0], tmp_path / "m")
    edit_config(path, **edit)
    assert main(["generate", f"hf:{path}", "--tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


def test_missing_tensor_and_truncated_file_are_refused(qwen, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _copy(qwen[0], tmp_path / "m")
    index = json.loads((path / INDEX).read_text())
    victim = index["weight_map"].pop("model.layers.2.self_attn.k_proj.bias")
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"tensor model\.layers\.2\.self_attn\.k_proj\.bias is missing"):
        open_hf_dir(path)
    index["weight_map"]["model.layers.2.self_attn.k_proj.bias"] = victim
    (path / INDEX).write_text(json.dumps(index))
    open_hf_dir(path)
    data = (path / victim).read_bytes()
    (path / victim).write_bytes(data[:-100])
    with pytest.raises(ConfigError, match=f"{victim}: truncated"):
        open_hf_dir(path)


def test_missing_directory_is_not_downloaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="never downloaded"):
        open_hf_dir(tmp_path / "meta-llama/Llama-3-8B")


def test_each_rank_reads_only_its_tensors(qwen, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Loading a subset of parameters opens only the files holding them and reads only those tensors."""
    import safetensors

    from pipeoffload.models import hf as hf_module

    path, _ = qwen
    hf = open_hf_dir(path)
    read: list[str] = []
    real = safetensors.safe_open

    class Spy:
        def __init__(self, name: str, **kw: object) -> None:
            self.inner = real(name, **kw)

        def __enter__(self):  # type: ignore[no-untyped-def]
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

        def get_slice(self, name: str):  # type: ignore[no-untyped-def]
            read.append(name)
            return self.inner.get_slice(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    block = torch.nn.Linear(64, 96, bias=False)
    hf_module.load_parameters(hf, {"layers.2.mlp.gate_proj.weight": block.weight})
    assert read == ["model.layers.1.mlp.gate_proj.weight"]


@pytest.mark.parametrize("edit, flags, fragment", [
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 0, "layer_types": None}, [],
     "sliding_window=4096"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, [], "rope_type='yarn'"),
    ({}, ["--layers", "7"], "layers=7"),
    ({}, ["--tokenizer", "bpe:300"], "brings its own tokenizer"),
    ({}, ["--tp", "4", "--nproc", "4"], "tp=4"),
])
def test_train_refuses_a_bad_hf_dir_before_any_rank(qwen, tmp_path, capsys, edit, flags,  # type: ignore[no-untyped-def]
                                                    fragment) -> None:
    path = _copy(qwen[0], tmp_path / "m")
    edit_config(path, **edit)
    out = tmp_path / "run"
    assert main(["train", "--model", f"hf:{path}", "--out", str(out), "--steps", "1", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert not out.exists()


def test_an_export_from_an_hf_source_keeps_its_special_tokens(tmp_path: Path) -> None:
    """The source folder's tokenizer_config.json (its eos token) travels with an export of a run trained
    from it: without it transformers' tokenizer of the export had no eos_token (probe F)."""
    from pipeoffload.models.hf import save_hf
    from pipeoffload.train.export import _tokenizer_files

    src = tmp_path / "src"
    make_hf_dir(src, "llama")
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "</s>", "bos_token": "<s>"}))
    files = _tokenizer_files(f"hf:{src}")
    # (no special_tokens_map.json there; save_pretrained wrote generation_config.json)
    assert [f.name for f in files] == ["tokenizer_config.json", "generation_config.json"]
    hf = open_hf_dir(src)
    state = dict(hf_model(hf).named_parameters())
    out = save_hf(tmp_path / "out", hf.shape, state, src / "tokenizer.json", tokenizer_files=files)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "</s>" and tok.eos_token_id == tok.convert_tokens_to_ids("</s>")
    assert _tokenizer_files("llama") == []
