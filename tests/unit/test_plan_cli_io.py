"""plan's inputs and outputs: budgets vs the device, flag messages, --emit, --compare-tp, simulate --costs."""
import json

import pytest
import tomllib

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.planner.hardware import GIB, hardware_preset
from pipeoffload.planner.plans import PlanRequest
from pipeoffload.planner.presets import model_preset

SMALL = ["--model", "gpt3-1.3b", "--seq", "2048", "--gpus", "8", "--global-batch", "16"]


def test_memory_above_the_device_warns_and_no_plan_exceeds_the_device(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", *SMALL, "--memory", "1000", "--json", "--no-pareto"]) == 0
    captured = capsys.readouterr()
    assert "--memory 1000 GiB is above the a100's 80.00 GiB" in captured.err
    data = json.loads(captured.out)
    assert data["memory_budget_gib"] == pytest.approx(80.0)
    assert all(p["memory_gib"]["total"] <= 80.0 for p in data["best"] + data["pareto"])


def test_a_request_above_the_device_is_refused() -> None:
    hw = hardware_preset("h100")
    with pytest.raises(ConfigError, match="above the h100's 79.65 GiB"):
        PlanRequest(model=model_preset("gpt3-1.3b"), hardware=hw, gpus=8, global_batch=8, memory_budget=80 * GIB)


@pytest.mark.parametrize("argv, needle", [
    (["--flops", "1000"], "--flops 1000: the sustained rate must be > 0 and at most the a100's peak 312"),
    (["--tp", "3"], "--tp 3: must divide --gpus 8"),
    (["--memory", "0"], "--memory 0: must be > 0 GiB"),
    (["--host-memory", "-1"], "--host-memory -1: must be > 0 GiB"),
    (["--network", "token-ring"], "unknown network 'token-ring'"),
    (["--baseline", "best"], "--baseline only applies with --compare-tp"),
])
def test_bad_flags_name_the_flag(capsys, argv: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", *SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_emit_writes_the_train_config_and_prints_the_command(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.toml"
    assert main(["plan", *SMALL, "--memory", "20", "--no-pareto", "--emit", str(path)]) == 0
    out = capsys.readouterr().out
    from pipeoffload.train.config import load_toml

    assert set(tomllib.loads(path.read_text())) == {"schedule", "parallel", "data", "model"}  # train's sections
    config = load_toml(path)  # train's own reader: an unknown key in a section is refused
    assert {"schedule", "stages_per_rank", "offload", "recompute", "microbatches", "global_batch", "pp", "dp",
            "tp", "layers", "hidden", "heads", "seq_len", "nproc"} <= set(config)
    assert config["pp"] * config["dp"] * config["tp"] == config["nproc"] == 8
    assert config["global_batch"] == 16 and config["global_batch"] % config["dp"] == 0
    assert (config["layers"], config["hidden"], config["heads"], config["seq_len"]) == (24, 2048, 16, 2048)
    assert f"pipeoffload train --config {path} --nproc 8" in out
    assert "group_size" in config or config["schedule"] != "group-interleaved"
    assert not list(tmp_path.glob(".run.toml.*"))  # written atomically, no temporary left


def test_emit_leaves_out_a_shape_train_cannot_build_and_says_so(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Qwen2's q/k/v biases have no train key: the file leaves the model out, and the printed command
    says that it would train the default GPT (it said only "run it with")."""
    path = tmp_path / "run.toml"
    assert main(["plan", "--model", "qwen2.5-7b", "--seq", "2048", "--gpus", "8", "--global-batch", "16",
                 "--no-pareto", "--emit", str(path)]) == 0
    config = tomllib.loads(path.read_text())
    assert "model" not in config and config["parallel"]["nproc"] == 8
    assert "would train the default GPT" in capsys.readouterr().out
    assert "plan its Hugging Face folder instead" in path.read_text()


@pytest.mark.parametrize("preset", ["llama3-8b", "mistral-7b", "llama2-7b"])
def test_emit_writes_a_llama_shape_that_train_builds_as_planned(tmp_path, capsys, preset: str) -> None:  # type: ignore[no-untyped-def]
    """A Llama-family preset is written as train's --model llama keys (the file had no model: the run
    would have trained the default GPT); train reads back the planned model, parameter for parameter."""
    from pipeoffload.llama_config import PRESETS
    from pipeoffload.planner.presets import model_preset
    from pipeoffload.train.config import build_config, load_toml, validate
    from pipeoffload.train.family import llama_parameters, shape_from_keys

    path = tmp_path / "run.toml"
    assert main(["plan", "--model", preset, "--seq", "2048", "--gpus", "8", "--global-batch", "16",
                 "--no-pareto", "--emit", str(path)]) == 0
    assert "would train the default GPT" not in capsys.readouterr().out
    cfg = validate(build_config(load_toml(path)), data_exists=False)
    assert cfg.model.source == "llama" and cfg.model.rope_theta == PRESETS[preset].rope_theta
    assert llama_parameters(shape_from_keys(cfg.model, 256)) == model_preset(preset).total_params()


@pytest.mark.parametrize("vocab", [None, "1000"])
def test_emit_writes_the_gpt_vocabulary_train_then_builds(tmp_path, capsys, vocab: str | None) -> None:  # type: ignore[no-untyped-def]
    """A GPT-shaped plan of explicit flags wrote layers, hidden, heads and seq_len but no vocab: train's GPT
    then took its tokenizer's 256 byte ids where the plan had costed 50257 (ModelSpec's default) or the
    --vocab given, an embedding and a head of another size than planned (and refused a vocab key)."""
    pytest.importorskip("torch")
    from pipeoffload.planner.model import ModelSpec
    from pipeoffload.train.config import build_config, load_toml, validate
    from pipeoffload.train.model import gpt_config
    from pipeoffload.train.plan import planner_model

    path = tmp_path / "run.toml"
    shape = ["--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "64", *(["--vocab", vocab] if vocab else [])]
    assert main(["plan", *shape, "--gpus", "2", "--global-batch", "8", "--top", "1", "--no-pareto",
                 "--emit", str(path)]) == 0
    planned = int(vocab) if vocab else ModelSpec(layers=1, hidden=64, heads=1, seq=64).vocab
    cfg = validate(build_config(load_toml(path)), data_exists=False)
    assert cfg.model.source == "gpt"
    assert gpt_config(cfg, 256).vocab == planned  # what train builds with the default byte tokenizer
    assert planner_model(cfg).vocab == planned  # and what train --plan auto would plan for it


def test_emit_writes_the_recompute_policy_its_table_shows(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """With offload the planner's memory assumes LGD; train does not perform it, so the file says what the
    table says (it wrote "none,lgd" under a table saying "none")."""
    path = tmp_path / "run.toml"
    # --pp 2: a pipeline, so that the best plan offloads (a one-rank pipeline cannot, and may be faster)
    argv = ["plan", *SMALL, "--pp", "2", "--memory", "20", "--no-pareto", "--offload", "all", "--json"]
    assert main([*argv, "--emit", str(path)]) == 0
    best = json.loads(capsys.readouterr().out)["best"][0]
    assert best["offload"] != "none"  # the case where LGD is assumed
    schedule = tomllib.loads(path.read_text())["schedule"]
    assert (schedule["offload"], schedule["recompute"]) == (best["offload"], best["recompute"])


def test_compare_tp_prints_both_plans_and_their_ratio(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", *SMALL, "--compare-tp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pp"]["layout"]["tp"] == 1 and data["tp"]["layout"]["tp"] == 8
    assert data["tp"]["schedule"] in ("interleaved-1f1b", "1f1b") and data["tp"]["offload"] == "none"
    assert data["speedup"] == pytest.approx(data["pp"]["tokens_per_s"] / data["tp"]["tokens_per_s"])
    assert main(["plan", *SMALL, "--compare-tp", "--baseline", "best"]) == 0
    out = capsys.readouterr().out
    assert "PP + offload / baseline: throughput x" in out and "act GiB" in out


def test_compare_tp_with_matched_memory_stays_within_the_baseline(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["--model", "gpt3-1.3b", "--seq", "8192", "--gpus", "8", "--global-batch", "32"]
    assert main(["plan", *argv, "--compare-tp", "--match-memory", "--baseline", "best", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pp"] is not None and data["pp"]["layout"]["tp"] == 1
    peaks = data["activation_peak_gib"]  # each side's largest rank activation peak
    assert data["pp"]["memory_gib"]["activations"] <= peaks["pp"] <= peaks["tp"] * (1 + 1e-9)
    assert main(["plan", *SMALL, "--compare-tp", "--match-memory", "--json"]) == 0  # TP8: 0.4 GiB, out of reach
    data = json.loads(capsys.readouterr().out)
    assert data["pp"] is None and "activation peak within the baseline's" in data["pp_error"]


def test_simulate_reads_a_cost_file_with_per_stage_w_fraction(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = ["simulate", "zb-h1", "-d", "2", "-m", "8", "--json"]
    toml = tmp_path / "costs.toml"
    toml.write_text("time_f = [1.0, 1.0]\ntime_i = 1.0\ntime_w = 1.0\nw_fraction = [1.0, 1.0]\n")
    assert main([*base, "--costs", str(toml)]) == 0
    full = json.loads(capsys.readouterr().out)
    half = tmp_path / "costs.json"
    half.write_text(json.dumps({"time_f": [1.0, 1.0], "time_i": 1.0, "time_w": 1.0, "w_fraction": [1.0, 0.5]}))
    assert main([*base, "--costs", str(half)]) == 0
    part = json.loads(capsys.readouterr().out)
    assert part["makespan"] == full["makespan"]
    assert part["per_rank"][1]["peak_activation_units"] < full["per_rank"][1]["peak_activation_units"]
    assert part["per_rank"][0]["peak_activation_units"] == full["per_rank"][0]["peak_activation_units"]
    toml.write_text("time_f = 1.0\nwarp = 2\n")
    assert main([*base, "--costs", str(toml)]) == 2
    assert "unknown key(s) warp" in capsys.readouterr().err


def test_k_names_the_tp_flag(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["k", "--hidden", "4096", "--seq", "8192", "--tp", "3"]) == 2
    assert "--tp 3: must divide the model's heads (32)" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["alternating", "serialized"])
def test_shared_host_link_modes_plan(capsys, mode: str) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", *SMALL, "--memory", "20", "--no-pareto", "--json", "--shared-host-link", mode]) == 0
    assert json.loads(capsys.readouterr().out)["best"]


def test_emitted_config_is_accepted_by_train(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The two ends of one interface: what `plan --emit` writes, `train --config` validates unchanged."""
    from pipeoffload.train.config import build_config, load_toml, validate

    path = tmp_path / "run.toml"
    assert main(["plan", *SMALL, "--memory", "20", "--no-pareto", "--emit", str(path)]) == 0
    emitted = load_toml(path)
    cfg = validate(build_config(emitted), data_exists=False)
    assert (cfg.schedule.family, cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.tp, cfg.schedule.microbatches) == (
        emitted["schedule"], emitted["pp"], emitted["dp"], emitted["tp"], emitted["microbatches"])
    assert cfg.schedule.offload == emitted["offload"] and cfg.schedule.recompute == emitted["recompute"]


def _hf_dir(tmp_path, preset: str):  # type: ignore[no-untyped-def]
    """A local Hugging Face directory holding only the config.json of a preset (planning needs no weights)."""
    from pipeoffload.llama_config import PRESETS

    folder = tmp_path / preset
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PRESETS[preset].to_hf()))
    return folder


