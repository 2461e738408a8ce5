"""`pipeoffload train` problems a user probe found (Llama/HF models, --plan auto, resume, messages)."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig, build_config, to_toml, validate
from pipeoffload.train.data import Corpus


def _resolve(*argv: str) -> tuple[Any, list[str]]:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    return resolve(build_parser().parse_args(["train", *argv]))


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", "train", *argv], capture_output=True, text=True,
                          timeout=300)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.hf_fixtures import make_hf_dir

    path = tmp_path_factory.mktemp("hf") / "llama"
    make_hf_dir(path, "llama")  # 4 layers, hidden 64, 4 heads, 2 kv heads, ffn 96, vocab 300
    return path


# ---- 1: --plan auto plans the model that trains ------------------------------------------------------
def _assert_hf_model(model: Any) -> None:
    assert (model.layers, model.hidden, model.heads, model.num_kv_heads, model.ffn_size, model.vocab) == \
        (4, 64, 4, 2, 96, 300)
    assert model.gated_mlp and model.seq == 32


def test_plan_auto_plans_an_hf_folder_with_its_config(hf_dir: Path, planned: list[Any], tmp_path: Path) -> None:
    base = ["--plan", "auto", "--memory", "40", "--nproc", "2", "--model", f"hf:{hf_dir}", "--seq-len", "32"]
    for extra in ([], ["--tokenizer", "hf"]):  # the explicit --tokenizer hf was an int('') traceback
        cfg, _ = _resolve(*base, *extra)
        assert cfg.data.tokenizer == "hf" and cfg.world == 2
        _assert_hf_model(planned[-1].model)
    toml = tmp_path / "run.toml"
    toml.write_text('[data]\ntokenizer = "hf"\n')
    _resolve(*base, "--config", str(toml))
    _assert_hf_model(planned[-1].model)
    run = tmp_path / "run"  # --resume of an hf run (its config.toml has tokenizer = "hf")
    run.mkdir()
    (run / "config.toml").write_text(to_toml(validate(TrainConfig.build(model=f"hf:{hf_dir}", seq_len=32))))
    cfg, _ = _resolve("--resume", str(run), "--plan", "auto", "--memory", "40", "--nproc", "2")
    _assert_hf_model(planned[-1].model)


def test_plan_auto_plans_the_llama_model_of_the_keys(planned: list[Any]) -> None:
    _resolve("--plan", "auto", "--memory", "40", "--nproc", "2", "--model", "llama", "--layers", "2",
             "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--tokenizer", "bpe:300")
    model = planned[-1].model
    assert (model.layers, model.num_kv_heads, model.ffn_size, model.vocab) == (2, 2, 256, 300)
    assert model.gated_mlp and not model.dropout


# ---- 2: explicit keys constrain the search -------------------------------------------------------------
@pytest.mark.parametrize("flags, want", [
    (["--nproc", "4", "--pp", "2", "--schedule", "zb-v"], {"pp": 2, "schedule": "zb-v"}),
    (["--nproc", "2", "--pp", "2"], {"pp": 2, "dp": 1}),
    (["--nproc", "4", "--dp", "2", "--microbatches", "2"], {"dp": 2, "microbatches": 2}),
    (["--nproc", "2", "--pp", "2", "--offload", "all"], {"pp": 2, "offload": "all"}),
    (["--nproc", "2", "--schedule", "interleaved-1f1b", "--stages-per-rank", "2"],
     {"pp": 2, "schedule": "interleaved-1f1b", "stages_per_rank": 2}),
])
def test_plan_auto_keeps_the_keys_given_while_it_searches(flags: list[str], want: dict, planned: list[Any]) -> None:
    cfg, _ = _resolve("--plan", "auto", "--memory", "40", "--model", "llama", "--steps", "1", *flags)
    assert cfg.world == cfg.parallel.nproc
    assert {k: cfg.get(k) for k in want} == want
    if "microbatches" in want:  # 8 sequences over dp 2 in 2 microbatches: the planner's microbatch is 2
        assert planned[-1].model.microbatch == 2


@pytest.mark.parametrize("flags, words", [
    (["--nproc", "4", "--pp", "3"], ["--pp 3", "4 ranks"]),
    (["--nproc", "4", "--pp", "2", "--dp", "4"], ["--pp 2 --dp 4", "4 ranks"]),
])
def test_plan_auto_refuses_keys_no_plan_can_keep(flags: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve("--plan", "auto", "--memory", "40", "--model", "llama", *flags)
    assert all(w in str(err.value) for w in words), err.value


# ---- 3, 4, 5, 6: one line, exit 2, nothing written -----------------------------------------------------
@pytest.mark.parametrize("flags, words", [
    (["--memory", "40"], ["--memory 40", "only for --plan auto"]),
    (["--gpu", "h100"], ["--gpu h100", "only for --plan auto"]),
    (["--plan", "auto", "--memory", "40", "--gpu", "nosuch", "--nproc", "2"], ["'nosuch'", "a100, h100"]),
])
def test_planner_flags_are_refused_in_one_line(tmp_path: Path, flags: list[str], words: list[str]) -> None:
    out = tmp_path / "run"
    done = _cli(*flags, "--steps", "1", "--layers", "1", "--data", __file__, "--seq-len", "16", "--out", str(out))
    line = _one_line(done)
    assert all(w in line for w in words) and "--hardware-file" not in line, line
    assert not out.exists()


def test_the_gpu_help_names_the_default_that_works() -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.planner import hardware_preset

    sub = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    help_text = next(a.help for a in sub._actions if "--gpu" in a.option_strings)
    default = help_text.split("default: ")[1].split(";")[0].split(")")[0]
    assert default == "a100", help_text
    hardware_preset(default)


def test_a_token_file_with_a_small_vocab_names_the_ids_it_needs(tmp_path: Path) -> None:
    data = tmp_path / "tok500.npy"
    np.save(data, np.arange(5000, dtype=np.int64) % 500)
    validate(build_config({"model": "llama", "vocab": 300, "data": str(data)}))  # no tokenizer to compare with
    out = tmp_path / "run"
    line = _one_line(_cli("--model", "llama", "--vocab", "100", "--data", str(data), "--out", str(out)))
    assert "needs 500 token ids" in line and "tokenizer's" not in line, line
    assert not out.exists()


def _saved_run(tmp_path: Path, **keys: Any) -> Path:
    run = tmp_path / "saved"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(validate(TrainConfig.build(steps=50, **keys))))
    return run


def test_resume_refuses_another_out(tmp_path: Path) -> None:
    run = _saved_run(tmp_path)
    with pytest.raises(ConfigError, match="continues the run in its own folder; drop --out ") as err:
        _resolve("--resume", str(run), "--out", str(tmp_path / "elsewhere"))
    assert "leave --out out" not in str(err.value)  # read as an instruction to pass --out out
    cfg, _ = _resolve("--resume", str(run), "--out", str(run))  # the same folder is no fork
    assert Path(cfg.run.out) == run
    other = tmp_path / "other.toml"
    other.write_text(f'[run]\nout = "{tmp_path / "elsewhere"}"\n')
    with pytest.raises(ConfigError, match="continues the run in its own folder"):
        _resolve("--resume", str(run), "--config", str(other))
    assert not (tmp_path / "elsewhere").exists()


def test_an_explicit_tokenizer_other_than_hf_is_refused_with_an_hf_folder(hf_dir: Path, tmp_path: Path) -> None:
    for tok in ("byte", "bpe:300"):
        with pytest.raises(ConfigError, match=f"tokenizer='{tok}'.*brings its own tokenizer"):
            _resolve("--model", f"hf:{hf_dir}", "--tokenizer", tok)
    cfg, _ = _resolve("--model", f"hf:{hf_dir}")
    assert cfg.data.tokenizer == "hf"
    cfg, _ = _resolve("--model", f"hf:{hf_dir}", "--tokenizer", "hf")
    assert cfg.data.tokenizer == "hf"


# ---- 7: a new dtype on resume is said to change the arithmetic ----------------------------------------------
def test_a_new_dtype_on_resume_says_the_losses_are_no_longer_bitwise(tmp_path: Path) -> None:
    run = _saved_run(tmp_path)
    cfg, notes = _resolve("--resume", str(run), "--dtype", "bf16")
    assert cfg.model.dtype == "bf16"
    assert any("dtype fp32 -> bf16" in n and "no longer bitwise" in n for n in notes), notes
    _, notes = _resolve("--resume", str(run))
    assert not any("bitwise" in n for n in notes)


# ---- 8: eval_batches beyond the held-out data --------------------------------------------------------------
def test_eval_batches_beyond_the_held_out_data_are_capped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from pipeoffload.train.job import TokenBatches

    corpus = Corpus(np.arange(4000, dtype=np.int64), 4000, 16, 0.1)  # 24 held-out windows of 16
    assert corpus.num_val == 24 and corpus.val_batches_held(8) == 3
    batches = corpus.val_batches(50, 8, 2, 0)
    assert len(batches) == 3  # not 50 batches of the same 24 windows
    starts = {int(x[0]) for xs, _ in (corpus.val_batches(50, 8, 1, 0)) for x in xs}
    assert len(starts) == 24  # every held-out window once
    cfg = TrainConfig.build(seq_len=16, eval_batches=50, global_batch=8)
    with caplog.at_level(logging.WARNING):
        TokenBatches(corpus, cfg, True)
    assert any("eval_batches=50" in r.getMessage() and "holds 3 batches" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        TokenBatches(corpus, TrainConfig.build(seq_len=16, eval_batches=3, global_batch=8), True)
    assert not caplog.records


# ---- 4d: a finished run says how many steps --extend needs ------------------------------------------------
def test_extend_below_the_checkpoint_says_n_must_be_above_its_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    data = tmp_path / "text.txt"
    data.write_text("pipelines move activations between stages; offload moves them to the host. " * 40)
    run = tmp_path / "run"
    done = _cli("--steps", "2", "--save-every", "2", "--layers", "1", "--hidden", "16", "--heads", "2",
                "--seq-len", "16", "--data", str(data), "--out", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    line = _one_line(_cli("--resume", str(run), "--steps", "1", "--extend"))
    assert "step 2" in line and "--steps N --extend with N above 2" in line, line


# ---- ninth session: --plan auto plans the run's dtype and parameter state ------------------------------
def _planned_memory(planned: list[Any], *flags: str) -> tuple[Any, Any]:
    """(the planner's model, the memory of the plan) --plan auto chose for ``flags`` (pp 2, 1F1B, nothing
    offloaded or recomputed)."""
    from pipeoffload.planner import find_plans

    _resolve("--plan", "auto", "--memory", "40", "--nproc", "2", "--pp", "2", "--schedule", "1f1b",
             "--offload", "none", "--recompute", "none", "--microbatches", "4", "--layers", "8", "--hidden", "256",
             "--heads", "4", "--seq-len", "256", *flags)
    request = planned[-1]
    return request.model, find_plans(request).fitting[0].memory


def test_plan_auto_plans_fp32_activations_at_4_bytes_and_bf16_at_2(planned: list[Any]) -> None:
    (model32, fp32), (model16, bf16) = (_planned_memory(planned, "--dtype", d) for d in ("fp32", "bf16"))
    assert (model32.dtype_bytes, model16.dtype_bytes) == (4, 2)
    # not 2: under bf16 autocast the residual stream, the norms' statistics, the head's log-softmax and (CUDA
    # autocast) the attention softmax stay fp32 in train's GPT blocks (planner.trainblocks): 1.33 here
    assert 1.3 < fp32.activations / bf16.activations < 1.4
    # the parameters are fp32 in both (bf16 is autocast): 4-byte weights and gradients, AdamW's two moments;
    # bf16 adds autocast's cached bf16 casts of the worst rank's linears (rank 0: 1F1B's most microbatches in
    # flight; its 4 blocks, no head)
    assert fp32.optimizer == bf16.optimizer
    assert bf16.parameters - fp32.parameters == 4 * model16.layer_cast_cache_bytes() == 4 * 2 * (12 * 256**2 + 9 * 256)
    assert fp32.optimizer == fp32.parameters  # 8 bytes a parameter each, no separate fp32 master copy


def test_plan_auto_shards_the_optimizer_state_only_with_zero(planned: list[Any]) -> None:
    from pipeoffload.planner import find_plans

    base = ("--plan", "auto", "--memory", "40", "--nproc", "2", "--dp", "2", "--layers", "4", "--hidden", "128")
    _resolve(*base)
    plain = find_plans(planned[-1]).fitting[0].memory
    _resolve(*base, "--zero", "1")
    zero = find_plans(planned[-1]).fitting[0].memory
    assert plain.parameters == zero.parameters and plain.optimizer == pytest.approx(2 * zero.optimizer)


# ---- ninth session: a fixed v or g restricts the search itself, not its top plans ------------------------
@pytest.mark.parametrize("flags, want", [
    # g=3 is a valid group size on 4 ranks (1..pp), but not one of the family's own (2, 4) that the search
    # tried; the top plans were filtered for it, so the run was refused
    (["--nproc", "4", "--pp", "4", "--schedule", "group-interleaved", "--group-size", "3"], {"pp": 4, "group_size": 3}),
    (["--nproc", "8", "--group-size", "3"], {"group_size": 3}),
    # g=1 on 4 or 8 ranks was never searched: a slower pp=2 plan that offloads was chosen (with train's own
    # blocks' activation bytes, eighteenth session, the plan keeping g=1 without offload is on pp 2, not 4)
    (["--nproc", "8", "--group-size", "1", "--stages-per-rank", "4", "--layers", "32", "--hidden", "2048", "--heads", "16",
      "--seq-len", "2048", "--global-batch", "64", "--memory", "20"],
     {"group_size": 1, "stages_per_rank": 4, "offload": "none"}),
    # the plan kept v=4, but the planned schedule reset the config's v to the family's own 2
    (["--nproc", "8", "--stages-per-rank", "4"], {"stages_per_rank": 4}),
])
def test_plan_auto_searches_only_the_v_and_g_given(flags: list[str], want: dict, planned: list[Any]) -> None:
    base = {"--memory": "40", "--model": "llama", "--steps": "1", "--layers": "16"}
    base = [word for key, value in base.items() if key not in flags for word in (key, value)]  # an option
    cfg, _ = _resolve("--plan", "auto", *base, *flags)  # given twice is refused, not silently the last
    assert {k: cfg.get(k) for k in want} == want
    request = planned[-1]
    assert request.top == 1  # nothing is filtered after the search
    if "--group-size" in flags:
        assert request.group_sizes == (want["group_size"],)
    if "--stages-per-rank" in flags:  # only the families that can have v=4
        assert request.stages_per_rank == (4,) and set(request.schedules) <= {"interleaved-1f1b", "group-interleaved"}


@pytest.mark.parametrize("flags, words", [
    # a schedule rule the keys break is named as a run without --plan names it (session 13), not "no plan"
    (["--nproc", "4", "--pp", "4", "--group-size", "5"], ["group_size=5: must be an integer in 1..4 (pp=4)"]),
    (["--nproc", "4", "--schedule", "1f1b", "--stages-per-rank", "2"], ["1f1b places one stage per rank"]),
    (["--nproc", "8", "--stages-per-rank", "4", "--layers", "4"], ["no plan for", "--stages-per-rank 4"]),  # 8 stages
])
def test_plan_auto_still_refuses_a_v_or_g_no_plan_keeps(flags: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve("--plan", "auto", "--memory", "40", "--model", "llama", *flags)
    assert all(w in str(err.value) for w in words), err.value


def test_the_launchers_starting_line_counts_its_ranks() -> None:
    """A one-process run said "starting 1 ranks (each imports torch ...)"."""
    from pipeoffload.train.job import starting_line

    one, four = starting_line(1, Path("r/train.log")), starting_line(4, Path("r/train.log"))
    assert one.startswith("starting 1 rank (it imports torch and joins the process group;"), one
    assert four.startswith("starting 4 ranks (each imports torch and joins the process group;"), four
    assert one.endswith("; its log: r/train.log") and four.endswith("; their log: r/train.log")


def test_the_printed_notes_follow_the_header_they_annotate(tmp_path: Path) -> None:
    """train printed its notes ("# offload=all at offload_ratio=...", "# ... has no effect") above the line
    "# pipeoffload train: resolved configuration", where docs/training.md says the printed configuration
    begins with them: the header now comes first and the notes under it; config.toml keeps none."""
    pytest.importorskip("torch")
    text = tmp_path / "text.txt"
    text.write_text("some text to train on, repeated. " * 200)
    done = _cli("--data", str(text), "--steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2",
                "--seq-len", "16", "--global-batch", "2", "--microbatches", "1", "--offload-ratio", "0.5",
                "--no-progress", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    header, *rest = done.stdout.splitlines()
    assert header.startswith("# pipeoffload train: resolved configuration"), done.stdout
    assert rest[0].startswith("# offload_ratio=0.5 with offload='none'"), done.stdout
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert saved.startswith(header) and "offload_ratio=0.5 with" not in saved
