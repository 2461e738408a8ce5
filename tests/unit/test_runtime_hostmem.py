"""keep_freed_memory: freed host blocks stay in the process instead of costing page faults again."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# In a fresh process: a step's pattern (module doc): twenty blocks of 1-5 MiB allocated, touched and freed
# together, again and again; print the minor page faults of the repeats and what keep_freed_memory returned.
# (A single 40 MiB block was the pattern before; whether glibc reuses its freed chunk for the next aligned
# request depends on the heap's layout, so the result changed with which modules the process had imported.)
_SCRIPT = """
import json, resource, sys, torch
from pipeoffload.runtime.hostmem import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    held = [torch.empty(int(n)).fill_(1.0) for n in (2**18, 3 * 2**17, 2**19, 2**20, 5 * 2**18) * 4]
    del held
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
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
    # The control: every block mapped and unmapped (a fixed 128 KiB mmap threshold), so each repeat faults
    # again; glibc's default adapts its thresholds to the layout, faulting 0 or 50,000 times by luck.
    returned = _run("default", MALLOC_MMAP_THRESHOLD_="131072")
    assert returned["faults"] > 4 * 2500  # ~9,200 pages per step (36 MiB), faulted again each time
    assert kept["faults"] < 1000  # reused: at most a stray block faults again


@pytest.mark.parametrize("name,value", [("MALLOC_TRIM_THRESHOLD_", "131072"), ("PIPEOFFLOAD_KEEP_FREED_MEMORY", "0")])
def test_the_user_choice_wins(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """Decided from the environment before malloc is touched: checked here on ``_apply`` (what
    ``keep_freed_memory`` calls once per process) rather than in a fresh process importing torch."""
    from pipeoffload.runtime.hostmem import _apply

    for key in [k for k in os.environ if k.startswith("MALLOC_") or k == "PIPEOFFLOAD_KEEP_FREED_MEMORY"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(name, value)
    assert _apply() is False
