"""The interpreter in one process (one rank holding several stages), its errors, and its helpers."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipeoffload import ConfigError, Schedule, generate, lower
from pipeoffload.ir import Action, ActionKind
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import StageModule
from pipeoffload.runtime import (
    Const,
    LoopbackTransport,
    PipelineError,
    PipelineRunner,
    TensorSpec,
    Trace,
    write_chrome_trace,
)
from pipeoffload.runtime.comm import check_fifo

CFG = GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=4)
K = ActionKind


def _reference(m: int, inputs, targets):
    model = StageModule(*gpt_layers(CFG, seed=0))
    tokens, mask, offset = inputs
    total = None
    for tok, msk, tgt in zip(tokens.tensor_split(m), mask.tensor_split(m), targets.tensor_split(m)):
        loss = lm_loss(model(tok, msk, offset), tgt) / m
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total, [p.grad for p in model.parameters()]


def _runner(schedule: Schedule, rank: int = 0, **kwargs):
    layers = gpt_layers(CFG, seed=0)
    counts = even_counts(len(layers), schedule.num_stages)
    stages = build_rank_stages(layers, counts, schedule.placement, rank)
    return PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, min_offload_bytes=256, **kwargs), stages


@pytest.mark.parametrize("name, v", [("interleaved-1f1b", 2), ("gpipe", 3), ("1f1b", 1)])
def test_one_rank_many_stages_equals_single_process(name, v):
    m = 4
    inputs, targets = sample_batch(CFG, 8, seed=1)
    schedule = generate(name, 1, m, v)
    runner, stages = _runner(schedule)
    loss = runner.step(inputs, targets)
    ref_loss, ref_grads = _reference(m, inputs, targets)
    grads = [p.grad for s in sorted(stages) for p in stages[s].parameters()]
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert runner.trace.matches(schedule.actions[0])
    assert runner.trace.end_bytes == 0 and runner.trace.peak_bytes > 0


def test_boundary_shapes_are_fixed_after_the_first_step():
    runner, _ = _runner(generate("gpipe", 1, 2, 2))
    runner.step(*sample_batch(CFG, 4))
    with pytest.raises(PipelineError, match=r"rank 0 failed at step 2, action #\d+ 0F0: ConfigError: .*fixed at the first step"):
        runner.step(*sample_batch(CFG, 6))


def test_last_stage_needs_targets():
    runner, _ = _runner(generate("gpipe", 1, 2, 1))
    with pytest.raises(ConfigError, match="targets"):
        runner.step(sample_batch(CFG, 4)[0])


def test_a_failing_stage_names_rank_step_and_action():
    class Fails(torch.nn.Module):
        def forward(self, *args):
            if not torch.is_grad_enabled() or args[0].requires_grad is False:
                return args
            raise ValueError("bad layer")

    schedule = generate("gpipe", 1, 2, 2)
    layers = gpt_layers(CFG, seed=0)
    counts = even_counts(len(layers), 2)
    stages = build_rank_stages(layers, counts, schedule.placement, 0)
    stages[1] = StageModule(Fails(), *stages[1])
    runner = PipelineRunner(stages, schedule, 0, loss_fn=lm_loss)
    with pytest.raises(PipelineError, match=r"rank 0 failed at step 1, action #2 1F0: ValueError: bad layer") as info:
        runner.step(*sample_batch(CFG, 4))
    assert info.value.rank == 0 and info.value.step == 1 and info.value.action == Action(K.F, 1, 0)


def _gpipe_runner_failing_in(module: torch.nn.Module, **options: Any) -> tuple[PipelineRunner, dict]:
    """One rank of gpipe with 2 stages whose stage 1 runs ``module`` first; the runner and its stages."""
    schedule = generate("gpipe", 1, 2, 2)
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2), schedule.placement, 0)
    stages[1] = StageModule(module, *stages[1])
    return PipelineRunner(stages, schedule, 0, loss_fn=lm_loss, **options), stages


class _FailsWhenArmed(torch.nn.Module):
    """A pass-through stage that raises once ``armed``."""

    armed = False

    def forward(self, *args):
        if self.armed:
            raise ValueError("bad layer")
        return args


def test_failures_name_the_step_the_caller_gives():
    """A training loop numbers its steps from 1 and continues them after a resume: the runner's failure
    names that number (it named its own per-process count from 0: "failed at step 56" in step 256 of
    a resumed run), in a step and in the evaluation after it."""
    failing = _FailsWhenArmed()
    runner, _ = _gpipe_runner_failing_in(failing)
    batch = sample_batch(CFG, 4)
    runner.step(*batch, step=256)  # the first step of this process, the run's 256th
    failing.armed = True
    with pytest.raises(PipelineError, match=r"rank 0 failed at the evaluation after step 256, action #\d+ 1F0"):
        runner.evaluate(*batch)  # by default, after the step just run, by its number
    with pytest.raises(PipelineError, match=r"rank 0 failed at the evaluation after step 300, action"):
        runner.evaluate(*batch, step=300)
    with pytest.raises(PipelineError, match=r"rank 0 failed at step 257, action #\d+ 1F0: ValueError") as info:
        runner.step(*batch, step=257)
    assert info.value.step == 257 and runner.step_count == 2


def test_a_runner_counts_its_own_steps_from_1_as_train_does():
    """Without ``step=`` the runner named its first step 0 in its trace and failures ("failed at step 1"
    was the second step) where ``train`` and ``python -m pipeoffload.runtime`` name it 1."""
    failing = _FailsWhenArmed()
    runner, _ = _gpipe_runner_failing_in(failing)
    batch = sample_batch(CFG, 4)
    runner.step(*batch)
    assert runner.trace.step == 1 and runner.last_step == 1
    runner.step(*batch)
    assert runner.trace.step == 2 and runner.step_count == 2
    failing.armed = True
    with pytest.raises(PipelineError, match=r"rank 0 failed at the evaluation after step 2, action #\d+ 1F0"):
        runner.evaluate(*batch)
    with pytest.raises(PipelineError, match=r"rank 0 failed at step 3, action #\d+ 1F0: ValueError") as info:
        runner.step(*batch)
    assert info.value.step == 3


def test_a_failed_step_leaves_the_runner_usable():
    class FailsOnce(torch.nn.Module):
        calls = 0

        def forward(self, *args):
            FailsOnce.calls += 1
            if FailsOnce.calls == 2:  # the last stage is never probed: step 0's second forward fails
                raise RuntimeError("transient")
            return args

    runner, stages = _gpipe_runner_failing_in(FailsOnce(), min_offload_bytes=256)
    inputs, targets = sample_batch(CFG, 4)
    with pytest.raises(PipelineError, match="transient"):
        runner.step(inputs, targets)
    assert runner.store.resident_bytes == 0
    for module in stages.values():
        module.zero_grad(set_to_none=True)
    assert torch.isfinite(runner.step(inputs, targets)) and runner.trace.end_bytes == 0


def test_loopback_replays_one_rank_of_a_multi_rank_schedule():
    schedule = lower(generate("1f1b", 2, 4, 1))
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2), schedule.placement, 1)
    boundary = (TensorSpec((2, CFG.seq, CFG.hidden), torch.float32, True), TensorSpec((2, CFG.seq), torch.bool, False),
                Const(1))
    runner = PipelineRunner(stages, schedule, 1, loss_fn=lm_loss, transport=LoopbackTransport(torch.device("cpu")),
                            output_specs={0: boundary})
    loss = runner.step(None, sample_batch(CFG, 8)[1])
    assert torch.isfinite(loss) and runner.trace.matches(schedule.actions[1])


def test_offload_on_one_rank_is_a_pure_copy():
    m = 4
    inputs, targets = sample_batch(CFG, 8, seed=2)
    base = generate("interleaved-1f1b", 1, m, 2)
    rows = []
    for a in base.actions[0]:
        if a.kind == K.B:
            rows.append(Action(K.RELOAD, a.stage, a.microbatch))
        rows.append(a)
        if a.kind == K.F:
            rows.append(Action(K.OFFLOAD, a.stage, a.microbatch))
    offloaded = base.with_actions([rows])
    results = []
    for schedule in (base, offloaded):
        runner, stages = _runner(schedule)
        loss = runner.step(inputs, targets)
        results.append((loss, [p.grad for s in sorted(stages) for p in stages[s].parameters()], runner.trace))
    (l0, g0, t0), (l1, g1, t1) = results
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert t1.peak_bytes < t0.peak_bytes and t1.end_bytes == 0
    stats = runner.store.copier.stats
    assert stats.d2h_copies == stats.h2d_copies > 0


def _with_offload(base: Schedule) -> Schedule:
    """``base`` (one rank) with every slot offloaded after its F and reloaded before its backward."""
    rows = []
    for a in base.actions[0]:
        if a.kind in (K.B, K.I):
            rows.append(Action(K.RELOAD, a.stage, a.microbatch))
        rows.append(a)
        if a.kind == K.F:
            rows.append(Action(K.OFFLOAD, a.stage, a.microbatch))
    return base.with_actions([rows])


def test_an_unmeasured_step_saves_through_no_hooks_and_gives_the_same_numbers(monkeypatch):
    from pipeoffload.runtime.offload import ActivationStore

    packs = []
    real_pack = ActivationStore._pack
    monkeypatch.setattr(ActivationStore, "_pack", lambda self, *args: packs.append(1) or real_pack(self, *args))
    m = 2
    inputs, targets = sample_batch(CFG, 4, seed=3)
    schedule = generate("interleaved-1f1b", 1, m, 2)
    runner, stages = _runner(schedule, measure_memory=False)
    loss = runner.step(inputs, targets)
    ref_loss, ref_grads = _reference(m, inputs, targets)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(p.grad, g) for p, g in zip((p for s in sorted(stages) for p in stages[s].parameters()), ref_grads))
    assert runner.trace.matches(schedule.actions[0])
    assert not packs and not runner.trace.measured and runner.trace.peak_bytes == 0 and not runner.slot_bytes
    runner.step(inputs, targets, measure=True)  # asked for: measured, through the store
    assert packs and runner.trace.measured and runner.trace.peak_bytes > 0 and runner.slot_bytes
    # a row that copies needs the store: it measures though not asked to
    offloading, _ = _runner(_with_offload(schedule), measure_memory=False)
    offloading.step(inputs, targets)
    assert offloading.trace.measured and offloading.trace.peak_bytes > 0


def test_trace_round_trips_and_exports_chrome_events(tmp_path):
    runner, _ = _runner(generate("1f1b", 1, 2, 1))
    runner.step(*sample_batch(CFG, 4))
    again = Trace.from_dict(json.loads(json.dumps(runner.trace.as_dict())))
    assert again.actions() == runner.trace.actions() and again.peak_bytes == runner.trace.peak_bytes
    path = tmp_path / "trace.json"
    write_chrome_trace([runner.trace], str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} == {str(a) for a in runner.trace.actions()}


def test_fifo_check_accepts_lowered_classics_and_rejects_crossed_orders():
    for name, v in (("1f1b", 1), ("gpipe", 2), ("interleaved-1f1b", 2)):
        check_fifo(lower(generate(name, 4, 8, v)))
    schedule = lower(generate("gpipe", 2, 2, 1))
    rows = [list(r) for r in schedule.actions]
    sends = [i for i, a in enumerate(rows[0]) if a.kind == K.SEND_F]
    rows[0][sends[0]], rows[0][sends[1]] = rows[0][sends[1]], rows[0][sends[0]]
    with pytest.raises(ConfigError, match="posting order"):
        check_fifo(schedule.with_actions(rows))


@pytest.mark.parametrize("family", ["interleaved-1f1b", "zb-v"])
def test_offload_all_on_one_rank_with_a_tensor_handed_between_local_stages(family):
    """Stage 1 saves stage 0's output (handed over on this rank), which stage 0's ReLU saved too: the
    OFFLOAD of stage 0 before stage 1's forward must not take it from stage 1 (it did: 'used while
    offloaded' at stage 1's backward)."""
    def stages() -> dict[int, nn.Module]:
        torch.manual_seed(0)
        return {0: nn.Sequential(nn.Linear(32, 32), nn.ReLU()), 1: nn.Linear(32, 32)}

    def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    x, y = torch.randn(8, 32, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 32)
    results = []
    for offload in ("none", "all"):
        modules = stages()
        schedule = lower(generate(family, 1, 4, 2), offload=offload)
        runner = PipelineRunner(modules, schedule, 0, loss_fn=mse, min_offload_bytes=0)
        loss = runner.step(x, y)
        assert runner.trace.end_bytes == 0 and runner.store.host_bytes == 0
        results.append((loss, [p.grad for m in modules.values() for p in m.parameters()]))
    (loss0, grads0), (loss1, grads1) = results
    assert torch.equal(loss0, loss1) and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


class _PostingOrderLoopback(LoopbackTransport):
    """A transport that declares NCCL's matching rule: messages match in posting order."""

    matches_in_posting_order = True