@pytest.mark.parametrize("preset", ["llama3-8b", "qwen2.5-7b", "qwen3-8b"])
def test_plan_and_estimate_read_an_hf_dir_as_its_preset(tmp_path, capsys, preset: str) -> None:  # type: ignore[no-untyped-def]
    """One source for shapes: the planner's Llama-family presets come from llama_config's table and an
    hf:DIR is read by the same LlamaShape reader (Qwen2's q/k/v biases, tied or not, kv heads)."""
    from dataclasses import replace

    from pipeoffload.planner.cli_args import add_model_args, model_from_args

    folder = _hf_dir(tmp_path, preset)
    import argparse

    parser = argparse.ArgumentParser()
    add_model_args(parser)
    spec = model_from_args(parser.parse_args(["--model", f"hf:{folder}", "--seq", "8192"]))
    assert spec.source == f"hf:{folder.resolve()}"
    assert replace(spec, name=preset, source="") == model_preset(preset)
    argv = ["--seq", "2048", "--global-batch", "16", "--json"]
    for command in (["plan", *argv, "--gpus", "8", "--no-pareto"], ["estimate", *argv, "--tp", "4", "--pp", "2"]):
        assert main([command[0], "--model", f"hf:{folder}", *command[1:]]) == 0
        hf_out = json.loads(capsys.readouterr().out)
        assert main([command[0], "--model", preset, *command[1:]]) == 0
        preset_out = json.loads(capsys.readouterr().out)
        key = "best" if command[0] == "plan" else "step_seconds"
        assert hf_out[key] == preset_out[key]


