"""`pipeoffload train` problems a user probe (probe D) found: checkpoint order past step 999,999, input
refused only after the ranks started, the data and tokenizer behind a resume, the launcher's last words."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.train.checkpoint import PendingSave, latest_checkpoint, list_checkpoints
from pipeoffload.train.config import build_config
from tests.conftest import one_line_error, train_process


def _text(folder: Path) -> Path:
    path = folder / "text.txt"
    path.write_text(" ".join(f"word{i % 97}" for i in range(20_000)))
    return path


# ---- 1: checkpoints in step order, not name order ---------------------------------------------------------
def test_checkpoints_past_step_999999_are_ordered_by_step(tmp_path: Path) -> None:
    for step in (999998, 999999, 1000000):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-999998", "step-999999", "step-1000000"]
    assert latest_checkpoint(tmp_path).name == "step-1000000"


def test_keep_prunes_the_oldest_checkpoint_not_the_one_just_written(tmp_path: Path) -> None:
    cfg = build_config({"keep": 2})
    for step in (999998, 999999):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    pending = PendingSave(tmp_path, 1000000, cfg, rank=0, world=1, extra={}, device=None)
    pending.tmp.mkdir()
    (pending.tmp / "x.distcp").write_bytes(b"0")
    pending._finish()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-999999", "step-1000000"]
    assert json.loads((tmp_path / "checkpoints" / "step-1000000" / "trainer.json").read_text())["step"] == 1000000


# ---- 10: --out that cannot be made, and the memory hint ---------------------------------------------------
def test_an_out_that_cannot_be_made_is_one_line_before_the_configuration(tmp_path: Path) -> None:
    done = train_process("--data", str(_text(tmp_path)), "--steps", "2", "--out", "/proc/pipeoffload-probe-d/run")
    line = one_line_error(done)
    assert "out='/proc/pipeoffload-probe-d/run'" in line and "--out" in line
    assert done.stdout == ""  # the configuration is not printed before the refusal


def test_the_memory_refusal_blames_the_microbatch_when_it_is_the_cost() -> None:
    from pipeoffload.train.config import validate
    from pipeoffload.train.preflight import DataFacts, check_memory

    cfg = validate(build_config({"global_batch": 4_000_000, "microbatches": 1}))
    with pytest.raises(ConfigError) as info:
        check_memory(cfg, DataFacts(tokens=10**6, vocab=256, resident_bytes=0), available=4 << 30)
    message = info.value.in_words(FLAGS)  # the command line's words (the Python API names global_batch=...)
    assert "--global-batch" in message and "--microbatches" in message
    assert "global_batch" in str(info.value) and "microbatches" in str(info.value)
    assert "make the model" not in message and "--eval-batches smaller" not in message


# ---- 6: a bad .jsonl line before anything is written ---------------------------------------------------
@pytest.mark.parametrize("bad,named", [("not json", "not a JSON object"), ('{"txt": "x"}', "no string field 'text'")])
@pytest.mark.parametrize("folder", [False, True])
def test_a_bad_jsonl_line_is_refused_before_anything_is_written(tmp_path: Path, bad: str, named: str,
                                                                folder: bool) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = [json.dumps({"text": f"document {i} " + "word " * 50}) for i in range(200)]
    (data / "bad.jsonl").write_text("\n".join(lines[:50] + [bad] + lines[50:]) + "\n")
    out = tmp_path / "run"
    done = train_process("--data", str(data if folder else data / "bad.jsonl"), "--layers", "2", "--hidden", "32",
                "--seq-len", "32", "--steps", "2", "--no-progress", "--out", str(out))
    line = one_line_error(done)
    assert "bad.jsonl:51" in line and named in line
    assert not out.exists()


# ---- runs to resume ------------------------------------------------------------------------------------
TINY = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "4", "--microbatches", "2",
        "--eval-every", "2", "--no-progress", "--save-every", "2", "--steps", "4"]


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-rank run with a BPE tokenizer, stopped (and saved) after step 2 of 4."""
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    base = tmp_path_factory.mktemp("bpe")
    run = base / "run"
    done = train_process("--data", str(_text(base)), "--tokenizer", "bpe:300", *TINY, "--stop-at", "2", "--out", str(run))
    assert done.returncode == 0, done.stderr
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


