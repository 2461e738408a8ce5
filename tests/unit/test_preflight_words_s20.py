"""The memory refusal of `train`'s preflight counts in English (1 sequence, 1 held-out batch) and names the
command line's flags on the CLI and the config's keys in Python, not a mix of both (session 20 audit)."""
from __future__ import annotations

import pytest

from pipeoffload.errors import FLAGS, ConfigError
from pipeoffload.train.config import TrainConfig, validate
from pipeoffload.train.preflight import GIB, DataFacts, check_memory


def _refusal(**overrides: object) -> ConfigError:
    cfg = validate(TrainConfig.build(**overrides))
    with pytest.raises(ConfigError) as info:
        check_memory(cfg, DataFacts(tokens=10**6, vocab=256, resident_bytes=0), available=GIB // 1024)
    return info.value


def test_one_sequence_and_one_held_out_batch_are_singular() -> None:
    err = _refusal(global_batch=4, microbatches=4, eval_batches=1, seq_len=512, hidden=256, heads=4)
    text = str(err)
    assert "one microbatch of 1 sequence " in text and "1 held-out batch for" in text, text
    assert "1 sequences" not in text and "1 held-out batches" not in text


def test_the_refusal_names_flags_on_the_command_line_and_keys_in_python() -> None:
    err = _refusal(global_batch=8, microbatches=2, eval_batches=2, seq_len=2048, hidden=64, heads=4)
    fields, flags = str(err), err.in_words(FLAGS)
    assert "4 sequences of seq_len=2048" in fields and "eval_batches=2" in fields and "--" not in fields, fields
    assert "4 sequences of --seq-len 2048" in flags and "--eval-batches 2" in flags and "=" not in flags, flags
