"""A user's probe of the command line's input and outputs (probe C): a repeated option silently taking the
last value, numbers read with Python's literal rules, outputs clobbering inputs or each other, half-written
output pairs, empty or mismatched output names, and messages naming flags the user did not give."""
from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.service.checks import finite_at_least, int_at_least
from tests.conftest import refused as _refused
from tests.conftest import run_cli


def _run(command: str) -> tuple[int, str, str]:
    return run_cli(*shlex.split(command))


# ---- 1.1 a repeated single-valued option is refused, not silently the last one ------------------------
@pytest.mark.parametrize("command,flag", [
    ("simulate 1f1b -d 8 -d 2", "--ranks/-d"),
    ("simulate 1f1b --ranks 8 -d 8", "--ranks/-d"),
    ("simulate zb-v --offload all --offload-ratio 0.5 --offload-ratio 0.7", "--offload-ratio"),
    ("show 1f1b -m 2 -m 4", "--microbatches/-m"),
    ("compare 1f1b --with '-d 8' --with '-m 2'", "--with"),
])
def test_a_repeated_option_is_refused_in_one_line(command: str, flag: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    err = _refused(command, flag, "given twice")
    assert err.startswith(f"pipeoffload {command.split()[0]}: error:")
    assert not list(tmp_path.iterdir())  # compare wrote no page


def test_a_repeated_option_inside_a_compare_argument_is_refused(tmp_path: Path) -> None:
    _refused(f"compare '1f1b -d 8 -d 2' -o {tmp_path / 'c.html'}", "'1f1b -d 8 -d 2'", "--ranks/-d", "given twice")
    assert not (tmp_path / "c.html").exists()


def test_compare_help_says_with_is_given_once() -> None:
    code, out, _ = _run("compare --help")
    assert code == 0 and "once" in " ".join(out.split())


def test_an_unknown_argument_names_the_subcommand() -> None:
    for command in ("show 1f1b --bogus", "simulate 1f1b --bogus"):
        err = _refused(command, "unrecognized arguments: --bogus")
        assert err.startswith(f"pipeoffload {command.split()[0]}: error:"), err


# ---- 1.2 plain ASCII numbers only ------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["1_0", "٤", "４", " 4", "4 ", "0x4", "4.0", "4e0", ""])
def test_int_text_is_plain_ascii_digits(text: str) -> None:
    with pytest.raises(ValueError, match="not an integer"):
        int_at_least(text)


@pytest.mark.parametrize("text", ["0_5", "1_0", "٠.٥", "０.５", " 0.5", "0x1p-1", "1e", "--1", "", "."])
def test_number_text_is_plain_ascii_decimal_or_scientific(text: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        finite_at_least(text)


@pytest.mark.parametrize("text,value", [("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("1e-1", 0.1), ("2E+1", 20.0),
                                        ("+3", 3.0), ("0", 0.0)])
def test_plain_numbers_still_parse(text: str, value: float) -> None:
    assert finite_at_least(text) == value
    assert int_at_least("12") == 12 and int_at_least("+3") == 3


@pytest.mark.parametrize("text", ["first:0_1", "first:１", "budget:1_5", "budget:٠.٥", "budget:1_5rank"])
def test_offload_policy_numbers_are_plain_ascii(text: str) -> None:
    with pytest.raises(ConfigError, match="not an? (integer|number)"):
        OffloadPolicy.parse(text)


@pytest.mark.parametrize("text", ["first:1_0", "all,partial:0_5:0.1", "all,partial:0.5:٠.١"])
def test_recompute_policy_numbers_are_plain_ascii(text: str) -> None:
    with pytest.raises(ConfigError, match="not an? (integer|number)"):
        RecomputePolicy.parse(text)


@pytest.mark.parametrize("command,piece", [
    ("simulate zb-v --offload all --offload-ratio 0_5", "'0_5' is not a number"),
    ("simulate 1f1b -d 1_0", "'1_0' is not an integer"),
    ("simulate zb-v --offload first:0_1", "'0_1' is not an integer"),
    ("simulate zb-v --offload budget:1_5", "'1_5' is not a number"),
    ("simulate zb-v --offload all --offload-ratio ٠.٥", "is not a number"),
])
def test_the_cli_refuses_underscored_and_non_ascii_numbers(command: str, piece: str) -> None:
    _refused(command, piece)


@pytest.mark.parametrize("command,piece", [
    ("k --hidden 4_096 --seq 8192 --gpu a100", "argument --hidden: '4_096' is not an integer"),
    ("k --hidden ４０９６ --seq 8192 --gpu a100", "is not an integer"),
    ("k --hidden 4096 --seq 8192 --gpu a100 --hw memory_gib=8_0", "--hw memory_gib=8_0: '8_0' is not a number"),
    ("estimate --model gpt3-1.3b --global-batch 8 --pp 2 --dp 8 --memory 1_0", "argument --memory: '1_0' is not a number"),
])
def test_every_int_and_float_flag_takes_plain_ascii_numbers(command: str, piece: str) -> None:
    """The planner's flags (``type=int``/``type=float``) and ``--hw`` values, not only ``service.checks``'."""
    _refused(command, piece)


def test_plain_numbers_still_work_in_the_planners_flags() -> None:
    code, out, err = _run("k --hidden 4096 --seq 8192 --gpu a100 --hw memory_gib=8e1")
    assert code == 0 and "k =" in out, err


def test_the_api_refuses_underscored_and_full_width_numbers() -> None:
    from pipeoffload.web.server import request_from_query

    for name, text in (("ranks", "1_0"), ("ranks", "４"), ("offload_ratio", "0_5"), ("time_f", "١")):
        with pytest.raises(ConfigError, match=f"{name}: '{text}' is not an? (integer|number)"):
            request_from_query({"family": ["1f1b"], name: [text]})


# ---- 2.2 compare --json writes no page unless -o is given -------------------------------------------------
def test_compare_json_writes_no_page_without_o(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "compare.html").write_text("mine")
    code, out, err = _run("compare 1f1b --with '-d 4' --json")
    assert code == 0, err
    assert json.loads(out)[0]["label"]
    assert (tmp_path / "compare.html").read_text() == "mine"
    code, out, err = _run("compare 1f1b --json -o page.html")
    assert code == 0, err
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>") or "<html" in (tmp_path / "page.html").read_text()
    assert "wrote page.html" in err


# ---- 2.3 report checks both outputs before writing either ---------------------------------------------
def test_report_writes_nothing_when_one_output_cannot_be_written(tmp_path: Path) -> None:
    from tests.unit.test_report import _write_run

    run = tmp_path / "run"
    _write_run(run)
    (run / "report.html").mkdir()
    err = _refused(f"report {run}", "report.html", "is a folder")
    assert "give a file name inside it" not in err  # report has no output option to give one with
    assert not (run / "report.png").exists()


# ---- 2.4 two outputs on one path; extensions that contradict the format ------------------------------------
def test_two_outputs_on_one_path_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.png"
    _refused(f"simulate 1f1b --plot {path} --report {path}", "--plot", "--report", "same file")
    _refused(f"simulate 1f1b --plot {path} --report {tmp_path}/./s.png", "same file")
    assert not path.exists()


@pytest.mark.parametrize("command,pieces", [
    ("simulate 1f1b --trace {d}/tr.png", ("--trace", ".json")),
    ("simulate 1f1b --report {d}/r.png", ("--report", ".html")),
    ("compare 1f1b -o {d}/c.pdf", ("-o", ".html")),
])
def test_an_extension_that_contradicts_the_format_is_refused(command: str, pieces: tuple[str, ...],
                                                             tmp_path: Path) -> None:
    _refused(command.format(d=tmp_path), *pieces)
    assert not list(tmp_path.iterdir())


def test_matching_extensions_are_accepted(tmp_path: Path) -> None:
    code, _, err = _run(f"simulate 1f1b --trace {tmp_path}/t.JSON --report {tmp_path}/r.htm")
    assert code == 0, err
    assert (tmp_path / "t.JSON").exists() and (tmp_path / "r.htm").exists()


# ---- 2.5 empty output paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("command,flag", [("simulate 1f1b --plot ''", "--plot"), ("simulate 1f1b --trace ''", "--trace"),
                                          ("simulate 1f1b --report ''", "--report"), ("compare 1f1b -o ''", "-o"),
                                          ("compare 1f1b --plots ''", "--plots")])
def test_an_empty_output_path_is_refused(command: str, flag: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    err = _refused(command, flag, "empty")
    assert "is a folder" not in err
    assert not list(tmp_path.iterdir())


# ---- 2.6 export --hf: where it cannot write, a user's .tmp-<name>, the shard's mode -------------------------
def _tiny_state() -> tuple[object, dict[str, object]]:
    import torch

    from pipeoffload.hfdir import export_parts
    from pipeoffload.llama_config import LlamaShape

    shape = LlamaShape(vocab=16, hidden=8, layers=1, heads=2)
    return shape, {name: torch.zeros(2) for ours in export_parts(shape).values() for name in ours}


@pytest.mark.parametrize("where", ["/proc/pipeoffload-x", "/sys/pipeoffload-x"])
def test_save_hf_where_it_cannot_write_is_one_line_naming_hf(where: str) -> None:
    pytest.importorskip("safetensors")
    from pipeoffload.models.hf import save_hf

    shape, state = _tiny_state()
    with pytest.raises(ConfigError) as err:
        save_hf(where, shape, state, None)  # type: ignore[arg-type]
    assert str(err.value).startswith(f"--hf {where!r}") and ".tmp-" not in str(err.value), err.value


def test_save_hf_keeps_a_users_tmp_folder_and_writes_the_shard_0644(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from pipeoffload.models.hf import save_hf

    mine = tmp_path / ".tmp-out"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    shape, state = _tiny_state()
    old = os.umask(0o022)
    try:
        out = save_hf(tmp_path / "out", shape, state, None)  # type: ignore[arg-type]
    finally:
        os.umask(old)
    assert (mine / "notes.txt").read_text() == "mine"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o644}, modes
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


def test_export_to_an_unwritable_or_file_parent_is_refused_before_loading(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[model]\nsource = "llama"\n')
    small = tmp_path / "small.txt"
    small.write_text("x")
    _refused(f"export {run} --hf /proc/pipeoffload-x", "--hf '/proc/pipeoffload-x'", "/proc")
    err = _refused(f"export {run} --hf {small}/x", "--hf", "is a file")
    assert "does not exist" not in err


# ---- 3.3 messages name only flags the user gave -----------------------------------------------------------
@pytest.mark.parametrize("command", ["export {run} --hf {run}/../out", "generate {run}"])
def test_a_run_without_checkpoints_is_not_called_resume(command: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[model]\nsource = "llama"\n')
    err = _refused(command.format(run=run), "RUN_DIR", "no checkpoint")
    assert "--resume" not in err


def test_trace_compare_names_the_default_output_not_o(tmp_path: Path) -> None:
    source = tmp_path / "rr.json"
    source.write_text('{"traceEvents": []}')
    (tmp_path / "rr.vs-sim.json").mkdir()
    err = _refused(f"trace compare {source}", "rr.vs-sim.json", "is a folder")
    assert "error: -o" not in err and "default" in err  # -o only as the way around it


def test_show_over_the_size_limit_names_the_flags_not_max_actions() -> None:
    err = _refused("show 1f1b -d 100000", "-d", "-m")
    assert "max_actions" not in err


def test_report_on_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("x")
    err = _refused(f"report {small}", "is a file")
    assert "does not exist" not in err


def test_an_output_under_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("x")
    err = _refused(f"simulate 1f1b --report {small}/r.html", "is a file")
    assert "does not exist" not in err


# ---- 3.9 --version, and what -v means where ----------------------------------------------------------------
def test_version_flag() -> None:
    from importlib.metadata import version

    code, out, _ = _run("--version")
    assert code == 0 and out.strip() == f"pipeoffload {version('pipeoffload')}"


def test_help_says_where_v_means_verbose() -> None:
    code, out, _ = _run("--help")
    text = " ".join(out.split())
    assert code == 0 and "--version" in text and "before the command" in text and "--stages-per-rank" in text
