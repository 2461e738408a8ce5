"""What the outputs say is true (session 18's audit, as a user meets them): a schedule file's row in
``compare`` is named by the file, a refusal names the flag, help texts list what the command does and
writes, the run report's legend leaves every bar visible."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import pipeoffload.service
from pipeoffload import SimulateRequest, run
from pipeoffload.errors import ConfigError
from tests.conftest import run_cli


def _edited_1f1b(folder: Path) -> Path:
    """``show 1f1b --format json`` with rank 1's two forwards run back to back (GPipe's order there):
    another schedule, whose file still says ``"name": "1f1b"``."""
    code, text, err = run_cli("show", "1f1b", "-d", "2", "-m", "2", "--format", "json")
    assert code == 0, err
    data = json.loads(text)
    assert data["name"] == "1f1b" and data["actions"][1] == ["1F0", "1B0", "1F1", "1B1"]
    data["actions"][1] = ["1F0", "1F1", "1B0", "1B1"]
    path = folder / "mine.json"
    path.write_text(json.dumps(data))
    return path


def test_compare_names_a_schedule_file_by_its_path_not_the_family_inside(tmp_path: Path) -> None:
    """A file from ``show --format json`` keeps the family's name: beside that family, ``compare`` labelled
    the file's row ``1f1b`` and the family's ``1f1b (repeat 2)``, "the same request twice", which an
    edited file is not."""
    path = _edited_1f1b(tmp_path)
    code, out, err = run_cli("compare", str(path), "1f1b -d 2 -m 2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [row["label"] for row in rows] == [str(path), "1f1b"]
    assert rows[0]["peak_activation_units"] == 2 and rows[1]["peak_activation_units"] == 2  # worst rank: rank 0
    assert rows[0]["per_rank"][1]["peak_activation_units"] == 2 != rows[1]["per_rank"][1]["peak_activation_units"]


def test_a_schedule_files_report_row_names_the_file(tmp_path: Path) -> None:
    path = _edited_1f1b(tmp_path)
    result = run(SimulateRequest(schedule_file=str(path)))
    assert result.label().startswith(f"{path} d=2 m=2 v=1")
    assert result.as_dict()["schedule"] == "1f1b"  # the data's own name is still reported as the schedule's


def test_a_schedule_files_rank_refusal_names_the_flag_on_the_command_line(tmp_path: Path) -> None:
    """It said "leave ranks out" (the request's field) to a command-line user."""
    path = _edited_1f1b(tmp_path)
    code, _, err = run_cli("simulate", str(path), "-d", "8")
    assert code == 2 and "the file sets them; leave --ranks out" in err, err
    with pytest.raises(ConfigError, match="the file sets them; leave ranks out"):
        run(SimulateRequest(schedule_file=str(path), ranks=8))


def _subparsers(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command and nested action (``trace compare``) by its words."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prefix}{name}"] = sub
                found.update(_subparsers(sub, f"{prefix}{name} "))
    return found


def test_every_nested_commands_help_says_what_it_does() -> None:
    """``pipeoffload trace compare --help`` began with the usage and went on to its arguments."""
    from pipeoffload.cli import build_parser

    commands = _subparsers(build_parser())
    assert "trace compare" in commands
    for words, parser in commands.items():
        said = " ".join((parser.description or "").split())
        assert said and said[:40] in " ".join(parser.format_help().split()), words


def _help(*words: str) -> str:
    from pipeoffload.cli import build_parser

    return " ".join(_subparsers(build_parser())[" ".join(words)].format_help().split())


def test_generates_help_names_mistrals_window_as_a_limit_of_the_context() -> None:
    """The help said the context kept is max_position_embeddings for hf:DIR; a Mistral folder's
    sliding_window caps it (``LlamaShape.context``: 16 of 64 positions below)."""
    from pipeoffload.llama_config import LlamaShape

    shape = LlamaShape.from_hf({"architectures": ["MistralForCausalLM"], "vocab_size": 300, "hidden_size": 64,
                                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "max_position_embeddings": 64, "sliding_window": 16},
                               "config.json")
    assert shape.context == 16
    assert "sliding_window" in _help("generate")


def test_exports_help_lists_the_files_it_carries_from_the_source_folder() -> None:
    from pipeoffload.train.export import TOKENIZER_FILES

    text = _help("export")
    assert "generation_config.json" in TOKENIZER_FILES and "generation_config.json" in text
    assert "chat template" in text and "tokenizer_config.json" in text and "special_tokens_map.json" in text


def test_the_reports_memory_legend_hides_no_bar() -> None:
    """Equal measured and simulated peaks on two ranks: the legend (upper right) covered the top of
    rank 1's bars."""
    pytest.importorskip("matplotlib")
    from pipeoffload.train.report import RunMetrics, report_figure

    rows = [{"step": s, "loss": 5.0, "peak_act_bytes": [638976, 638976], "sim_peak_act_bytes": [638976.0, 638976.0]}
            for s in (1, 2)]
    fig = report_figure(RunMetrics(rows))
    fig.canvas.draw()
    ax = fig.axes[1]
    legend = ax.get_legend().get_window_extent()
    bars = [patch.get_window_extent() for patch in ax.patches]
    assert len(bars) == 4
    assert not [b for b in bars if b.overlaps(legend)]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_timelines_repr_gives_its_figures_not_every_action() -> None:
    """``repr(run(SimulateRequest("zb-v", ranks=8, microbatches=32, offload="all")))`` was 188,727
    characters, nearly all of them the timeline's schedule, starts and ends."""
    result = run(SimulateRequest("zb-v", ranks=8, microbatches=32, offload="all", offload_ratio=0.5))
    text = repr(result.timeline)
    t = result.timeline
    assert text == (f"Timeline(schedule='zb-v', ranks=8, microbatches=32, stages_per_rank=2, "
                    f"actions={t.schedule.num_actions()}, makespan={t.makespan:g}, bubble_ratio={t.bubble_ratio:.4g}, "
                    f"peak_rank_units={t.peak_rank_units:g}, peak_host_units={t.peak_host_units:g}, stall={t.stall:g})")
    assert len(repr(result)) < 5000


@pytest.mark.parametrize("name", [n for n in pipeoffload.service.__all__ if n.endswith(("Result", "Row"))])
def test_every_result_of_the_service_has_its_own_docstring(name: str) -> None:
    """``help(run(SimulateRequest(...)))`` showed only the generated signature of ``SimulateResult``."""
    doc = getattr(pipeoffload.service, name).__doc__ or ""
    assert doc.strip() and not doc.startswith(f"{name}("), name


@pytest.mark.parametrize("family, words, peak", [
    ("interleaved-1f1b", "peak at most d+(d-1)/v rank units", lambda d, v: d + (d - 1) / v),
    ("v-half", "floor((d+2)/2) rank units", lambda d, v: (d + 2) // 2),
    ("v-min", "floor((d+4)/3) rank units", lambda d, v: (d + 4) // 3),
])
def test_the_schedules_list_states_the_peaks_the_simulator_gives(family: str, words: str, peak) -> None:
    """``pipeoffload schedules`` said interleaved 1F1B's memory is "about 1F1B's" (11.5 rank units against 8
    at d = 8, v = 2: 44 % more) and v-min's "about a third" (4 of 8 at d = 8)."""
    from pipeoffload.schedules import get_spec

    assert words in get_spec(family).summary
    for d in (4, 8, 16):
        for v in ((2, 3, 4) if family == "interleaved-1f1b" else (2,)):
            timeline = run(SimulateRequest(family, ranks=d, microbatches=4 * d, stages_per_rank=v)).timeline
            assert timeline.peak_rank_units == pytest.approx(peak(d, v)), (d, v)


def test_generate_names_hf_for_a_hugging_face_folder_given_without_it(tmp_path: Path) -> None:
    """``generate ./model`` said "no config.toml; give the --out folder of `pipeoffload train`", never that
    ``hf:./model`` reads the folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    code, out, err = run_cli("generate", str(folder), "--tokens", "1")
    assert code == 2 and out == "" and err.strip().endswith(f"give it as hf:{folder}"), err


def _hand_offloaded(folder: Path) -> Path:
    """1F1B, 2 ranks, 4 microbatches, with rank 0's copies of microbatch 1 placed by hand."""
    from pipeoffload import CostModel, generate, lower

    lowered = lower(generate("1f1b", num_ranks=2, num_microbatches=4),
                    CostModel.uniform(f=1, i=1, w=1).with_offload_ratio(0.5), offload="all")
    assert "0OFFLOAD1" in lowered.to_text()
    path = folder / "copies.json"
    path.write_text(lowered.to_json())
    return path


def test_a_policy_on_a_file_that_places_its_own_copies_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """``simulate copies.json --offload all`` answered "offload=all, recompute=none: ... pass offload='none'
    and recompute='none' to keep them": the Python call's words, and a recompute it was not given."""
    path = _hand_offloaded(tmp_path)
    code, out, err = run_cli("simulate", str(path), "--offload", "all")
    assert code == 2 and out == "", err
    assert "--offload all with schedule file" in err and "leave --offload out to simulate them as written" in err
    assert "recompute" not in err and "offload=" not in err, err
    with pytest.raises(ConfigError, match="recompute=all with schedule file .*: leave recompute out"):
        run(SimulateRequest(schedule_file=str(path), recompute="all"))
    assert run(SimulateRequest(schedule_file=str(path), offload_ratio=0.5)).timeline.peak_host_units == 1