# ---- 7: the run's tokenizer.json is covered --------------------------------------------------------------
@pytest.mark.parametrize("old_manifest", [False, True])
def test_a_corrupted_tokenizer_is_refused_before_the_ranks_start(bpe_run: Path, tmp_path: Path,
                                                                 old_manifest: bool) -> None:
    run = _copy(bpe_run, tmp_path)
    if old_manifest:  # a checkpoint written before the manifest held the tokenizer's checksum
        manifest_path = list_checkpoints(run)[-1] / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest.pop("run_files", None)
        manifest_path.write_text(json.dumps(manifest))
    (run / "tokenizer.json").write_text('{"x":')
    config = (run / "config.toml").read_text()
    line = one_line_error(train_process("--resume", str(run)))
    assert "tokenizer.json" in line and ("checksum" in line or "not a readable tokenizer" in line)
    assert "starting" not in line and (run / "config.toml").read_text() == config


def test_an_edited_tokenizer_is_refused_by_its_checksum(bpe_run: Path, tmp_path: Path) -> None:
    run = _copy(bpe_run, tmp_path)
    tok = json.loads((run / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first, second = list(vocab)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # still a valid tokenizer, other ids
    (run / "tokenizer.json").write_text(json.dumps(tok))
    line = one_line_error(train_process("--resume", str(run)))
    assert "tokenizer.json" in line and "checksum" in line


# ---- 4: the data's content, not only its path -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_data_changed_under_the_same_path_is_refused_naming_data(tmp_path: Path, kind: str) -> None:
    import numpy as np

    pytest.importorskip("torch")
    if kind == "text":
        data = _text(tmp_path)
    else:
        data = tmp_path / "tokens.bin"
        np.random.default_rng(0).integers(0, 200, 20_000).astype(np.uint16).tofile(data)
    run = tmp_path / "run"
    done = train_process("--data", str(data), *TINY, "--stop-at", "2", "--out", str(run))
    assert done.returncode == 0, done.stderr
    if kind == "text":
        data.write_text(" ".join(f"other{i % 89}" for i in range(20_000)))
    else:
        np.random.default_rng(1).integers(0, 400, 20_000).astype(np.uint16).tofile(data)  # a larger vocabulary
    line = one_line_error(train_process("--resume", str(run)))
    assert line.startswith(f"pipeoffload train: error: data='{data}'") or f"data='{data}'" in line
    assert "changed" in line and "starting" not in line


def test_a_manifest_without_the_data_content_still_resumes(tmp_path: Path) -> None:
    from pipeoffload.train.checkpoint import check_compatible
    from pipeoffload.train.config import fingerprint, validate

    cfg = validate(build_config({"data": str(_text(tmp_path))}))
    check_compatible({"fingerprint": fingerprint(cfg)}, cfg, tmp_path / "checkpoints" / "step-000002")


# ---- 5: the launcher names the checkpoint that exists -------------------------------------------------------
def test_an_interrupted_launcher_names_the_checkpoint_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C: the ranks are killed before reporting back, but step-000044 was saved."""
    import signal

    import pipeoffload.runtime.launch as runtime
    from pipeoffload.runtime.launch import SpawnResult
    from pipeoffload.train import launch

    (tmp_path / "checkpoints" / "step-000040").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-000044").mkdir()
    monkeypatch.setattr(runtime, "spawn", lambda *a, **k: SpawnResult(
        exitcodes=[-9, -9], results=[None, None], errors=[None, None], interrupted=signal.SIGINT))
    cfg = build_config({"pp": 2, "nproc": 2, "out": str(tmp_path)})
    with pytest.raises(launch.Interrupted) as info:
        launch._spawned(lambda *a: None, cfg, (), False)
    message = str(info.value)
    assert "step-000044" in message and f"--resume {tmp_path}" in message
    assert "before the ranks could save" not in message


# ---- 12: SIGTERM before the ranks start; --stop-at below the checkpoint ---------------------------------------
def train_terminated_in(module: str, name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``pipeoffload train`` (TINY, a run in ``folder``) sending itself SIGTERM as ``module.name`` is called."""
    script = f"""
import os, signal, sys
import {module} as patched
real = patched.{name}
def {name}(*a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*a, **k)
patched.{name} = {name}
from pipeoffload.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""
    return subprocess.run([sys.executable, "-c", script, "--data", str(_text(folder)), *TINY, "--out",
                           str(folder / "run")], capture_output=True, text=True, timeout=300)


def test_sigterm_before_the_ranks_start_says_interrupted(tmp_path: Path) -> None:
    done = train_terminated_in("pipeoffload.train.job", "prepare_run", tmp_path)  # the launcher's first second
    assert done.returncode == 143, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeoffload train: interrupted (SIGTERM)") and "no checkpoint" in last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stop_at", ["1", "2"])
def test_stop_at_not_above_the_checkpoint_is_refused(bpe_run: Path, tmp_path: Path, stop_at: str) -> None:
    run = _copy(bpe_run, tmp_path)  # saved at step 2
    line = one_line_error(train_process("--resume", str(run), "--stop-at", stop_at))
    assert f"stop_at={stop_at}" in line and "step-000002" in line and "above 2" in line
    assert [p.name for p in list_checkpoints(run)] == ["step-000002"]


# ---- 11: what a resume changes is said --------------------------------------------------------------------
def _saved_run(tmp_path: Path) -> Path:
    from pipeoffload.train.config import to_toml, validate

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(validate(build_config({"data": str(_text(tmp_path))}))))
    return run


@pytest.mark.parametrize("flag,value,words", [
    ("--lr", "0.01", "lr 0.0003 -> 0.01"), ("--warmup", "2", "warmup 20 -> 2"),
    ("--min-lr-ratio", "0.5", "min_lr_ratio 0.1 -> 0.5"), ("--clip", "0.5", "clip 1.0 -> 0.5"),
    ("--microbatches", "2", "microbatches 4 -> 2"),
])
def test_a_resume_that_changes_the_arithmetic_says_it_is_not_bitwise(tmp_path: Path, flag: str, value: str,
                                                                     words: str) -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    run = _saved_run(tmp_path)
    _, notes = resolve(build_parser().parse_args(["train", "--resume", str(run), flag, value]))
    said = [n for n in notes if n.startswith(words)]
    assert len(said) == 1 and "not bitwise" in said[0], notes
    _, plain = resolve(build_parser().parse_args(["train", "--resume", str(run)]))
    assert not any("bitwise" in n for n in plain)


def test_a_resume_on_another_layout_says_it_is_not_bitwise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pipeoffload.train.config import layout, validate
    from pipeoffload.train.job import _note_reshard

    cfg = validate(build_config({"data": str(_text(tmp_path))}))
    saved = {"layout": {**layout(cfg), "pp": 2}}
    with caplog.at_level("WARNING", logger="pipeoffload.train.job"):
        _note_reshard(saved, cfg, tmp_path / "checkpoints" / "step-000006")
    assert "resharding from pp=2 to pp=1" in caplog.text and "float rounding" in caplog.text
    assert "not bitwise" in caplog.text


def test_a_resume_on_another_schedule_alone_stays_bitwise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A new schedule and stage split on the same parallel degrees moves the stages, not the sums: the
    resume is bitwise (probe M: 1f1b stopped at 3, resumed as zb-v with offload all, equal to an uninterrupted
    zb-v run's losses, norms and parameters), and no warning says otherwise."""
    from pipeoffload.train.config import layout, validate
    from pipeoffload.train.job import _note_reshard

    cfg = validate(build_config({"data": str(_text(tmp_path))}))
    saved = {"layout": {**layout(cfg), "schedule": "zb-v", "stages_per_rank": 2}}
    with caplog.at_level("INFO", logger="pipeoffload.train.job"):
        _note_reshard(saved, cfg, tmp_path / "checkpoints" / "step-000006")
    assert "resharding from schedule=zb-v stages_per_rank=2 to schedule=1f1b stages_per_rank=1" in caplog.text
    assert "continue bitwise" in caplog.text and "not bitwise" not in caplog.text
    assert all(r.levelname == "INFO" for r in caplog.records)


@pytest.mark.parametrize("case", ["little text", "no checkpoint"])
def test_a_refusal_after_the_values_is_one_line_without_the_configuration(tmp_path: Path, case: str) -> None:
    if case == "little text":
        data = tmp_path / "short.txt"
        data.write_text("too short")
        done = train_process("--data", str(data), "--steps", "2", "--out", str(tmp_path / "run"))
    else:
        done = train_process("--resume", str(_saved_run(tmp_path)))
    line = one_line_error(done)
    assert ("data:" in line) if case == "little text" else ("no checkpoint" in line)
    assert done.stdout == ""


# ---- 8 and 12 (helpers of the other half of the probe, called here) --------------------------------------------
def test_the_last_line_dates_an_earlier_val_loss_and_an_earlier_runs_metrics_are_announced(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0}) + "\n" for s in (1, 2, 3)))
    done = train_process("--data", str(_text(tmp_path)), *TINY, "--stop-at", "3", "--out", str(run))
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"run {run}: step 3, loss ") and "(step 2)" in last, last  # validated at step 2
    assert "held 3 records of an earlier run" in done.stderr
