"""The runtime runs each kind where ``semantics.LANE`` puts it and refuses, by name, a kind it has no
handler for (a kind added to the semantics but not to the runtime)."""
from __future__ import annotations

import pytest

from pipeoffload import ConfigError, generate
from pipeoffload import semantics as sem
from pipeoffload.ir import Action, ActionKind
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss
from pipeoffload.models.gpt import sample_batch
from pipeoffload.runtime import PipelineRunner
from pipeoffload.runtime.executor import _DIRECTION, check_handled

K = ActionKind
CFG = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=2)


def _runner() -> PipelineRunner:
    schedule = generate("1f1b", 1, 2, 1)
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 1), schedule.placement, 0)
    return PipelineRunner(stages, schedule, 0, loss_fn=lm_loss)


def test_every_kind_semantics_defines_has_somewhere_to_run() -> None:
    runner = _runner()
    try:
        for kind in sem.KINDS:
            lane = sem.lane_of(kind)
            if lane in (sem.SEND, sem.RECV):
                assert kind in _DIRECTION, kind
            else:
                assert kind in runner._handlers, kind
        check_handled([Action(k, 0, 0) for k in sem.KINDS], runner._handlers, 0)
    finally:
        runner.close()


def test_a_kind_without_a_handler_is_refused_by_name() -> None:
    runner = _runner()
    try:
        handlers = {k: h for k, h in runner._handlers.items() if k is not K.R}
        row = [Action(K.F, 0, 0), Action(K.R, 0, 0), Action(K.R, 0, 1), Action(K.B, 0, 0)]
        with pytest.raises(ConfigError, match=r"rank 3: .*compute actions of kind R \(e.g. 0R0\).*no handler"):
            check_handled(row, handlers, 3)
    finally:
        runner.close()


def test_wrapped_actions_sees_every_action_of_a_step_and_is_undone_on_exit() -> None:
    runner = _runner()
    seen: list[str] = []

    def wrap(handler):  # type: ignore[no-untyped-def]
        def run(self, action):  # type: ignore[no-untyped-def]
            seen.append(str(action))
            handler(self, action)
        return run

    tokens, targets = sample_batch(CFG, 2, padded=False)
    try:
        with runner.wrapped_actions(wrap):
            runner.step(tokens, targets)
        assert seen == ["0F0", "0B0", "0F1", "0B1"]  # 1F1B on one rank, two microbatches: its list, in order
        runner.step(tokens, targets)
        assert len(seen) == 4  # outside, nothing is wrapped
        with pytest.raises(RuntimeError, match="boom"), runner.wrapped_actions(wrap):
            raise RuntimeError("boom")
        runner.step(tokens, targets)
        assert len(seen) == 4  # restored after an exception too
    finally:
        runner.close()
