"""Small defects of train and the Hugging Face reader (session 18): a resume that finds the disk full while
rewriting metrics.jsonl names its last checkpoint and how to continue; export and generate count as a
checkpoint only what the loader lists (step-N); rank 0's loggers are closed when the collective after
opening them fails, and the trainer's signal handlers restored when its progress bar cannot start;
generation_config.json read as transformers reads it; partial_rotary_factor refused where transformers
uses it."""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError

TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "4", "--microbatches", "2",
        "--eval-every", "1000", "--no-progress", "--save-every", "2", "--steps", "4"]


# ---- 1. a full disk while a resume rewrites metrics.jsonl ------------------------------------------------
class _FullDisk:
    """A file whose writes fail with ENOSPC (the real file is closed with it)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _disk_full_for_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: write_atomic's write of metrics.jsonl's temporary file fails with ENOSPC; every other
    file is written for real."""
    from pipeoffload import fileio

    real_mkstemp, real_fdopen = fileio.tempfile.mkstemp, fileio.os.fdopen
    metrics_fds: set[int] = set()

    def mkstemp(*args: Any, **kwargs: Any) -> tuple[int, str]:
        fd, name = real_mkstemp(*args, **kwargs)
        if os.path.basename(name).startswith(".metrics.jsonl."):
            metrics_fds.add(fd)
        return fd, name

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        handle = real_fdopen(fd, *args, **kwargs)
        if fd in metrics_fds:
            metrics_fds.discard(fd)
            return _FullDisk(handle)
        return handle

    monkeypatch.setattr(fileio.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(fileio.os, "fdopen", fdopen)


def test_a_full_disk_rewriting_metrics_for_a_resume_names_the_checkpoint_and_the_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeoffload.train.metrics import JsonlLogger, MetricsError

    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    path = run / "metrics.jsonl"
    before = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3))
    path.write_text(before)
    _disk_full_for_metrics(monkeypatch)
    with pytest.raises(MetricsError) as caught:
        JsonlLogger(path, 2)
    text = str(caught.value)
    assert len(text.splitlines()) == 1 and "no space left on device while rewriting" in text, text
    assert "the last complete checkpoint is step-000002" in text, text
    assert f"continue with: pipeoffload train --resume {run}" in text, text
    assert path.read_text() == before and sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]


