"""Times so large that the copy time k·(F + I + W) / 2 overflows are refused naming the options the user
gave: `simulate 1f1b --time-f 1e308 --time-i 1e308` (nothing offloaded) said "d2h_time=inf: must be a
finite number", a field no one gave; /api/simulate said the same. The command line names the flags, the
playground the query parameters (the request's fields)."""
import json
import urllib.error
import urllib.request

import pytest

from tests.conftest import run_cli

CASES = [
    ("--time-f 1e308 --time-i 1e308", "time_f=1e308&time_i=1e308",
     "--time-f + --time-i + --time-w overflows (inf): the times are too large to add up",
     "time_f + time_i + time_w overflows (inf): the times are too large to add up"),
    ("--offload all --offload-ratio 1e308", "offload=all&offload_ratio=1e308",
     "--offload-ratio 1e+308 times --time-f + --time-i + --time-w overflows",
     "offload_ratio=1e+308 times time_f + time_i + time_w overflows"),
    ("--offload all --offload-ratio 0.5 --plan-ratio 1e308", "offload=all&offload_ratio=0.5&plan_ratio=1e308",
     "--plan-ratio 1e+308 times --time-f + --time-i + --time-w overflows",
     "plan_ratio=1e+308 times time_f + time_i + time_w overflows"),
]


def _api(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("flags,query,words,query_words", CASES, ids=[c[0] for c in CASES])
def test_an_overflowing_copy_time_names_the_options(base: str, flags: str, query: str, words: str,
                                                    query_words: str) -> None:
    code, out, err = run_cli("simulate", "1f1b", *flags.split())
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err and "d2h_time" not in err, err
    status, answer = _api(f"{base}/api/simulate?family=1f1b&{query}")
    assert status == 400 and query_words in answer["error"] and "d2h_time" not in answer["error"], answer
