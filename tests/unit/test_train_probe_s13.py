"""`pipeoffload train` / `report` problems a user probe (session 13) found: a partial (LGD) recompute policy
train never performs, report refusing a crashed run's cut-off last record, wrong-type entries in --out found
by a rank, --plan auto hiding a schedule rule behind "no plan fits", a silent --stop-at, a lost validation
loss after a resume, per-rank figures mixed over two layouts, and help/TOML details."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import build_config, flag_help, load_toml, no_effect_notes, validate
from tests.conftest import one_line_error, train_process


# ---- 1: partial (LGD) recomputation is refused, not silently not performed ---------------------------------
@pytest.mark.parametrize("policy", ["auto,lgd", "all,lgd", "all,partial:0.5:0.1", "first:1,partial"])
def test_partial_recompute_is_refused_naming_the_fix(policy: str) -> None:
    head = policy.split(",")[0]
    with pytest.raises(ConfigError, match=rf"recompute='{policy}': train does not perform partial .*--recompute "
                                          rf"{head}\)$"):
        validate(build_config({"recompute": policy}))


def test_partial_recompute_refused_before_any_rank_starts(tmp_path: Path) -> None:
    out = tmp_path / "x"
    done = train_process("--nproc", "2", "--pp", "2", "--offload", "budget:1.5", "--offload-ratio", "50",
                         "--recompute", "auto,lgd", "--steps", "1", "--no-progress", "--out", str(out))
    line = one_line_error(done)
    assert "recompute='auto,lgd'" in line and "--recompute auto" in line, line
    assert not out.exists()


def test_plan_auto_refuses_a_partial_recompute_naming_it() -> None:
    from pipeoffload.train.plan import planned_config

    cfg = build_config({"nproc": 2, "recompute": "auto,lgd"})
    with pytest.raises(ConfigError, match="train does not perform partial"):
        planned_config(cfg, 40.0, None, explicit={"nproc", "recompute"})


def test_plan_emit_of_a_partial_recompute_plan_stays_runnable(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`plan --recompute lgd --emit` chose recompute=lgd and wrote it; train refuses that now, so the file
    holds the policy without its partial form, and the file and the command say so."""
    from pipeoffload.cli import main

    path = tmp_path / "run.toml"
    argv = ["plan", "--layers", "8", "--hidden", "64", "--heads", "4", "--seq", "64", "--vocab", "256", "--gpus",
            "2", "--global-batch", "8", "--pp", "2", "--recompute", "auto,lgd", "--offload", "budget:1",
            "--memory", "40", "--emit", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    text = path.read_text()
    assert "recompute=lgd" in text.splitlines()[0]  # the plan chose the partial form
    assert 'recompute = "none"' in text and "train does not perform partial (LGD)" in text
    assert "note: recompute=lgd is written as" in out
    cfg = validate(build_config(load_toml(path)), data_exists=False)
    assert cfg.schedule.recompute == "none"


def test_recompute_help_no_longer_promises_lgd() -> None:
    text = flag_help("recompute")
    assert "with ,lgd for partial" not in text and "refused" in text


# ---- 2: report reads a crashed run's metrics.jsonl as a resume does --------------------------------------
def test_report_drops_an_incomplete_last_line_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pipeoffload.train.report import load_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.9}\n{"step": 3, "lo')
    with caplog.at_level("WARNING"):
        metrics = load_metrics(path)
    assert [r["step"] for r in metrics.rows] == [1, 2]
    assert "last line is incomplete" in caplog.text


def test_report_still_refuses_a_bad_line_before_the_last(tmp_path: Path) -> None:
    from pipeoffload.train.report import load_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 5.0}\nxx\n{"step": 3, "loss": 4.8}\n')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: not a JSON object"):
        load_metrics(path)
    path.write_text('{"step": 1, "loss": 5.0}\n[1]\n')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: expected a JSON object"):
        load_metrics(path)


# ---- 3: wrong-type entries inside --out, refused before anything is written ----------------------------
def test_a_folder_named_metrics_jsonl_is_refused_before_config_toml_is_written(tmp_path: Path) -> None:
    out = tmp_path / "o"
    (out / "metrics.jsonl").mkdir(parents=True)
    line = one_line_error(train_process("--steps", "2", "--no-progress", "--out", str(out)))
    assert "metrics.jsonl" in line and "is a folder" in line and "choose another --out" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize("name,make,tensorboard,found", [
    ("checkpoints", "file", False, "is a file"),
    ("tensorboard", "file", True, "is a file"),
    ("train.log", "folder", False, "is a folder"),
    ("config.toml", "folder", False, "is a folder"),
])
def test_check_out_names_each_wrong_type_entry(tmp_path: Path, name: str, make: str, tensorboard: bool,
                                               found: str) -> None:
    from pipeoffload.train.preflight import check_out

    entry = tmp_path / name
    entry.mkdir() if make == "folder" else entry.write_text("x")
    with pytest.raises(ConfigError, match=rf"{name}' {found}, where the run writes .*move or remove it"):
        check_out(str(tmp_path), tensorboard=tensorboard)


def test_check_out_accepts_entries_of_their_kind_and_a_tensorboard_file_without_tensorboard(tmp_path: Path) -> None:
    from pipeoffload.train.preflight import check_out

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "tensorboard").write_text("not used")
    check_out(str(tmp_path), tensorboard=False)