def test_emit_for_an_hf_dir_names_the_directory_as_the_model_source(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipeoffload.train.config import build_config, load_toml

    folder, path = _hf_dir(tmp_path, "qwen2.5-0.5b"), tmp_path / "run.toml"
    assert main(["plan", "--model", f"hf:{folder}", "--seq", "1024", "--gpus", "4", "--global-batch", "8",
                 "--no-pareto", "--emit", str(path)]) == 0
    model = tomllib.loads(path.read_text())["model"]
    assert model == {"source": f"hf:{folder.resolve()}", "seq_len": 1024, "dtype": "bf16"}
    assert "not GPT-shaped" not in path.read_text()
    cfg = build_config(load_toml(path))  # train's own reader takes the file
    assert (cfg.model.source, cfg.model.seq_len) == (f"hf:{folder.resolve()}", 1024)


def _hf_dir_with_zero_weights(folder):  # type: ignore[no-untyped-def]
    """A complete tiny Hugging Face directory without transformers: config.json from a LlamaShape, one
    safetensors file of zeros with every expected tensor, a tokenizer.json of the same vocabulary."""
    import math
    import struct

    from pipeoffload.hfdir import expected_tensors
    from pipeoffload.llama_config import LlamaShape
    from tests.hf_fixtures import make_tokenizer

    folder.mkdir()
    tokenizer = make_tokenizer(folder / "tokenizer.json")
    shape = LlamaShape(vocab=tokenizer.get_vocab_size(), hidden=32, layers=2, heads=4, kv_heads=2, ffn_hidden=64)
    (folder / "config.json").write_text(json.dumps(shape.to_hf()))
    header, offset = {}, 0
    for name, dims in expected_tensors(shape).items():
        size = 4 * math.prod(dims)
        header[name] = {"dtype": "F32", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    table = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(table)) + table + bytes(offset))


