"""`pipeoffload train` refuses a bad configuration in one line, exit 2, before any rank starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig, build_config, load_toml, to_toml, validate
from pipeoffload.train.data import Corpus, default_text_files


@pytest.mark.parametrize("flags, words", [
    (["--pp", "2", "--dp", "2", "--nproc", "3"], ["nproc=3", "dp*pp*tp"]),
    (["--global-batch", "6", "--dp", "4"], ["global_batch=6", "dp=4"]),
    (["--microbatches", "3", "--global-batch", "8"], ["microbatches=3"]),
    (["--schedule", "nope"], ["nope", "valid names"]),
    (["--offload", "sometimes"], ["offload", "sometimes"]),
    (["--hidden", "30", "--heads", "4"], ["hidden=30", "heads=4"]),
    (["--tokenizer", "words"], ["tokenizer", "bpe:N"]),
    (["--zero", "2"], ["zero=2"]),
    (["--fsdp"], ["--fsdp with --dp 1", "--dp 2"]),
    (["--pp", "2"], ["dp*pp*tp", "--nproc 2"]),
    (["--offload", "all", "--max-stall", "5"], ["--max-stall 5: needs --offload-ratio > 0", "--offload-ratio 0.7"]),
    (["--max-stall", "5"], ["--max-stall 5", "--offload is none"]),
])
def test_bad_value_one_line_exit_2_and_no_rank_started(tmp_path: Path, flags: list[str], words: list[str]) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "train", *flags, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()  # nothing was started or written


@pytest.mark.parametrize("keys, words", [
    ({"dp": 2, "zero": 1}, ["fsdp=true with zero=1", "choose one (set zero=0 or fsdp=false)"]),
    ({"dp": 2, "tp": 2}, ["fsdp=true with tp=2", "use tp=1 or set fsdp=false"]),
    # pp = 1 here: the message must not speak of pipeline ranks, and must give a fix that works (probe O)
    ({"dp": 2, "model": "llama", "tie_embeddings": True},
     ["fsdp=true with tie_embeddings=true", "set fsdp=false or tie_embeddings=false"]),
])
def test_fsdp_refuses_what_it_does_not_support(keys: dict, words: list[str]) -> None:
    cfg = TrainConfig.build(fsdp=True, global_batch=8, microbatches=2, **keys)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value), str(err.value)
    assert validate(cfg.updated(fsdp=False)).parallel.fsdp is False  # the rest of the layout is fine


def test_toml_round_trip_and_flags_override(tmp_path: Path) -> None:
    cfg = validate(TrainConfig.build(schedule="zb-v", pp=2, microbatches=4, global_batch=8, layers=4))
    assert cfg.schedule.stages_per_rank == 2  # the family's own default
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = build_config(load_toml(path))
    assert again == cfg
    assert build_config(load_toml(path), {"pp": 4, "steps": None}).parallel.pp == 4


def test_unknown_key_and_bad_type_are_named(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('pipline = 2\n')
    with pytest.raises(ConfigError, match="unknown config key 'pipline'"):
        build_config(load_toml(path))
    with pytest.raises(ConfigError, match="steps='many'"):
        build_config({"steps": "many"})


def test_data_order_is_seeded_and_sharded_over_replicas() -> None:
    corpus = Corpus(np.arange(10_000, dtype=np.uint16) % 251, 251, 16, 0.1)
    a = corpus.train_indices(3, 8, seed=1)
    assert np.array_equal(a, corpus.train_indices(3, 8, seed=1))
    assert not np.array_equal(a, corpus.train_indices(3, 8, seed=2))
    x0, _ = corpus.train_batch(3, 8, 1, dp=2, dp_rank=0)
    x1, _ = corpus.train_batch(3, 8, 1, dp=2, dp_rank=1)
    whole, targets = corpus.batch(a)
    assert np.array_equal(np.concatenate([x0, x1]), whole)
    assert np.array_equal(whole[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert (corpus.num_train * 16 + 1) <= corpus.val_start  # training windows end before the held-out tail
    epoch = np.concatenate([corpus.train_indices(s, 8, 0) for s in range(corpus.num_train // 8)])
    assert len(set(epoch.tolist())) == len(epoch)  # an epoch visits each window once


@pytest.mark.parametrize("tokens", [0, 1, 17])
def test_too_little_text_names_what_it_gives_never_a_negative_count(tokens: int) -> None:
    with pytest.raises(ConfigError, match=rf"data: {tokens} tokens give 0 training and 0 validation sequences "
                                          r"of seq_len=16; use more text"):
        Corpus(np.zeros(tokens, dtype=np.uint16), 251, 16, 0.1)


def test_default_text_is_real_python_source() -> None:
    files = default_text_files()
    assert files == sorted(files) and all(f.suffix == ".py" for f in files)
    assert "def " in files[0].read_text() or "import" in files[0].read_text()


def _rglob_text_files(root: Path, limit_bytes: int) -> list[Path]:
    """``default_text_files`` as it was written first: every ``.py`` path of the tree, sorted, then filtered."""
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if any(part in ("test", "tests", "site-packages", "idlelib", "lib2to3") for part in path.relative_to(root).parts):
            continue
        size = path.stat().st_size
        if total + size > limit_bytes:
            break
        chosen.append(path)
        total += size
    return chosen


def test_default_text_files_are_those_of_sorted_rglob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk that skips test folders and stops at the limit chooses the very files, in the very order, of
    filtering ``sorted(rglob("*.py"))`` (the data a run without --data trains on, and its manifests' data_content):
    on the standard library, and on a tree whose names sort differently as paths and as text ("a/z.py" before
    "a-b.py"), with skipped folders at any depth, a folder named like a file and a linked folder (not entered)."""
    import sysconfig

    from pipeoffload.train import data

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert default_text_files() == _rglob_text_files(stdlib, data.DEFAULT_TEXT_BYTES)
    for rel in ["a/z.py", "a-b.py", "a.py", "a/b/tests/x.py", "a/b/c.py", "tests/y.py", "d.py/e.py", "B.py",
                "lib/site-packages/f.py", "lib/g.txt", "lib/h.py", "_i.py", ".j.py", "k/test/l.py", "k/m.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * (len(rel) + 3))
    (tmp_path / "linked").symlink_to(tmp_path / "a")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    whole = _rglob_text_files(tmp_path, 1 << 30)
    assert len(whole) == 11 and default_text_files(1 << 30) == whole
    for limit in range(0, sum(p.stat().st_size for p in whole) + 2, 7):
        expected = _rglob_text_files(tmp_path, limit)
        if expected:
            assert default_text_files(limit) == expected, limit
        else:
            with pytest.raises(ConfigError, match="no default text"):
                default_text_files(limit)


def test_plan_auto_fills_the_layout_and_keeps_explicit_flags() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import config_from_args

    base = ["train", "--plan", "auto", "--memory", "0.2", "--nproc", "2", "--global-batch", "8", "--layers", "4"]
    cfg = config_from_args(build_parser().parse_args(base))
    per_replica = cfg.data.global_batch // cfg.parallel.dp
    assert cfg.world == cfg.parallel.nproc == 2 and per_replica % cfg.schedule.microbatches == 0
    kept = config_from_args(build_parser().parse_args([*base, "--schedule", "1f1b", "--offload", "all"]))
    assert kept.schedule.family == "1f1b" and kept.schedule.offload == "all" and kept.world == 2
    with pytest.raises(ConfigError, match="--memory"):
        config_from_args(build_parser().parse_args(base[:3] + base[5:]))
    # --max-stall goes to the planner and stays only if its plan uses it (this one fits without offload)
    stall = config_from_args(build_parser().parse_args([*base, "--max-stall", "5"]))
    assert (stall.schedule.offload, stall.schedule.max_stall, stall.schedule.offload_ratio) == ("none", 0.0, 0.0)


# ---- configuration from types (sections, derived flags and TOML) -------------------------------------------
def test_the_file_has_one_table_per_section_and_flags_keep_their_names(tmp_path: Path) -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import config_from_args

    path = tmp_path / "run.toml"
    path.write_text('[parallel]\npp = 2\nnproc = 2\n[schedule]\nfamily = "zb-v"\noffload = "all"\n')
    args = build_parser().parse_args(["train", "--config", str(path), "--dp", "2", "--nproc", "4", "--steps", "7"])
    cfg = config_from_args(args)
    assert (cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.nproc, cfg.run.steps) == (2, 2, 4, 7)
    assert (cfg.schedule.family, cfg.schedule.offload, cfg.schedule.stages_per_rank) == ("zb-v", "all", 2)
    text = to_toml(cfg)
    assert "[parallel]\npp = 2\ndp = 2" in text and '[schedule]\nfamily = "zb-v"' in text


def test_an_old_flat_config_still_reads_and_drops_per_invocation_keys(tmp_path: Path) -> None:
    """config.toml of runs written before the sections: flat keys; its stop_at must not stop a resume."""
    from pipeoffload.train.config import load_saved

    (tmp_path / "config.toml").write_text('schedule = "1f1b"\npp = 2\nnproc = 2\nsteps = 50\nstop_at = 40\n'
                                          'data = "x.txt"\nprogress = false\nlayers = 3\n')
    cfg = build_config(load_saved(tmp_path))
    assert (cfg.schedule.family, cfg.parallel.pp, cfg.run.steps, cfg.model.layers) == ("1f1b", 2, 50, 3)
    assert cfg.run.stop_at == 0 and cfg.metrics.progress and cfg.data.path == "x.txt"


def test_unknown_keys_in_a_section_are_named(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[parallel]\npipeline = 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'pipeline' in \[parallel\].*valid keys: pp, dp"):
        load_toml(path)
    path.write_text("[paralel]\npp = 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'paralel'"):
        load_toml(path)


def test_every_key_has_a_flag_whose_help_states_its_default() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.train.config import KEYS, flag_help

    text = build_parser().parse_args(["train"]).__dict__
    assert set(KEYS) <= set(text)  # one flag per key
    assert "(default 120)" in flag_help("timeout") and "(default 1f1b)" in flag_help("schedule")
    assert TrainConfig.build(min_lr_ratio=0.2).optim.min_lr_ratio == 0.2


def test_the_docs_flag_table_is_the_derived_one() -> None:
    from pipeoffload.train.config import flags_markdown

    docs = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    assert flags_markdown() in docs


@pytest.mark.parametrize("keys, words", [
    ({"model": "mamba"}, ["model='mamba'", "'gpt', 'llama' or 'hf:DIR'"]),
    ({"dtype": "fp16"}, ["dtype='fp16'", "'fp32' or 'bf16'"]),
    ({"model": "own"}, ["train_model", "resume="]),
    ({"model": "llama", "kv_heads": 3}, ["heads=4", "kv_heads=3"]),
    ({"model": "llama", "kv_heads": 2, "tp": 4, "nproc": 4}, ["tp=4", "key/value heads"]),
    ({"model": "llama", "vocab": 100}, ["vocab=100", "256"]),
    ({"model": "gpt", "vocab": 100}, ["vocab=100", "256"]),  # the GPT's vocab holds the tokenizer's ids too
    ({"model": "gpt", "tokenizer": "hf"}, ["tokenizer='hf'", "hf:DIR"]),
    ({"model": "hf:/nonexistent/model"}, ["never downloaded"]),
])
def test_bad_model_keys_are_refused(keys: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig.build(**keys))
    assert all(w in str(err.value) for w in words), err.value


def test_validation_never_imports_torch() -> None:
    code = ("import sys\nfrom pipeoffload.cli import main\nassert main(['train', '--pp', '0']) == 2\n"
            "assert main(['train', '--pp', '2', '--nproc', '2', '--layers', '1', '--schedule', 'zb-v']) == 2\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_relative_data_path_is_stored_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--resume from another directory must find the data: config.toml holds the absolute path."""
    (tmp_path / "corpus.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    cfg = validate(TrainConfig.build(data="corpus.txt"))
    assert cfg.data.path == str(tmp_path / "corpus.txt")
    assert f'path = "{tmp_path / "corpus.txt"}"' in to_toml(cfg)


def test_overrides_of_the_saved_config_and_of_the_file_are_listed(tmp_path: Path) -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(validate(TrainConfig.build(steps=50))))
    file = tmp_path / "more.toml"
    file.write_text("[optim]\nlr = 0.001\n[parallel]\npp = 2\nnproc = 2\n")
    args = build_parser().parse_args(["train", "--resume", str(run), "--config", str(file), "--pp", "1",
                                      "--nproc", "1"])
    cfg, notes = resolve(args)
    assert cfg.optim.lr == 0.001 and cfg.parallel.pp == 1
    assert notes[0].startswith(f"overriding {run / 'config.toml'}: ") and "lr 0.0003 -> 0.001" in notes[0]
    assert "pp" not in notes[0]  # the flags set pp back to the saved 1: no change
    assert notes[1] == f"flags overriding {file}: pp 2 -> 1, nproc 2 -> 1"


def test_changing_steps_on_resume_needs_extend(tmp_path: Path) -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    (tmp_path / "config.toml").write_text(to_toml(validate(TrainConfig.build(steps=50))))
    with pytest.raises(ConfigError, match="steps=80: the run was made with steps=50.*--extend"):
        resolve(build_parser().parse_args(["train", "--resume", str(tmp_path), "--steps", "80"]))
    cfg, _ = resolve(build_parser().parse_args(["train", "--resume", str(tmp_path), "--steps", "80", "--extend"]))
    assert cfg.run.steps == 80


def test_deterministic_kernels_are_asked_for_and_the_callers_state_is_restored():
    torch = pytest.importorskip("torch")
    from pipeoffload.train.launch import deterministic_kernels

    cfg = TrainConfig.build(deterministic=True)
    assert cfg.run.deterministic and "deterministic = true" in to_toml(cfg)  # a resumed run keeps it
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    with deterministic_kernels(cfg.run.deterministic):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled()) == before
    with deterministic_kernels(False):
        assert torch.are_deterministic_algorithms_enabled() == before[0]


def test_every_switch_can_be_turned_off_on_the_command_line_over_a_config_file(tmp_path):
    import argparse

    from pipeoffload.train.config import add_flags, flags_given

    parser = argparse.ArgumentParser()
    add_flags(parser)
    toml = tmp_path / "run.toml"
    toml.write_text("[checkpoint]\nasync_save = true\n[metrics]\ntensorboard = true\n[run]\ndeterministic = true\n")
    flags = flags_given(parser.parse_args(["--no-async-save", "--no-tensorboard", "--no-progress"]))
    cfg = build_config(load_toml(toml), flags)
    assert (cfg.checkpoint.async_save, cfg.metrics.tensorboard, cfg.metrics.progress) == (False, False, False)
    assert cfg.run.deterministic  # not given: the file's value shows through
    assert flags_given(parser.parse_args(["--fsdp"])) == {"fsdp": True}


def test_a_new_schedule_in_updated_takes_its_own_stages_per_rank():
    interleaved = validate(TrainConfig.build(schedule="interleaved-1f1b", pp=2, nproc=2, layers=4),
                           data_exists=False)
    assert interleaved.schedule.stages_per_rank == 2
    assert validate(interleaved.updated(schedule="1f1b"), data_exists=False).schedule.stages_per_rank == 1
    kept = interleaved.updated(schedule="interleaved-1f1b", microbatches=4)
    assert kept.schedule.stages_per_rank == 2
    assert interleaved.updated(schedule="zb-v", stages_per_rank=2).schedule.stages_per_rank == 2
