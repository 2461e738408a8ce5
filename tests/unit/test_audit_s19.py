"""A new user's audit of the less travelled commands (nineteenth session): each test failed before its fix."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import refused


@pytest.mark.parametrize("theta", ["0", "-1"])
def test_train_refuses_a_rope_base_that_is_not_positive(tmp_path: Path, theta: str) -> None:
    """``--model llama --rope-theta -1`` started the run and stopped at step 1 on a NaN loss (exit 1, a
    run folder left behind): RoPE's frequencies are ``theta ** -(i / d)``."""
    out = tmp_path / "run"
    refused(f"train --model llama --rope-theta {theta} --steps 1 --out {out}", f"rope_theta={theta}", "> 0")
    assert not out.exists()


def test_train_refuses_an_hf_folder_whose_rope_base_is_not_positive(tmp_path: Path) -> None:
    from tests.unit.test_plan_cli_io import _hf_dir_with_zero_weights

    folder = tmp_path / "model"
    _hf_dir_with_zero_weights(folder)
    config = json.loads((folder / "config.json").read_text())
    rope = {**config.get("rope_parameters", {}), "rope_theta": 0}  # transformers 5 reads it there
    (folder / "config.json").write_text(json.dumps({**config, "rope_theta": 0, "rope_parameters": rope}))
    refused(f"train --model hf:{folder} --steps 1 --out {tmp_path / 'run'}", "rope_theta=0", "config.json")
    assert not (tmp_path / "run").exists()


def test_k_names_its_tp_flag_as_estimate_and_plan_do() -> None:
    """``k --tp 0`` said "tp: 0 must be >= 1", the request's field, where ``estimate --tp 0`` names the flag."""
    refused("k --model llama3-8b --tp 0", "argument --tp: 0 must be >= 1")


@pytest.mark.parametrize("source", ["--hw offload_gbps=20", "--hardware-file {file}"])
def test_an_unknown_hardware_key_is_named_as_given(tmp_path: Path, source: str) -> None:
    """``--hw offload_gbps=20`` was refused as "unknown hardware field(s) offload_bandwidth", a name the user never
    wrote, and the valid names left out the GB/s, GiB and TFLOP/s forms the help's own example uses."""
    file = tmp_path / "gpu.toml"
    file.write_text('preset = "h100"\noffload_gbps = 20\n')
    err = refused(f"k --model llama3-8b {source.format(file=file)}", "unknown hardware field offload_gbps;",
                  "nvlink_gbps", "memory_gib", "peak_tflops")
    assert "offload_bandwidth" not in err


@pytest.mark.parametrize(("text", "piece"), [
    (b"\xd0\xcf\x11\xe0 binary", "codec can't decode"),
    (b"hardware = 3\n", "hardware = 3: not a table"),
    (b"preset = 3\n", "preset = 3: not a GPU preset"),
    (b'preset = "nope"\n', "preset = 'nope': not a GPU preset"),
])
def test_a_hardware_file_that_cannot_be_read_is_named(tmp_path: Path, text: bytes, piece: str) -> None:
    """A binary file or a ``hardware`` key that is not a table read "--hw : 'utf-8' codec can't decode ..."
    or "--hw : 'int' object is not iterable", naming a flag that was not given; a preset that is not one
    did not name the file."""
    file = tmp_path / "gpu.toml"
    file.write_bytes(text)
    err = refused(f"k --model llama3-8b --hardware-file {file}", f"hardware file '{file}'", piece)
    assert "--hw" not in err


def test_a_profile_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    """``plan --profile`` of a binary file was a UnicodeDecodeError traceback."""
    file = tmp_path / "layer.json"
    file.write_bytes(b"\xd0\xcf\x11\xe0 binary")
    refused(f"plan --model gpt3-1.3b --gpus 4 --global-batch 8 --profile {file}", f"layer-cost file '{file}'",
            "codec can't decode")


def test_estimate_names_the_p2p_flags_it_refuses() -> None:
    """``estimate --p2p megatron`` on zb-v said "p2p 'megatron' ... use p2p 'eager'", the request's words."""
    refused("estimate --model llama3-8b --pp 4 --global-batch 16 --schedule zb-v --p2p megatron",
            "--p2p megatron times", "not --schedule zb-v with --offload none", "use --p2p eager")


def test_the_estimate_request_names_its_fields_there() -> None:
    from pipeoffload import EstimateRequest
    from pipeoffload.errors import ConfigError
    from pipeoffload.planner.hardware import hardware_preset
    from pipeoffload.planner.presets import model_preset

    with pytest.raises(ConfigError, match="p2p=megatron .* not schedule=zb-v .*; use p2p=eager"):
        EstimateRequest(model=model_preset("llama3-8b"), hardware=hardware_preset("a100"), pp=4, global_batch=16,
                        schedule="zb-v", p2p="megatron")


@pytest.mark.parametrize("options", [{"group_size": 4}, {"backward": "full"}])
def test_show_prints_the_group_interleaved_schedule_simulate_runs(options: dict) -> None:
    """``show`` had no --group-size or --backward: a user who simulated ``group-interleaved -g 4`` could not print
    that schedule (to read it, or edit it into a schedule file), only the family's default g."""
    from pipeoffload import generate
    from tests.conftest import run_cli

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    code, out, err = run_cli("show", "group-interleaved", "-d", "4", "-m", "8", *flags, "--format", "json")
    assert code == 0, err
    expected = generate("group-interleaved", 4, 8, **options)
    assert out.strip() == expected.to_json() and expected != generate("group-interleaved", 4, 8)


@pytest.mark.parametrize(("given", "unit"), [("d2h_gbps=-1", "GB/s"), ("memory_gib=0", "GiB"),
                                             ("peak_tflops=-5", "TFLOP/s"), ("memory_gib=1e-12", "GiB")])
def test_a_hardware_value_in_friendly_units_is_refused_in_them(given: str, unit: str) -> None:
    """``--hw d2h_gbps=-1`` read "hardware d2h_bandwidth=-1000000000.0: must be a positive number", and
    ``memory_gib=1e-12`` "memory_bytes=0.00107374: below 1 per second": names and numbers the user never wrote."""
    err = refused(f"k --model llama3-8b --hw {given}", f"--hw {given}: must be a positive number of {unit}")
    assert "_bandwidth" not in err and "_bytes" not in err and "peak_flops" not in err


def test_k_says_which_constant_each_source_is() -> None:
    """With --flops and --offload-bw the bracket read "[a100: user override; user override]"."""
    from tests.conftest import run_cli

    code, out, _ = run_cli("k", "--model", "llama3-8b", "--flops", "200", "--offload-bw", "25")
    assert code == 0 and "[a100: B_c user override; B_o user override]" in out
