"""An export of a run trained from hf:DIR carries DIR's chat template and generation defaults (session 17):
transformers >= 4.47 saves a tokenizer's chat template as chat_template.jinja, beside tokenizer_config.json,
and a model's generation_config.json holds its end-of-turn ids; the export dropped both."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeoffload.hfdir import open_hf_dir  # noqa: E402
from pipeoffload.models.hf import hf_model, save_hf  # noqa: E402
from pipeoffload.train.export import _tokenizer_files  # noqa: E402
from tests.hf_fixtures import make_hf_dir  # noqa: E402

TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"


def test_an_export_keeps_the_chat_template_and_generation_config(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ref = make_hf_dir(src, "qwen2", num_hidden_layers=1)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"), eos_token="</s>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(src)
    ref.generation_config.eos_token_id = [1, 0]  # an end-of-turn id besides config.json's eos
    ref.generation_config.save_pretrained(src)
    assert (src / "chat_template.jinja").is_file()
    hf = open_hf_dir(src)
    out = save_hf(tmp_path / "out", hf.shape, dict(hf_model(hf).named_parameters()), src / "tokenizer.json",
                  tokenizer_files=_tokenizer_files(f"hf:{src}"))
    back = transformers.AutoTokenizer.from_pretrained(out)
    chat = back.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert back.chat_template == TEMPLATE and chat == "<s>hi</s>" and back.eos_token == "</s>"
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == [1, 0]
