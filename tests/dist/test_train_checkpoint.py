"""Checkpoints of `pipeoffload train`: bit-identical resume (also onto another layout), corrupted
checkpoints refused with exit 2, SIGTERM leaves a complete last checkpoint."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeoffload.train.checkpoint import list_checkpoints, verify

pytestmark = pytest.mark.dist

SMALL = ["--layers", "2", "--hidden", "32", "--seq-len", "32", "--global-batch", "8", "--microbatches", "2",
         "--eval-every", "2", "--warmup", "1", "--lr", "3e-3", "--no-progress", "--save-every", "2"]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", "train", *args], capture_output=True, text=True,
                          timeout=timeout)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 4-step run, and the same run stopped after step 2, its checkpoints written in the background
    (``--async-save``: every resume below starts from one, to the synchronous run's losses)."""
    base = tmp_path_factory.mktemp("ckpt")
    full, stopped = base / "full", base / "stopped"
    for out, extra in ((full, []), (stopped, ["--stop-at", "2", "--async-save"])):
        done = cli(*SMALL, "--steps", "4", "--out", str(out), *extra)
        assert done.returncode == 0, done.stderr
    return {"full": full, "stopped": stopped}


def test_resume_is_bit_identical(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    assert [m["step"] for m in metrics(run)] == [1, 2]
    done = cli("--resume", str(run))  # stop_at belongs to one invocation: not saved, not inherited
    assert done.returncode == 0, done.stderr
    assert metrics(run) and [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(runs["full"])]
    assert [m["val_loss"] for m in metrics(run)] == [m["val_loss"] for m in metrics(runs["full"])]


def test_resume_saving_in_the_background_completes_the_last_save_at_the_end(runs: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    """--async-save on resume too: the losses of the uninterrupted synchronous run, and the last
    checkpoint (saved at the end, awaited before the run returns) complete and verified."""
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    assert [p.name for p in list_checkpoints(run)] == ["step-000002"]
    done = cli("--resume", str(run), "--async-save")
    assert done.returncode == 0, done.stderr
    assert [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(runs["full"])]
    assert [p.name for p in list_checkpoints(run)] == ["step-000002", "step-000004"]
    verify(list_checkpoints(run)[-1])
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_a_run_saved_in_the_flat_format_resumes_bit_identically(runs: dict[str, Path], tmp_path: Path) -> None:
    """A run written before the config had sections: a flat config.toml (with the stop_at that was saved
    then) and a manifest whose fingerprint lacks the later model keys still resumes, to the same losses."""
    from pipeoffload.train.config import FINGERPRINT_KEYS, build_config, load_toml

    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    flat = {**load_toml(run / "config.toml"), "stop_at": 2}
    (run / "config.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in flat.items()))
    manifest_path = list_checkpoints(run)[-1] / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    old_keys = FINGERPRINT_KEYS[:FINGERPRINT_KEYS.index("global_batch") + 1]
    manifest["fingerprint"] = {k: v for k, v in manifest["fingerprint"].items() if k in old_keys}
    manifest_path.write_text(json.dumps(manifest))
    assert build_config(load_toml(run / "config.toml")).run.stop_at == 2  # the old file says stop at 2
    done = cli("--resume", str(run))
    assert done.returncode == 0, done.stderr
    assert [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(runs["full"])]


def test_resume_onto_another_layout_is_resharded(runs: dict[str, Path], tmp_path: Path) -> None:
    """Saved by one process, resumed on 2 pipeline ranks (zb-v, offload all): DCP reshards by name. The
    layouts differ only in float rounding (the order of the gradient norm's sum), which over these two
    steps leaves the losses equal to the uninterrupted run's; the resume says it is not bitwise."""
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    done = cli("--resume", str(run), "--pp", "2", "--nproc", "2", "--schedule", "zb-v", "--offload", "all")
    assert done.returncode == 0, done.stderr
    assert "resharding from pp=1 schedule=1f1b stages_per_rank=1 to pp=2 schedule=zb-v stages_per_rank=2" \
        in done.stderr and "not bitwise" in done.stderr
    assert "# overriding" in done.stdout and "pp 1 -> 2" in done.stdout  # what the flags changed, listed
    assert [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(runs["full"])]
    for m in metrics(run)[2:]:  # zb-v with offload all: measured = simulated (W's share measured too)
        assert m["peak_act_bytes"] == [int(x) for x in m["sim_peak_act_bytes"]]


def test_a_new_steps_on_resume_needs_extend_and_is_a_new_lr_schedule(runs: dict[str, Path], tmp_path: Path) -> None:
    """--steps sets the cosine: a finished 4-step run resumed with --steps 6 is refused without --extend;
    with it the LR of steps 5-6 is that of a 6-step schedule (a documented jump), never silently."""
    from pipeoffload.train.config import build_config, load_saved
    from pipeoffload.train.optim import lr_at

    run = tmp_path / "run"
    shutil.copytree(runs["full"], run)
    done = cli("--resume", str(run), "--steps", "6")
    assert done.returncode == 2 and "--extend" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = cli("--resume", str(run))
    assert done.returncode == 2 and "finished" in done.stderr and "--extend" in done.stderr
    done = cli("--resume", str(run), "--steps", "6", "--extend")
    assert done.returncode == 0, done.stderr
    cfg = build_config(load_saved(run))
    assert cfg.run.steps == 6
    assert [m["lr"] for m in metrics(run)][4:] == [lr_at(cfg, 5), lr_at(cfg, 6)]


def test_checkpoint_of_another_model_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    done = cli("--resume", str(run), "--hidden", "64")
    assert done.returncode == 2
    assert "hidden=32" in done.stderr and "hidden=64" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("damage", ["truncate", "delete-manifest"])
def test_corrupted_checkpoint_is_refused_with_exit_2(runs: dict[str, Path], tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    last = list_checkpoints(run)[-1]
    if damage == "truncate":
        data = next(last.glob("*.distcp"))
        data.write_bytes(data.read_bytes()[:100])
    else:
        (last / "manifest.json").unlink()
    done = cli("--resume", str(run))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoint" in lines[0] and "Traceback" not in done.stderr
    assert ("checksum" in lines[0]) if damage == "truncate" else ("manifest.json" in lines[0])


@pytest.mark.parametrize("edit,named", [
    (lambda m: [], "JSON list"),
    (lambda m: {**m, "files": list(m["files"])}, "'files'"),
    (lambda m: {**m, "step": str(m["step"])}, "'step'"),
    (lambda m: {**m, "files": {k: v for k, v in m["files"].items() if k != "__0_0.distcp"}}, "__0_0.distcp"),
])
def test_a_malformed_or_edited_manifest_is_refused_in_one_line(runs: dict[str, Path], tmp_path: Path, edit,
                                                                named: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    last = list_checkpoints(run)[-1]
    manifest = json.loads((last / "manifest.json").read_text())
    if named == "__0_0.distcp":
        (last / named).unlink()  # a deleted shard, hidden by the edited manifest
    (last / "manifest.json").write_text(json.dumps(edit(manifest)))
    done = cli("--resume", str(run))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "manifest.json" in lines[0] and named in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_random_states_are_tensors_loaded_without_unpickling_code(runs: dict[str, Path]) -> None:
    import torch

    rng = list_checkpoints(runs["stopped"])[-1] / "rng-rank0.pt"
    state = torch.load(rng, weights_only=True)  # raises for anything but tensors and plain containers
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_sigterm_saves_a_complete_checkpoint_and_exits(tmp_path: Path) -> None:
    run = tmp_path / "run"
    small = SMALL[:SMALL.index("--save-every")] + SMALL[SMALL.index("--save-every") + 2:]  # an option is given once
    proc = subprocess.Popen([sys.executable, "-m", "pipeoffload", "train", *small, "--steps", "500",
                             "--save-every", "1000", "--pp", "2", "--nproc", "2", "--out", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted" in out and "--resume" in out
    checkpoints = list_checkpoints(run)
    assert len(checkpoints) == 1
    manifest = verify(checkpoints[0])  # complete: every file present and matching its checksum
    assert manifest["step"] == metrics(run)[-1]["step"] < 500
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_resume_onto_zero_sharded_replicas(runs: dict[str, Path], tmp_path: Path) -> None:
    """The one-process checkpoint resumed on 2 data-parallel replicas with ZeRO-1 (AdamW's state
    loaded into each replica's shard): the same losses up to the replicas' reduction order."""
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    done = cli("--resume", str(run), "--stop-at", "0", "--dp", "2", "--zero", "1", "--nproc", "2")
    assert done.returncode == 0, done.stderr
    got, ref = [m["loss"] for m in metrics(run)], [m["loss"] for m in metrics(runs["full"])]
    assert got[:2] == ref[:2] and max(abs(a - b) for a, b in zip(got, ref)) < 1e-6


@pytest.mark.parametrize("zero", [False, True])
def test_an_optimizer_option_given_on_resume_is_the_one_used(runs: dict[str, Path], tmp_path: Path,
                                                              zero: bool) -> None:
    """--weight-decay on resume is written to config.toml and used from the resume on (the checkpoint's
    parameter groups carried the old value, which won before): another value gives other losses than
    the uninterrupted run after the resume, the same value the same bits. With ZeRO-1 too."""
    from pipeoffload.train.config import build_config, load_saved

    layout = ["--dp", "2", "--zero", "1", "--nproc", "2"] if zero else []
    full = metrics(runs["full"])
    for decay, same in (("0.1", True), ("5", False)):
        run = tmp_path / f"decay{decay}"
        shutil.copytree(runs["stopped"], run)
        done = cli("--resume", str(run), "--weight-decay", decay, *layout)
        assert done.returncode == 0, done.stderr
        assert build_config(load_saved(run)).optim.weight_decay == float(decay)
        got = metrics(run)
        assert [m["loss"] for m in got[:2]] == [m["loss"] for m in full[:2]]  # the records kept
        # step 3: the saved weights; its loss is one process's mean over the microbatches, or (ZeRO's two
        # replicas) the mean of each replica's mean: the same bits, or the same up to that rounding
        assert got[2]["loss"] == full[2]["loss"] if not zero else abs(got[2]["loss"] - full[2]["loss"]) < 1e-6
        if same and not zero:
            assert [(m["loss"], m["val_loss"]) for m in got] == [(m["loss"], m["val_loss"]) for m in full]
        elif same:  # ZeRO's replicas reduce in another order: equal up to rounding
            assert abs(got[3]["loss"] - full[3]["loss"]) < 1e-6
        else:
            assert abs(got[3]["loss"] - full[3]["loss"]) > 1e-4 and abs(got[3]["val_loss"] - full[3]["val_loss"]) > 1e-4
