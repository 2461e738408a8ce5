"""A schedule generator's refusal names what the user set, on every surface that builds a schedule: the flags
on the command line (``simulate``/``compare``/``show``: ``--ranks``; ``train``: ``--pp``), the request's fields in
the Python API and the playground (``ranks=4``; train's keys: ``pp=4``), the generator's own arguments in a
``generate`` call (``num_ranks=4``). It said ``group_size=5: must be an integer in 1..num_ranks=4`` everywhere,
and a family option no command sets (``it takes: costs``). train's stall budget without a link's k said
``max_stall=5: needs offload_ratio > 0 ... --offload-ratio 0.7``, fields and flags in one line."""
from __future__ import annotations

import json
import pickle
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.schedules import generate
from tests.conftest import run_cli

FIELD = re.compile(r"\b[a-z]+_[a-z_]+=")  # a field's name with its value (group_size=5), where a flag belongs


def _refusal(*argv: str) -> str:
    code, out, err = run_cli(*argv)
    assert code == 2 and not out and len(err.splitlines()) == 1, err
    assert not FIELD.search(err) and "num_ranks" not in err, err  # flags only
    return err.split(": error: ", 1)[1].rstrip("\n")


@pytest.mark.parametrize("argv, line", [
    (("group-interleaved", "--ranks", "4", "--group-size", "5"),
     "--group-size 5: must be an integer in 1..4 (--ranks 4); use 2 (lowest memory) up to 4 (lowest bubble)"),
    (("1f1b", "-d", "4", "-v", "2"),
     "--stages-per-rank 2: 1f1b places one stage per rank; use interleaved-1f1b or group-interleaved for more"),
    (("zb-v", "-d", "4", "-v", "3"), "--stages-per-rank 3: zb-v uses V placement, which holds exactly 2 stages per "
                                     "rank (r and 2d-1-r); pass --stages-per-rank 2"),
    (("interleaved-1f1b", "-d", "4", "-m", "9"),
     "--microbatches 9: interleaved-1f1b needs microbatches to split into equal rounds (m < d, or m divisible by "
     "m // d = 2); use a multiple of --ranks 4, e.g. --microbatches 8"),
    (("zb-h1", "-d", "4", "-m", "9", "-v", "2"), "--microbatches 9: zb-h1 with --stages-per-rank 2 needs"),
    (("zb-v", "-d", "4", "--group-size", "2"), "schedule 'zb-v' does not take --group-size (group-interleaved "
                                               "does); leave it out"),
    (("1f1b", "--backward", "full"), "schedule '1f1b' does not take --backward (group-interleaved does); leave it "
                                     "out"),
])
def test_simulate_and_show_name_their_flags(argv: tuple[str, ...], line: str) -> None:
    assert _refusal("simulate", *argv).startswith(line)
    assert _refusal("show", *argv).startswith(line)


def test_compare_names_the_flags_of_the_argument() -> None:
    assert _refusal("compare", "1f1b", "zb-v -d 4 -v 3") == (
        "'zb-v -d 4 -v 3': --stages-per-rank 3: zb-v uses V placement, which holds exactly 2 stages per rank "
        "(r and 2d-1-r); pass --stages-per-rank 2")


def test_the_python_api_names_the_request_fields_and_generate_its_arguments() -> None:
    from pipeoffload.service import SimulateRequest, simulate

    with pytest.raises(ConfigError, match=r"^group_size=5: must be an integer in 1\.\.4 \(ranks=4\); use 2"):
        simulate(SimulateRequest("group-interleaved", ranks=4, group_size=5))
    with pytest.raises(ConfigError, match=r"^schedule 'zb-v' does not take group_size \(group-interleaved does\); "
                                          r"leave it out$"):
        SimulateRequest("zb-v", group_size=2)
    with pytest.raises(ConfigError, match=r"^group_size=5: must be an integer in 1\.\.4 \(num_ranks=4\)"):
        generate("group-interleaved", 4, 8, group_size=5)
    with pytest.raises(ConfigError, match=r"^schedule 'zb-v' does not take group_size \(group-interleaved does\); "
                                          r"it takes costs$"):  # the Python call does take costs
        generate("zb-v", 4, 8, group_size=2)


