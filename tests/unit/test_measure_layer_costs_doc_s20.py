"""``measure_layer_costs`` says how it calls the block and the head: a block of ``pipeoffload.models`` takes
``(x, pad_mask, offset)``, so its input is ``(x, None, 0)``; docs/planner.md's example and the docstring's run
(a bare tensor, as the docs implied, fails inside the block's forward)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeoffload import profiling  # noqa: E402
from pipeoffload.models import GPTConfig, gpt_layers, lm_loss  # noqa: E402
from pipeoffload.planner.measured import load_layer_costs  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

PLANNER_DOC = Path(__file__).resolve().parents[2] / "docs" / "planner.md"


def _doc_block() -> str:
    text = PLANNER_DOC.read_text()
    start = text.index("- `measure_layer_costs(block, head, hidden")
    block = re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)  # type: ignore[union-attr]
    return "\n".join(line[2:] for line in block.splitlines())  # the list item's indent


def test_the_planner_docs_example_measures_a_gpt_block_and_plan_reads_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    space: dict = {}
    exec(compile(_doc_block(), str(PLANNER_DOC), "exec"), space)  # noqa: S102 - the docs' own code
    costs = space["costs"]
    assert costs.params == sum(p.numel() for p in space["block"].parameters())
    assert costs.boundary_bytes == 2 * 32 * 64 * 4  # x alone: the mask (None) and the offset are no bytes
    assert costs.embedding_params == sum(p.numel() for p in space["embed"].parameters())
    assert load_layer_costs(tmp_path / "layer.json") == costs
    code, out, err = run_cli("plan", "--hidden", "64", "--heads", "4", "--seq", "32", "--layers", "8", "--vocab",
                             "100", "--microbatch-size", "2", "--gpus", "2", "--global-batch", "8", "--memory", "1",
                             "--profile", "layer.json", "--json")
    assert code == 0 and json.loads(out)["best"], err


def test_the_docstring_example_runs() -> None:
    text = profiling.measure_layer_costs.__doc__ or ""
    example = text.split("::\n\n", 1)[1].split("\n\n")[0]  # the indented block, up to the next paragraph
    lines = [line[8:] for line in example.splitlines()]
    space = {"torch": torch, "gpt_layers": gpt_layers, "GPTConfig": GPTConfig, "lm_loss": lm_loss,
             "measure_layer_costs": profiling.measure_layer_costs}
    exec("\n".join(lines), space)  # noqa: S102 - the docstring's own code
    assert space["costs"].boundary_bytes == 2 * 32 * 64 * 4


def test_a_bare_tensor_is_not_what_a_models_block_takes() -> None:
    """Why the docs say ``(x, None, 0)``: the block's forward needs the mask and the offset."""
    embed, block, head = gpt_layers(GPTConfig(layers=1, hidden=64, seq=32))
    with pytest.raises(TypeError, match="pad_mask"):
        profiling.measure_layer_costs(block, head, torch.randn(2, 32, 64), loss_fn=lm_loss,
                                      target=torch.randint(0, 64, (2, 32)), warmup=1, repeats=1)