def test_runner_checks_posting_order_when_its_transport_declares_it():
    schedule = generate("gpipe", 2, 2, 1)
    rows = [list(r) for r in schedule.actions]
    rows[1][0], rows[1][1] = rows[1][1], rows[1][0]  # rank 1 runs microbatch 1 first: valid, receives crossed
    crossed = lower(schedule.with_actions(rows))
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2), crossed.placement, 0)
    cpu = torch.device("cpu")
    PipelineRunner(stages, crossed, 0, loss_fn=lm_loss, transport=LoopbackTransport(cpu)).close()  # tags: fine
    with pytest.raises(ConfigError, match="posting order"):
        PipelineRunner(stages, crossed, 0, loss_fn=lm_loss, transport=_PostingOrderLoopback(cpu))


def test_gpu_replay_benchmark_runs_on_cpu_with_tiny_sizes():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_offload_replay

    rows = gpu_offload_replay.main(["--device", "cpu", "--dtype", "float32", "--hidden", "16", "--seq", "8",
                                    "--heads", "2", "--microbatches", "4", "--steps", "1", "--warmup", "0",
                                    "--min-offload-bytes", "256"])
    none, full = rows
    assert none["end_bytes"] == 0 and full["end_bytes"] == 0
    assert 0 < full["store_peak_mb"] < none["store_peak_mb"]


