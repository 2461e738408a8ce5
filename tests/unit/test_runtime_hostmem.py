"""keep_freed_memory: freed host blocks stay in the process instead of costing page faults again."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# In a fresh process: allocate, touch and free a 40 MiB tensor (above glibc's largest adaptive mmap
# threshold, so by default it is mapped and unmapped each time); print the minor page faults of the
# repeats and what keep_freed_memory returned.
_SCRIPT = """
import json, resource, sys, torch
from pipeoffload.runtime.hostmem import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
for _ in range(3):
    torch.empty(10 * 2**20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    torch.empty(10 * 2**20).fill_(1.0)
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _run(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "PIPEOFFLOAD_KEEP_FREED_MEMORY"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


def test_freed_blocks_are_reused_without_page_faults():
    kept = _run("keep")
    if not kept["applied"]:
        pytest.skip("not glibc: malloc keeps its own policy")
    default = _run("default")
    assert default["faults"] > 4 * 5000  # ~10,240 pages per 40 MiB tensor, faulted again each time
    assert kept["faults"] < default["faults"] / 3  # reused: at most a stray repeat faults again


@pytest.mark.parametrize("name,value", [("MALLOC_TRIM_THRESHOLD_", "131072"), ("PIPEOFFLOAD_KEEP_FREED_MEMORY", "0")])
def test_the_user_choice_wins(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """Decided from the environment before malloc is touched: checked here on ``_apply`` (what
    ``keep_freed_memory`` calls once per process) rather than in a fresh process importing torch."""
    from pipeoffload.runtime.hostmem import _apply

    for key in [k for k in os.environ if k.startswith("MALLOC_") or k == "PIPEOFFLOAD_KEEP_FREED_MEMORY"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(name, value)
    assert _apply() is False