def test_train_resume_on_a_full_disk_says_which_checkpoint_it_continues_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole command, one process: its last line names the checkpoint and the command to continue (it gave
    write_atomic's 'free space ... or choose another place', which names neither)."""
    pytest.importorskip("torch")
    run = tmp_path / "run"
    assert main(["train", *TINY, "--stop-at", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    _disk_full_for_metrics(monkeypatch)
    code = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 1 and "Traceback" not in err and "no space left on device while rewriting" in last, err
    assert "the last complete checkpoint is step-000002" in last, last
    assert f"continue with: pipeoffload train --resume {run}" in last and "another place" not in last, last


# ---- 3. one rule for a checkpoint folder's name ------------------------------------------------------------
@pytest.mark.parametrize("command", ["export", "generate"])
def test_a_step_folder_without_digits_is_no_checkpoint_for_export_or_generate(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step-abc").mkdir(parents=True)
    (run / "config.toml").write_text("")
    argv = [command, str(run), *(["--hf", str(tmp_path / "out")] if command == "export" else ["--prompt", "x"])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"RUN_DIR {str(run)!r}: no checkpoint under {run / 'checkpoints'}" in err[0], err


# ---- 4. rank 0's loggers when the collective after opening them fails --------------------------------------
def test_the_loggers_are_closed_when_the_collective_after_opening_them_fails(
        tmp_path: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer lost during the all-reduce that tells every rank rank 0 opened its loggers (fault injection: the
    real gloo message of a closed connection): fit() never gets them, so _open_loggers closes them."""
    import torch

    from pipeoffload.train import loop
    from pipeoffload.train.config import build_config
    from pipeoffload.train.mesh import PeerFailure, build_context
    from pipeoffload.train.metrics import TensorBoardLogger

    opened: list[Any] = []
    make_loggers = loop.make_loggers

    def spied(*args: Any) -> list[Any]:
        opened.extend(make_loggers(*args))
        return opened

    def lost(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    ctx = build_context(1, 1, 1, torch.device("cpu"), timeout=5)
    try:
        monkeypatch.setattr(loop, "make_loggers", spied)
        monkeypatch.setattr(loop.dist, "all_reduce", lost)
        trainer = types.SimpleNamespace(ctx=ctx, run_dir=tmp_path, cfg=build_config({"tensorboard": True}), step=0)
        with pytest.raises(PeerFailure):
            loop.Trainer._open_loggers(trainer, False)  # type: ignore[arg-type]
    finally:
        monkeypatch.undo()
        ctx.close()
    [board] = [lg for lg in opened if isinstance(lg, TensorBoardLogger)]
    assert board.writer.all_writers is None  # SummaryWriter.close() ran


def test_signal_handlers_are_restored_when_the_progress_bar_cannot_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """fit() made its progress bar after installing its SIGINT/SIGTERM handlers and opening the loggers, outside
    the try that restores and closes them: a bar that failed left the trainer's SIGINT handler in place."""
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "tqdm", None)  # an import of it fails
    before = signal.getsignal(signal.SIGINT)
    argv = [a for a in TINY if a != "--no-progress"]
    assert main(["train", *argv, "--out", str(tmp_path / "run")]) == 1
    assert "tqdm" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before


# ---- 5. generation_config.json and partial_rotary_factor, as transformers reads them ----------------------
def _gen(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("data", "ids"), [
    ({"eos_token_id": [[1, 7]]}, (1, 7)),  # a nested list: transformers stops at any id of the tensor it makes
    ({"eos_token_id": [[1], [7]]}, (1, 7)),
    ({"eos_token_id": []}, ()),
    ({"eos_token_id": None}, ()),  # the file replaces config.json's: transformers then stops at no id
    ({"do_sample": False}, ()),
    ({"eos_token_id": 7}, (7,)),
])
def test_generation_config_eos_forms_read_as_transformers_does(data: object, ids: tuple[int, ...],
                                                               tmp_path: Path) -> None:
    from pipeoffload.hfdir import stop_ids
    from pipeoffload.llama_config import LlamaShape

    shape = LlamaShape(vocab=100, hidden=32, layers=1, heads=2, eos_token_id=2)
    assert stop_ids(shape, _gen(tmp_path, data)) == ids
    assert stop_ids(shape, tmp_path / "absent.json") == (2,)


@pytest.mark.parametrize(("data", "words"), [
    ([{"eos_token_id": 7}], "holds a JSON list, not an object"),  # transformers cannot load it: TypeError
    ({"eos_token_id": [[1, 7], [2]]}, "eos_token_id=[[1, 7], [2]] is not a token id"),  # ragged: torch refuses
    ({"eos_token_id": [1, None]}, "is not a token id"),
    ({"eos_token_id": [1, 100]}, "vocab_size=100"),
])
def test_generation_config_forms_transformers_cannot_use_are_one_line(data: object, words: str,
                                                                      tmp_path: Path) -> None:
    from pipeoffload.hfdir import stop_ids
    from pipeoffload.llama_config import LlamaShape

    shape = LlamaShape(vocab=100, hidden=32, layers=1, heads=2, eos_token_id=2)
    with pytest.raises(ConfigError) as caught:
        stop_ids(shape, _gen(tmp_path, data))
    assert len(str(caught.value).splitlines()) == 1 and words in str(caught.value), caught.value


def test_generate_stops_where_transformers_does_with_a_nested_eos_list(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from tests.unit.test_generate_hf_s17 import free_run, stops_as_transformers

    free, stop = free_run(tmp_path)
    _gen(tmp_path, {"eos_token_id": [[1, stop]]})
    stops_as_transformers(tmp_path, free, capsys)


@pytest.mark.parametrize("where", ["top", "rope_parameters"])
def test_partial_rotary_factor_with_llama3_rope_is_refused_naming_it(where: str) -> None:
    """transformers' llama3 rope makes frequencies for that share of the head only (its Llama attention then
    fails on the shapes); ours rotates the whole head: refused, not silently ignored."""
    from pipeoffload.llama_config import LlamaShape

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
                           "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 96,
                           "rope_parameters": rope}
    if where == "top":
        cfg["partial_rotary_factor"] = 0.5
    else:
        rope["partial_rotary_factor"] = 0.5
    with pytest.raises(ConfigError) as caught:
        LlamaShape.from_hf(cfg)
    text = str(caught.value)
    assert len(text.splitlines()) == 1 and "partial_rotary_factor=0.5" in text and "whole head" in text, text
    rope["partial_rotary_factor"] = 1.0
    cfg.pop("partial_rotary_factor", None)
    assert LlamaShape.from_hf(cfg).rope_scaling is not None


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_partial_rotary_factor_with_the_default_rope_is_ignored_as_transformers_does(kind: str,
                                                                                    tmp_path: Path) -> None:
    """transformers' Llama, Qwen2 and Mistral compute their default rope over the whole head whatever the
    factor says: the folder is read, and our logits equal theirs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pipeoffload.hfdir import open_hf_dir
    from pipeoffload.models.hf import hf_model
    from tests.hf_fixtures import edit_config, make_hf_dir

    make_hf_dir(tmp_path, kind, seed=3, num_hidden_layers=1)
    edit_config(tmp_path, partial_rotary_factor=0.5)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours = hf_model(open_hf_dir(tmp_path)).eval()
    tokens = torch.randint(0, ref.config.vocab_size, (1, 20))
    with torch.no_grad():
        assert (ours.layers(tokens, None, 0) - ref(tokens).logits).abs().max().item() < 1e-5


# ---- found in the day's commits: config.json fields read otherwise than transformers reads them ------------
_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_rope_scaling_wins_over_rope_parameters_as_in_transformers(tmp_path: Path) -> None:
    """transformers' convert_rope_params_to_dict takes rope_scaling where both are set; ours took
    rope_parameters: another theta and no llama3 scaling, other logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pipeoffload.hfdir import open_hf_dir
    from pipeoffload.models.hf import hf_model
    from tests.hf_fixtures import edit_config, make_hf_dir

    make_hf_dir(tmp_path, "llama", seed=3, num_hidden_layers=1)
    edit_config(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, rope_scaling=_LLAMA3)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert ref.config.rope_parameters["rope_type"] == "llama3"
    hf = open_hf_dir(tmp_path)
    assert hf.shape.rope_scaling is not None and hf.shape.rope_theta == 500000.0
    tokens = torch.randint(0, ref.config.vocab_size, (1, 70))
    with torch.no_grad():
        assert (hf_model(hf).eval().layers(tokens, None, 0) - ref(tokens).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize(("fields", "window"), [
    ({}, 4096),  # MistralConfig's default where config.json leaves it out (ours: none)
    ({"sliding_window": 16, "use_sliding_window": False}, 16),  # a Qwen2 field: Mistral slides anyway
    ({"sliding_window": None}, 0),
])
def test_a_mistral_window_is_read_as_transformers_reads_it(fields: dict[str, Any], window: int) -> None:
    transformers = pytest.importorskip("transformers")
    from pipeoffload.llama_config import LlamaShape

    raw = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 100, "hidden_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           **fields}  # key/value heads given: MistralConfig reads 8 where absent, more than these 4 heads
    assert (transformers.MistralConfig.from_dict(raw).sliding_window or 0) == window
    assert LlamaShape.from_hf(raw).sliding_window == window
