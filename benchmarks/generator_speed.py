"""How long the replay-driven generators and the comm pass take (process CPU time, best of --repeat).

The W-filling replay (``zb``, and the V shapes through ``fill_weight_passes``) and the V-shape squeeze
are inner loops of the planner's search; ``add_comms`` runs on every lowering. Issue #11 moved their
rules into ``semantics``: this is the check that it did not slow them down. Each schedule's hash is
printed too: it must not change with speed work.
"""
from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable

from pipeoffload.costs import CostModel
from pipeoffload.passes.comms import add_comms
from pipeoffload.schedules import generate

COSTS = CostModel(time_f=1.0, time_i=1.2, time_w=0.8, time_b=2.0, p2p_time=0.05)
CASES = [("zb-v", 8, 64, 2, None), ("zb-v", 8, 64, 2, COSTS), ("v-half", 8, 64, 2, None), ("v-half", 8, 64, 2, COSTS),
         ("v-min", 8, 64, 2, None), ("v-min", 8, 64, 2, COSTS), ("zb", 8, 64, 1, COSTS), ("zb", 16, 128, 1, COSTS)]


def best(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: registry, imports
    seconds = float("inf")
    for _ in range(repeat):
        clock = time.process_time()
        fn()
        seconds = min(seconds, time.process_time() - clock)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    print(f"{'what':44} {'ms':>7}  schedule sha1")
    for name, d, m, v, costs in CASES:
        options = {} if costs is None else {"costs": costs}
        schedule = generate(name, d, m, v, **options)
        digest = hashlib.sha1(schedule.to_text().encode()).hexdigest()[:12]
        ms = 1000 * best(lambda: generate(name, d, m, v, **options), args.repeat)
        label = f"generate('{name}', {d}, {m}, {v}) {'costs' if costs else 'unit'}"
        print(f"{label:44} {ms:7.1f}  {digest}")
    schedule = generate("interleaved-1f1b", 64, 256, 2)
    lowered = add_comms(schedule)
    digest = hashlib.sha1(lowered.to_text().encode()).hexdigest()[:12]
    print(f"{'add_comms(interleaved-1f1b, 64, 256, 2)':44} {1000 * best(lambda: add_comms(schedule), args.repeat):7.1f}  {digest}")


if __name__ == "__main__":
    main()