def test_the_playground_names_its_query_fields(base: str) -> None:
    query = urllib.parse.urlencode({"family": "interleaved-1f1b", "ranks": 4, "microbatches": 9})
    try:
        with urllib.request.urlopen(f"{base}/api/simulate?{query}", timeout=60) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    assert status == 400 and json.loads(body)["error"] == (
        "microbatches=9: interleaved-1f1b needs microbatches to split into equal rounds (m < d, or m divisible by "
        "m // d = 2); use a multiple of ranks=4, e.g. microbatches=8")


@pytest.mark.parametrize("flags, line", [
    (("--pp", "4", "--nproc", "4", "--schedule", "group-interleaved", "--group-size", "5"),
     "--group-size 5: must be an integer in 1..4 (--pp 4); use 2 (lowest memory) up to 4 (lowest bubble)"),
    (("--pp", "2", "--nproc", "2", "--schedule", "zb-v", "--group-size", "2"),
     "schedule 'zb-v' does not take --group-size (group-interleaved does); leave it out"),
    (("--pp", "2", "--nproc", "2", "--stages-per-rank", "2"), "--stages-per-rank 2: 1f1b places one stage per rank"),
    (("--pp", "4", "--nproc", "4", "--schedule", "interleaved-1f1b", "--microbatches", "9", "--global-batch", "9"),
     "--microbatches 9: interleaved-1f1b needs microbatches to split into equal rounds (m < d, or m divisible by "
     "m // d = 2); use a multiple of --pp 4, e.g. --microbatches 8"),
    (("--offload", "all", "--max-stall", "5"),
     "--max-stall 5: needs --offload-ratio > 0 (with 0 the copies are planned as instant and never stall); give "
     "the link's k, e.g. --offload-ratio 0.7"),
    (("--fsdp", "--dp", "2", "--nproc", "2", "--zero", "1"), "--fsdp with --zero 1: FSDP already shards the "
                                                              "optimizer state; choose one (leave out --zero or --fsdp)"),
])
def test_train_names_its_flags(flags: tuple[str, ...], line: str) -> None:
    assert _refusal("train", *flags, "--steps", "1").startswith(line)


@pytest.mark.parametrize("keys, line", [
    ({"pp": 4, "nproc": 4, "schedule": "group-interleaved", "group_size": 5},
     "group_size=5: must be an integer in 1..4 (pp=4)"),
    ({"offload": "all", "max_stall": 5.0}, "max_stall=5: needs offload_ratio > 0 (with 0 the copies are planned as "
                                           "instant and never stall); give the link's k, e.g. offload_ratio=0.7"),
])
def test_train_config_names_its_keys(keys: dict, line: str) -> None:
    from pipeoffload.train.config import TrainConfig, validate

    with pytest.raises(ConfigError) as err:
        validate(TrainConfig.build(**keys))
    assert str(err.value).startswith(line) and "--" not in str(err.value), err.value


def test_the_runtime_demo_names_its_flags(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    from pipeoffload.runtime.demo import main

    with pytest.raises(SystemExit) as done:
        main(["--spawn", "4", "--schedule", "interleaved-1f1b", "--microbatches", "9"])
    assert done.value.code == 2 and capsys.readouterr().err == (
        "python -m pipeoffload.runtime: error: --microbatches 9: interleaved-1f1b needs microbatches to split into "
        "equal rounds (m < d, or m divisible by m // d = 2); use a multiple of --spawn 4, e.g. --microbatches 8\n")


def test_a_renamed_error_keeps_both_namings_through_pickle() -> None:
    from pipeoffload.errors import renaming

    with pytest.raises(ConfigError) as caught, renaming({"num_ranks": "pp"}):
        generate("group-interleaved", 4, 8, group_size=5)
    err = pickle.loads(pickle.dumps(caught.value))
    assert str(err).startswith("group_size=5: must be an integer in 1..4 (pp=4)")
    assert err.in_words(FLAGS).startswith("--group-size 5: must be an integer in 1..4 (--pp 4)")


def test_too_little_data_names_seq_len_as_set() -> None:
    from pipeoffload.train.config import TrainConfig
    from pipeoffload.train.preflight import check_sequences

    with pytest.raises(ConfigError) as err:
        check_sequences(100, TrainConfig.build(seq_len=64))
    assert str(err.value).endswith("sequences of seq_len=64; use more text or a smaller seq_len"), err.value
    assert err.value.in_words(FLAGS).endswith("sequences of --seq-len 64; use more text or a smaller --seq-len")