@pytest.mark.parametrize("name, v", [("zb-v", 2), ("interleaved-1f1b", 2)])
def test_each_stage_reports_its_final_gradients_once_after_its_last_backward(name, v):
    """The hook a data-parallel reduction starts from: once per stage and step, right after the
    stage's last B or W (with a split backward: after the last W, not after an I), with the
    gradients the step ends with."""
    inputs, targets = sample_batch(CFG, 8, seed=1)
    schedule = generate(name, 1, 2, v)
    seen: list[tuple[int, list[torch.Tensor]]] = []
    runner, stages = _runner(schedule, on_stage_gradients=lambda s: seen.append(
        (s, [p.grad.clone() for p in stages[s].parameters()])))
    for _ in range(2):
        seen.clear()
        runner.step(inputs, targets)
        assert sorted(s for s, _ in seen) == sorted(stages)
        for s, grads in seen:  # a hook after an I, or before the stage's last W, sees partial gradients
            assert all(torch.equal(g, p.grad) for g, p in zip(grads, stages[s].parameters()))
        for m in stages.values():
            m.zero_grad(set_to_none=True)
    seen.clear()
    runner._gradients_final = {i: min(stages) for i in range(64)}  # whatever positions the training program has
    runner.evaluate(inputs, targets)  # forward only (a program of its own): no gradients, no call
    assert seen == []


