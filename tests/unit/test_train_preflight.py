"""`pipeoffload train` refuses, in one line with exit 2, what would fail only inside the ranks: bad token
files, too little data, out-of-range values, runs that cannot fit in memory; nothing is written first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeoffload.cli import main
from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig, validate
from pipeoffload.train.preflight import DataFacts, check_memory, data_facts, memory_lower_bound

GIB = 1024**3


def _token_files(folder: Path) -> dict[str, Path]:
    """Every kind of bad token file: name -> path."""
    files = {
        "empty.bin": b"",
        "three.bin": b"\x01\x02\x03",
        "garbage.npy": b"this is not an npy file at all" * 3,
        "empty.npy": None,
        "object.npy": None,
        "negative.npy": None,
        "huge.npy": None,
        "float.npy": None,
        "matrix.npy": None,
    }
    out = {}
    for name, raw in files.items():
        path = folder / name
        if raw is not None:
            path.write_bytes(raw)
        out[name] = path
    np.save(folder / "empty.npy", np.zeros(0, dtype=np.uint16))
    np.save(folder / "object.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
    np.save(folder / "negative.npy", np.array([5, 3, -1] + [2] * 5000, dtype=np.int32))
    np.save(folder / "huge.npy", np.array([1] * 5000 + [2_000_000_000], dtype=np.int64))
    np.save(folder / "float.npy", np.linspace(0, 1, 5000))
    np.save(folder / "matrix.npy", np.zeros((100, 100), dtype=np.uint16))
    np.save(folder / "tokens.npy", np.arange(5000, dtype=np.uint16) % 500)
    return out


CASES = [  # (flags, words the one line must contain); {tmp} is the test's folder
    (["--timeout", "inf"], ["timeout", "finite"]),
    (["--timeout", "1e300"], ["timeout=1e+300", "a week"]),
    (["--timeout", "0.001"], ["timeout=0.001", ">= 1"]),
    (["--lr", "nan"], ["lr", "finite"]),
    (["--data", "{tmp}/empty.bin"], ["empty.bin", "empty"]),
    (["--data", "{tmp}/three.bin"], ["three.bin", "3 bytes", "uint16"]),
    (["--data", "{tmp}/garbage.npy"], ["garbage.npy", "not a .npy"]),
    (["--data", "{tmp}/empty.npy"], ["empty.npy", "0 token"]),
    (["--data", "{tmp}/object.npy"], ["object.npy", "not a .npy"]),
    (["--data", "{tmp}/negative.npy"], ["negative.npy", "-1", ">= 0"]),
    (["--data", "{tmp}/huge.npy"], ["huge.npy", "2000000000", "vocabulary"]),
    (["--data", "{tmp}/float.npy"], ["float.npy", "integers", "float64"]),
    (["--data", "{tmp}/matrix.npy"], ["matrix.npy", "flat array", "(100, 100)"]),
    (["--data", "{tmp}/tiny.txt"], ["tokens give", "--seq-len"]),
    (["--data", "{tmp}/tiny.txt", "--tokenizer", "bpe:300"], ["at most 9 tokens give", "--seq-len"]),
    (["--data", "{tmp}/no_text"], ["no text files"]),
    (["--out", "{tmp}/a_file"], ["out=", "not a folder"]),
    (["--layers", "1000000"], ["needs at least", "GiB", "--layers 1000000"]),
    (["--model", "llama", "--vocab", "300", "--data", "{tmp}/tokens.npy"], ["vocab=300", "--vocab"]),
    (["--steps", "5", "--extend"], ["--extend", "--resume"]),
    (["--seed", str(2**63)], ["seed=", "2**63"]),
    (["--kv-heads", "2"], ["kv_heads=2", "not used by model='gpt'"]),
    (["--data", "/dev/null"], ["/dev/null", "not a regular file"]),
    (["--global-batch", str(10**30 + 1)], ["microbatches=4", "e.g. microbatches=1"]),  # it searched for ever
]


@pytest.mark.parametrize("flags, words", CASES, ids=[" ".join(c[0]).split("/")[-1] for c in CASES])
def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         flags: list[str], words: list[str]) -> None:
    _token_files(tmp_path)
    (tmp_path / "tiny.txt").write_text("too short")
    (tmp_path / "no_text").mkdir()
    (tmp_path / "no_text" / "x.bin").write_bytes(b"\0\0")
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "run"
    argv = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert all(w in err[0] for w in words), err[0]
    assert not out.exists()  # neither config.toml nor train.log: nothing was written


def test_the_memory_bound_scales_with_the_model_and_the_held_out_batches() -> None:
    cfg = validate(TrainConfig.build())
    facts = DataFacts(tokens=10**11, vocab=256, resident_bytes=0)  # held-out data for 9.7 million batches
    small = memory_lower_bound(cfg, facts, local_ranks=1)
    assert small < 64 * 2**20  # the default toy GPT: megabytes
    assert memory_lower_bound(cfg.updated(eval_batches=10**6), facts, 1) - small == (10**6 - 2) * 8 * 64 * 16
    check_memory(cfg, facts, available=GIB)
    with pytest.raises(ConfigError, match=r"needs at least 7\.6 GiB .*1000000 held-out batches for "
                       r"eval_batches=1000000 7\.6 GiB.*\) but 4\.0 GiB are available; lower eval_batches"):
        check_memory(cfg.updated(eval_batches=10**6), facts, available=4 * GIB)
    zero = cfg.updated(dp=2, global_batch=8, microbatches=4, zero=1, nproc=2)
    assert memory_lower_bound(zero, facts, 2) < memory_lower_bound(zero.updated(zero=0), facts, 2)


def test_the_text_size_counts_for_every_local_rank(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("x" * 10_000)
    facts = data_facts(validate(TrainConfig.build(data=str(text))))
    assert (facts.tokens, facts.vocab) == (10_000, 256) and facts.resident_bytes >= 10_000


def test_refusals_do_not_import_torch(tmp_path: Path) -> None:
    (tmp_path / "t.bin").write_bytes(b"\1\2\3")
    code = (f"import sys\nfrom pipeoffload.cli import main\n"
            f"assert main(['train', '--data', {str(tmp_path / 't.bin')!r}, '--out', {str(tmp_path / 'r')!r}]) == 2\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_parameter_count_is_the_reference_gpts() -> None:
    from pipeoffload.train.model import full_gpt
    from pipeoffload.train.preflight import gpt_parameters

    cfg = validate(TrainConfig.build(layers=3, hidden=96, heads=4, seq_len=40))
    assert gpt_parameters(cfg, 300) == sum(p.numel() for p in full_gpt(cfg, 300).parameters())


def test_the_memory_bound_counts_only_the_held_out_batches_the_data_holds() -> None:
    """eval_batches beyond the held-out data is capped in the ranks (``data.val_batches_held``): the bound
    counts the batches that will be held, so a large eval_batches neither refuses nor over-counts a run."""
    from pipeoffload.train.data import Corpus

    cfg = validate(TrainConfig.build())  # seq_len 64, global_batch 8, val_fraction 0.05
    facts = DataFacts(tokens=200_000, vocab=256, resident_bytes=0)
    held = Corpus(np.zeros(facts.tokens, dtype=np.uint16), 256, 64, 0.05).val_batches_held(8)
    assert held == 19  # 9,999 held-out tokens: 156 sequences, 19 whole batches of 8
    batch = 8 * 64 * 16  # int64 inputs and targets of one batch
    base = memory_lower_bound(cfg, facts, 1)
    assert memory_lower_bound(cfg.updated(eval_batches=held), facts, 1) - base == (held - 2) * batch
    assert memory_lower_bound(cfg.updated(eval_batches=10**8), facts, 1) - base == (held - 2) * batch
    check_memory(cfg.updated(eval_batches=10**8), facts, available=GIB)  # 19 batches: megabytes, not 6 TiB
    # a BPE's token count is an upper bound: only the one batch surely held counts toward the lower bound
    bpe = DataFacts(tokens=200_000, vocab=300, resident_bytes=0, exact=False)
    assert memory_lower_bound(cfg.updated(eval_batches=10**8), bpe, 1) == \
        memory_lower_bound(cfg.updated(eval_batches=1), bpe, 1)


def test_a_large_eval_batches_on_little_held_out_text_is_not_refused(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("x" * 100_000)
    from pipeoffload.train.preflight import check_run

    check_run(validate(TrainConfig.build(data=str(text), eval_batches=10**8, out=str(tmp_path / "run"))),
              available=4 * GIB)