def test_the_emitted_file_of_an_hf_dir_passes_train_validation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`plan --model hf:DIR --emit` then `train --config`: train's validation (which opens the whole
    directory: config, tensors, tokenizer) accepts the file and trains that directory's model."""
    from pipeoffload.train.config import build_config, load_toml, validate

    folder, path = tmp_path / "model", tmp_path / "run.toml"
    _hf_dir_with_zero_weights(folder)
    assert main(["plan", "--model", f"hf:{folder}", "--seq", "64", "--gpus", "2", "--global-batch", "4",
                 "--no-pareto", "--emit", str(path)]) == 0
    cfg = validate(build_config(load_toml(path)))
    assert cfg.model.source == f"hf:{folder.resolve()}" and cfg.model.seq_len == 64 and cfg.world == 2


def test_the_search_time_is_never_printed_as_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    """A search of well under a second said "in 0.0 s = 3936 candidates/s"."""
    import re

    assert main(["plan", *SMALL, "--memory", "40", "--no-pareto"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("searched "))
    seconds = float(re.search(r" in ([0-9.e-]+) s = ", line).group(1))  # type: ignore[union-attr]
    assert seconds > 0, line


@pytest.mark.parametrize("link,said", [([], True), (["--shared-host-link", "serialized"], False)])
def test_offload_plans_say_what_a_faster_or_slower_link_does(capsys, link: list[str], said: bool) -> None:  # type: ignore[no-untyped-def]
    """Where a shown plan offloads over its own link, the report says a faster link keeps its peak
    (docs/offload.md, 'A faster link than planned'); a serialized shared link has no such guarantee."""
    assert main(["plan", *SMALL, "--memory", "12", "--offload", "all", *link]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:3].strip().isdigit()]
    assert any(row[5] == "all" or row[6] == "all" for row in rows)  # a shown plan offloads (g may be "-")
    assert ("a faster link never raises their peak" in out) is said
    assert main(["plan", *SMALL, "--memory", "12", "--offload", "all", *link, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert bool(notes) is said and all("a faster link never raises their peak" in n for n in notes)