class _Work:
    """A send's work as a process group returns it, counting how often the runner polls and waits for it."""

    def __init__(self) -> None:
        self.polls = 0
        self.waits = 0

    def is_completed(self) -> bool:
        self.polls += 1
        return False


class _WorkLoopback(LoopbackTransport):
    """Loopback that hands back one work per tensor sent (as gloo does) and records the waits on them."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.sent: list[_Work] = []

    def post(self, sends, recvs):
        super().post(sends, recvs)
        works = [_Work() for _ in sends]
        self.sent += works
        return works, []

    def wait(self, works, peers=None, what=""):
        for w in works:
            if isinstance(w, _Work):
                w.waits += 1


def test_sends_of_unmanaged_tensors_are_waited_once_at_the_end_of_the_step_and_never_polled():
    """A send holds nothing of the activation store (an unmeasured step): the runner keeps its work to wait
    at the end of the step, without polling it after every batch (one call per send and batch, before)."""
    schedule = lower(generate("1f1b", 2, 4, 1))
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2), schedule.placement, 0)
    transport = _WorkLoopback(torch.device("cpu"))
    runner = PipelineRunner(stages, schedule, 0, loss_fn=lm_loss, transport=transport, measure_memory=False)
    runner.step(sample_batch(CFG, 8)[0])
    assert len(transport.sent) == 8  # per microbatch, the hidden states and the mask
    assert [(w.polls, w.waits) for w in transport.sent] == [(0, 1)] * 8
    runner.close()


class _PostLog(LoopbackTransport):
    """Loopback that records, per post, how many sends and receives it carried."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.log: list[tuple[int, int]] = []

    def post(self, sends, recvs):
        self.log.append((len(sends), len(recvs)))
        return super().post(sends, recvs)


@pytest.mark.parametrize("name, v", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_tag_matching_transport_gets_every_receive_of_the_step_before_the_first_send(name, v):
    """gloo matches by tag: all of a step's receives are posted when it starts (a receive posted after its
    data arrived costs gloo milliseconds), each waited at its batch; one comm batch ahead left some late."""
    schedule = lower(generate(name, 2, 4, v))
    layers = gpt_layers(CFG, seed=0)
    stages = build_rank_stages(layers, even_counts(len(layers), 2 * v), schedule.placement, 1)
    boundary = (TensorSpec((2, CFG.seq, CFG.hidden), torch.float32, True), TensorSpec((2, CFG.seq), torch.bool, False),
                Const(1))
    transport = _PostLog(torch.device("cpu"))
    runner = PipelineRunner(stages, schedule, 1, loss_fn=lm_loss, transport=transport,
                            output_specs={s: boundary for s in range(2 * v - 1)})
    for _ in range(2):
        transport.log.clear()
        loss = runner.step(None, sample_batch(CFG, 8)[1])
        assert torch.isfinite(loss) and runner.trace.matches(schedule.actions[1])
        first_send = next(i for i, (sends, _) in enumerate(transport.log) if sends)
        received = sum(r for _, r in transport.log)
        assert received > 0 and sum(r for _, r in transport.log[:first_send]) == received
    runner.close()