# ---- 4: --plan auto names the rule a fixed schedule key breaks ------------------------------------------
@pytest.mark.parametrize("keys,rule", [
    ({"schedule": "zb-v", "stages_per_rank": 3}, "zb-v uses V placement, which holds exactly 2 stages per rank"),
    ({"schedule": "1f1b", "stages_per_rank": 2}, "1f1b places one stage per rank"),
    ({"nproc": 4, "pp": 4, "group_size": 5}, r"group_size=5: must be an integer in 1\.\.4 \(pp=4\)"),
])
def test_plan_auto_names_the_broken_schedule_rule(keys: dict, rule: str) -> None:
    from pipeoffload.train.plan import planned_config

    keys = {"nproc": 2, **keys}
    with pytest.raises(ConfigError, match=rule) as err:
        planned_config(build_config(keys), 40.0, None, explicit=set(keys))
    assert "no plan" not in str(err.value)


# ---- 5: --stop-at at or above --steps is said ------------------------------------------------------------
@pytest.mark.parametrize("stop_at", [3, 5])
def test_stop_at_not_below_steps_is_noted(stop_at: int) -> None:
    cfg = validate(build_config({"steps": 3, "stop_at": stop_at}))
    notes = no_effect_notes(cfg, {"steps", "stop_at"})
    assert any(f"stop_at={stop_at} is not below steps=3" in n and "no effect" in n for n in notes), notes


def test_stop_at_below_steps_is_not_noted() -> None:
    cfg = validate(build_config({"steps": 3, "stop_at": 2}))
    assert not any("stop_at" in n for n in no_effect_notes(cfg, {"steps", "stop_at"}))


# ---- 6: the summary line keeps a validation loss measured before a resume -------------------------------
def test_summary_line_after_a_resume_keeps_the_earlier_validation_loss(tmp_path: Path) -> None:
    from pipeoffload.train.report import summary_line

    rows = [{"step": 1, "loss": 6.0, "val_loss": 5.6922}, {"step": 2, "loss": 5.9, "val_loss": None},
            {"step": 3, "loss": 5.8, "val_loss": None}, {"step": 4, "loss": 5.6747, "val_loss": None}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = summary_line(str(tmp_path), 4, rows[2:])  # this invocation's records: steps 3 and 4
    assert line == f"run {tmp_path}: step 4, loss 5.6747, val loss 5.6922 (step 1)"


def test_summary_line_without_any_validation_loss_leaves_it_out(tmp_path: Path) -> None:
    from pipeoffload.train.report import summary_line

    rows = [{"step": 1, "loss": 6.0, "val_loss": None}]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert summary_line(str(tmp_path), 1, rows) == f"run {tmp_path}: step 1, loss 6.0000"


# ---- 7: per-rank figures of the last layout after a resume on another number of ranks ---------------------
def test_report_per_rank_figures_are_the_last_layouts_and_say_so() -> None:
    from pipeoffload.train.report import RunMetrics, key_figures

    rows = [{"step": s, "loss": 5.0, "peak_act_bytes": [2 * 2**20, 3 * 2**20]} for s in (1, 2)]
    rows += [{"step": s, "loss": 4.0, "peak_act_bytes": [2**20]} for s in (3, 4)]
    figures = dict(key_figures(RunMetrics(rows)))
    assert figures["peak activations, rank 0"] == "1.00 MiB"
    assert "peak activations, rank 1" not in figures
    changed = [v for k, v in figures.items() if k.startswith("layout changed")]
    assert changed and "from step 3 on 1 rank (before: 2 ranks)" in changed[0], figures


def test_report_splits_a_resume_on_another_layout_of_as_many_ranks() -> None:
    """pp 2 -> dp 2: two ranks before and after, but rank 1 was a pipeline stage and is now a replica;
    records name their layout, so the report splits there (by the number of ranks it could not)."""
    from pipeoffload.train.report import RunMetrics, key_figures

    def rows(steps: tuple[int, ...], layout: dict[str, int], peaks: list[int]) -> list[dict]:
        return [{"step": s, "loss": 5.0, "layout": layout, "peak_act_bytes": peaks} for s in steps]

    records = rows((1, 2), {"pp": 2, "dp": 1, "tp": 1}, [5 * 2**20, 3 * 2**20])
    records += rows((3, 4), {"pp": 1, "dp": 2, "tp": 1}, [2**20, 2**20])
    figures = dict(key_figures(RunMetrics(records)))
    assert figures["peak activations, rank 0"] == "1.00 MiB", figures
    changed = [v for k, v in figures.items() if k.startswith("layout changed")]
    assert changed and "from step 3 on pp 1 x dp 2 x tp 1 (before: pp 2 x dp 1 x tp 1)" in changed[0], figures


def test_report_one_layout_has_no_layout_line() -> None:
    from pipeoffload.train.report import RunMetrics, key_figures

    rows = [{"step": s, "loss": 5.0, "peak_act_bytes": [s * 2**20, 2**20]} for s in (1, 2)]
    figures = dict(key_figures(RunMetrics(rows)))
    assert figures["peak activations, rank 0"] == "2.00 MiB" and "peak activations, rank 1" in figures
    assert not any(k.startswith("layout changed") for k in figures)


# ---- 8: help defaults; a key given flat and in its section ----------------------------------------------
@pytest.mark.parametrize("flat,shown", [("ffn_hidden", "(default 0)"), ("offload_ratio", "(default 0)")])
def test_help_shows_the_default_of_keys_whose_help_says_default(flat: str, shown: str) -> None:
    assert flag_help(flat).endswith(shown), flag_help(flat)


def test_help_of_layers_per_stage_has_no_empty_default() -> None:
    assert "(default )" not in flag_help("layers_per_stage")


def test_a_key_both_flat_and_in_its_section_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("pp = 2\n\n[parallel]\npp = 1\n")
    with pytest.raises(ConfigError, match=r"pp: given twice in .*top-level pp = 2 and \[parallel\] pp = 1.*keep one"):
        load_toml(path)
