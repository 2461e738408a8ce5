"""A trace's rank numbers are bounded before anything is counted up to them: a rank of 1e20 (or a
string of digits, or an OS thread id as the old layout's ``tid``) made `trace compare` and `POST
/api/trace` build ``set(range(rank + 1))`` and take all memory (the playground was OOM-killed)."""
import json
import resource
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import one_line_error

WORDS = "so a rank must be below the number of actions"


def _limited() -> None:  # a regression fails with MemoryError here instead of exhausting the machine
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.parametrize("event,shown", [
    ({"args": {"rank": 1e20}}, "rank 100000000000000000000 "),
    ({"args": {"rank": "9" * 40}}, "rank 999999999999... (40 digits) "),
    ({"tid": 2**40}, f"rank {2**40} "),  # the old layout: an OS thread id
])
def test_a_huge_rank_is_one_line_from_the_cli(tmp_path: Path, event: dict, shown: str) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "0F0", "ts": 0, "dur": 1, **event}]}))
    done = subprocess.run([sys.executable, "-m", "pipeoffload", "trace", "compare", str(path)], capture_output=True,
                          text=True, timeout=120, preexec_fn=_limited)
    line = one_line_error(done)
    assert shown in line and "only 1 action" in line and WORDS in line, line


def test_a_rank_past_the_actions_is_a_400_from_the_playground(base: str) -> None:
    """A rank the old code could still count to (10^6), so that this test fails on it without harm."""
    body = json.dumps({"traceEvents": [{"ph": "X", "name": "0F0", "ts": 0, "dur": 1, "args": {"rank": "1000000"}}]})
    request = urllib.request.Request(base + "/api/trace", data=body.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:  # the page reads errors from the body
        answer = json.loads(response.read())
    assert answer.get("status") == 400 and "rank 1000000 " in answer["error"] and WORDS in answer["error"], answer
