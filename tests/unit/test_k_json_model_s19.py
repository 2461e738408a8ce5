"""`k --json` names the model it worked out k for, as `estimate --json` does (it gave only hidden and seq)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("flags, name", [(("--model", "gpt3-13b"), "gpt3-13b"),
                                         (("--model", "qwen3-0.6b"), "qwen3-0.6b"),
                                         (("--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "64"), "gpt-h64")])
def test_k_json_names_the_model(flags: tuple[str, ...], name: str) -> None:
    code, out, err = run_cli("k", *flags, "--gpu", "a100", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == name
