"""Measure F/I/W times and saved-activation bytes of real ``nn.Module`` stages; build cost models.

This is the only planner-side module that imports torch. It measures, on the current device:
- F: the forward (plus the loss on the last stage);
- B: the full backward; I and W: the backward split as the runtime splits it (``runtime.backward``:
  I computes the input gradients and keeps the graph, W replays the weight branches), each timed on
  its own, so that I + W is what the split really costs (more than B: W re-runs the nodes where the
  weight branches meet the input path, one engine call per parameter group);
- activation bytes: every tensor autograd saves during F, deduplicated by storage, parameters excluded
  (the quantity the runtime and the simulator count);
- w_fraction: the share of those bytes W still needs after I (the saved tensors of the graph nodes
  the runtime's W replays: about 0.5 for a transformer block, 1.0 for a first stage whose inputs
  need no gradient, so its W is a full backward).
Times are medians over ``repeats`` after ``warmup`` runs. ``Profile.cost_model`` gives a per-stage
``CostModel`` for ``simulate``; ``measure_layer_costs`` gives ``LayerCosts`` for ``plan``.
``measure_action_overhead`` measures the runtime's fixed cost per compute action (``PipelineRunner``
on one rank with tiny stages, against the same compute called directly), for the cost model's
``action_overhead``. ``replayed_action_times`` measures each stage's F/B/I/W as the runtime runs a
given schedule (every rank's actions replayed alone, no peer to wait on), and ``with_action_times``
puts them into a ``CostModel``: what a standalone profile misses (the activation store's hooks on
ranks that split the backward, the allocator and caches of interleaved microbatches and stages) is in them;
read on the thread's CPU clock (``clock=time.thread_time``) they are the profile for ``CostModel.cores``.
``concurrent_action_times`` is the same replay run by every rank at once, in the processes that
will train: the profile under the real run's concurrency (cores, caches and memory shared).
``measure_concurrency`` measures, once per machine and rank count, how much longer compute takes
while n ranks compute at once (``CostModel.concurrency_slowdown``: more ranks than cores, shared
caches, the machine's load), and ``contended_costs`` applies it to a schedule: each rank's stage
times stretched by what its compute sees from the ranks busy at the same moments of the simulated
timeline (the simulator itself gives every rank a machine of its own).
``measure_message_costs`` reads what the runtime's messages cost from its own traces on spawned
ranks (``PipelineRunner`` on the process group, synthetic stages): the lane's cost per SEND/RECV
(``CostModel.message_time``) and the time from a send to a waiting receiver (``p2p_time``), both
charged by the simulator; ``measure_p2p_time``'s ping-pong exercises gloo alone. It also reads the
CPU its transport's threads take per message (``CostModel.message_cpu``), and ``other_load`` reads the
machine's other runnable threads from ``measure_concurrency``: with ``CostModel.cores`` the simulator
shares the cores among the runnable ranks and transports (processor sharing) instead of
``contended_costs``' per-rank stretch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import ActionKind, Schedule
from pipeoffload.planner.stagecosts import LayerCosts

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StageProfile:
    time_f: float
    time_i: float
    time_w: float
    time_b: float
    activation_bytes: int
    output_bytes: int
    params: int
    w_fraction: float = 1.0  # measured share of activation_bytes W needs after I


@dataclass(frozen=True)
class Profile:
    stages: tuple[StageProfile, ...]
    device: str

    def cost_model(self, *, p2p_time: float | None = None, p2p_bandwidth: float | None = None,
                   d2h_bandwidth: float | None = None, h2d_bandwidth: float | None = None,
                   w_fraction: float | str = 1.0, action_overhead: float = 0.0, message_time: float = 0.0,
                   concurrency_slowdown: Sequence[float] | None = None) -> CostModel:
        """A per-stage ``CostModel`` in seconds; one activation unit = the largest stage's bytes.
        ``w_fraction="measured"`` uses each stage's measured share (``stage_w_fraction``).
        ``action_overhead``: seconds added to every compute action (``measure_action_overhead``).
        ``message_time``: seconds of the runtime's lane per SEND and RECV (``measure_message_costs``).
        ``concurrency_slowdown``: ``measure_concurrency``'s factors (``contended_costs`` applies them)."""
        unit = max(max(s.activation_bytes for s in self.stages), 1)
        if p2p_time is None:
            boundary = max((s.output_bytes for s in self.stages[:-1]), default=0)
            p2p_time = boundary / p2p_bandwidth if p2p_bandwidth else 0.0
        return CostModel(
            time_f=tuple(s.time_f for s in self.stages),
            time_i=tuple(s.time_i for s in self.stages),
            time_w=tuple(s.time_w for s in self.stages),
            time_b=tuple(s.time_b for s in self.stages),
            activation=tuple(s.activation_bytes / unit for s in self.stages),
            activation_bytes=float(unit),
            w_fraction=max(x.w_fraction for x in self.stages) if w_fraction == "measured" else float(w_fraction),
            stage_w_fraction=tuple(x.w_fraction for x in self.stages) if w_fraction == "measured" else None,
            p2p_time=p2p_time,
            d2h_time=unit / d2h_bandwidth if d2h_bandwidth else 0.0,
            h2d_time=unit / h2d_bandwidth if h2d_bandwidth else 0.0,
            action_overhead=action_overhead,
            message_time=message_time,
            concurrency_slowdown=tuple(concurrency_slowdown) if concurrency_slowdown else None,
        )


    def save(self, path: str, **cost_model_options: Any) -> None:
        """Write ``cost_model(**options)`` as the JSON that ``pipeoffload simulate --costs`` reads."""
        import json

        from pipeoffload.costs import cost_model_to_dict
        from pipeoffload.fileio import write_atomic

        options = {"w_fraction": "measured", **cost_model_options}
        data = cost_model_to_dict(self.cost_model(**options))
        write_atomic(path, json.dumps({**data, "time_unit": "s", "device": self.device}, indent=1) + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[..., object], device: torch.device, warmup: int, repeats: int,
           setup: Callable[[], object] | None = None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``fn`` (``setup`` runs untimed before each call and its result is passed)."""
    samples = []
    for n in range(warmup + repeats):
        state = setup() if setup else None
        _sync(device)
        start = clock()
        fn(state) if setup else fn()  # type: ignore[call-arg]
        _sync(device)
        if n >= warmup:
            samples.append(clock() - start)
    return statistics.median(samples)


def saved_activation_bytes(module: nn.Module, run: Callable[[], object]) -> int:
    """Bytes autograd saves while ``run()`` executes ``module``'s forward: unique storages, no parameters."""
    param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


class _Packed:
    """What the measuring pack hook stores for each saved tensor, so W's share can be found."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _unique_bytes(tensors: Sequence[torch.Tensor], exclude: set[int]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in exclude and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
    return sum(seen.values())


def measure_w_fraction(module: nn.Module, forward: Callable[[], tuple[tuple, Any]],
                       roots: Callable[[Any], list[torch.Tensor]], grad_at: Sequence[int]) -> float:
    """Share of the saved activation bytes that W still needs after I, as the runtime splits the
    backward (``runtime.backward``: W replays only the nodes between each parameter's consumers and
    the parameter). 1.0 when no input needs a gradient (W is then a full backward)."""
    from pipeoffload.runtime.backward import backward_input

    packed: list[_Packed] = []

    def pack(t: torch.Tensor) -> _Packed:
        handle = _Packed(t)
        packed.append(handle)
        return handle

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.tensor):
        xs, out = forward()
    params = [p for p in module.parameters() if p.requires_grad]
    exclude = {p.untyped_storage().data_ptr() for p in module.parameters()}
    total = _unique_bytes([h.tensor for h in packed], exclude)
    if not grad_at or not total:
        return 1.0
    outs = roots(out)
    _, job = backward_input(outs, [torch.ones_like(t) for t in outs], [xs[i] for i in grad_at], params)
    needed = job.saved_by_needed_nodes({})
    if needed is None:
        return 1.0
    kept = _unique_bytes([h.tensor for h in needed if isinstance(h, _Packed)], exclude)
    return min(1.0, kept / total)


def _zero_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _as_tuple(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _detach(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_detach(v) for v in value)
    return value.detach() if isinstance(value, torch.Tensor) else value


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _as_tuple(value)
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def profile_module(module: nn.Module, inputs: Any, *, loss_fn: LossFn | None = None,
                   target: torch.Tensor | None = None, warmup: int = 3,
                   repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> tuple[StageProfile, Any]:
    """Profile one stage called as ``module(*inputs)`` (a tensor or a tuple of values; the first
    tensor's device is used). Floating-point inputs get gradients (I); other values pass through.
    Returns the profile and the stage's (detached) output, to feed the next stage. ``clock``: what
    the times are read from; ``time.thread_time`` on the CPU gives this thread's CPU seconds, which
    other load on the machine does not stretch (meaningless on a GPU, whose work is not the thread's)."""
    args = _as_tuple(inputs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        raise ConfigError("profile_module: the inputs contain no tensor; pass the stage's real inputs")
    device = tensors[0].device
    grad_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if (loss_fn is None) != (target is None):
        raise ConfigError("profile_module: give both loss_fn and target (last stage) or neither")

    def fresh() -> tuple:
        return tuple(a.detach().requires_grad_(True) if i in grad_at else a for i, a in enumerate(args))

    def forward(xs: tuple) -> Any:
        out = module(*xs)
        return loss_fn(out, target) if loss_fn is not None else out  # type: ignore[arg-type]

    def differentiable(out: Any) -> list[torch.Tensor]:
        return [t for t in _as_tuple(out) if isinstance(t, torch.Tensor) and t.requires_grad]

    probe = forward(fresh())
    grads = [torch.ones_like(t) for t in differentiable(probe)]
    with torch.no_grad():
        output = module(*args)
    del probe

    def forward_state() -> tuple[tuple, Any]:
        xs = fresh()
        return xs, forward(xs)

    def backward_all(state: tuple[tuple, Any]) -> None:
        torch.autograd.backward(differentiable(state[1]), grads)

    from pipeoffload.runtime.backward import GradAccumulators, backward_input, backward_weight

    params = [p for p in module.parameters() if p.requires_grad]
    accumulators = GradAccumulators()  # held across calls, as the runtime's stage holds them

    def split_input(state: tuple[tuple, Any]) -> Any:
        return backward_input(differentiable(state[1]), grads, [state[0][i] for i in grad_at], params, accumulators)[1]

    def after_input() -> Any:
        return split_input(forward_state())

    time_f = _timed(lambda: forward(fresh()), device, warmup, repeats, clock=clock)
    time_b = _timed(backward_all, device, warmup, repeats, setup=forward_state, clock=clock)
    # the first stage has no input gradient (token ids): I is nothing and W is a full backward
    time_i = _timed(split_input, device, warmup, repeats, setup=forward_state, clock=clock) if grad_at else 0.0
    time_w = _timed(backward_weight, device, warmup, repeats, setup=after_input, clock=clock) if grad_at else time_b
    _zero_grads(module)
    stage = StageProfile(
        time_f=time_f, time_i=time_i, time_w=time_w, time_b=time_b,
        activation_bytes=saved_activation_bytes(module, lambda: forward(fresh())),
        output_bytes=0 if loss_fn is not None else _nbytes(output),
        params=sum(p.numel() for p in module.parameters()),
        w_fraction=measure_w_fraction(module, forward_state, differentiable, grad_at),
    )
    _zero_grads(module)
    return stage, _detach(output)


def profile_stages(stages: Sequence[nn.Module], inputs: Any, *, loss_fn: LossFn, target: torch.Tensor,
                   warmup: int = 3, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> Profile:
    """Profile a model split into consecutive stages, feeding each stage the previous one's output.
    The last stage's F includes ``loss_fn(output, target)``; its backward starts from the loss.
    ``clock``: as in ``profile_module``."""
    if not stages:
        raise ConfigError("profile_stages: no stages given; pass the model split into a list of modules")
    results = []
    x = inputs
    for n, stage in enumerate(stages):
        last = n == len(stages) - 1
        prof, x = profile_module(stage, x, loss_fn=loss_fn if last else None, target=target if last else None,
                                 warmup=warmup, repeats=repeats, clock=clock)
        results.append(prof)
    device = next(t.device for t in _as_tuple(inputs) if isinstance(t, torch.Tensor))
    return Profile(tuple(results), str(device))


def measure_layer_costs(block: nn.Module, head: nn.Module, hidden: Any, *, loss_fn: LossFn,
                        target: torch.Tensor, embedding: nn.Module | None = None, model_flops: float = 0.0,
                        warmup: int = 3, repeats: int = 5, tp: int = 1) -> LayerCosts:
    """``LayerCosts`` for ``plan --profile``: one transformer ``block`` on a hidden-state microbatch,
    and the ``head`` (final norm + output projection + loss). ``model_flops`` (one microbatch through
    the whole model, for MFU) is optional.

    ``hidden`` is what the block is called with, as ``block(*hidden)`` (a bare tensor: ``block(hidden)``),
    and the head too, its output then going to ``loss_fn(output, target)``; its floating-point tensors get
    gradients and are the stage boundary's bytes. The blocks and heads of ``pipeoffload.models`` (GPT,
    Llama, Hugging Face folders) take and pass on ``(x, pad_mask, offset)``: give ``(x, None, 0)``, a
    hidden state ``x`` of shape (microbatch, seq, hidden), no padding, positions from 0 (their heads return
    the logits, which ``lm_loss`` takes with the token ids as ``target``)::

        embed, block, head = gpt_layers(GPTConfig(layers=1, hidden=64, seq=32))
        x = torch.randn(2, 32, 64)  # a microbatch of 2 sequences
        costs = measure_layer_costs(block, head, (x, None, 0), loss_fn=lm_loss,
                                    target=torch.randint(0, 64, (2, 32)), embedding=embed)

    Per-TP costs (GPU): call this on every rank of a tensor-parallel group of size ``tp`` with
    ``block``/``head`` built sharded over that group (their collectives inside ``forward`` and the
    autograd functions, as Megatron's layers have) and ``hidden`` the rank's input (its sequence shard
    with sequence parallelism): the times then include the collectives, the bytes and parameters are
    per rank, and the result says ``tp`` so that ``plan --profile`` uses it for layouts of that TP
    size. Ranks must call it together (the collectives synchronise them)."""
    layer, _ = profile_module(block, hidden, warmup=warmup, repeats=repeats)
    top, _ = profile_module(head, hidden, loss_fn=loss_fn, target=target, warmup=warmup, repeats=repeats)
    return LayerCosts(
        time_f=layer.time_f, time_i=layer.time_i, time_w=layer.time_w,
        activation_bytes=float(layer.activation_bytes), params=float(layer.params),
        boundary_bytes=float(_nbytes(hidden)),
        head_time=(top.time_f, top.time_i, top.time_w), head_activation_bytes=float(top.activation_bytes),
        time_b=layer.time_b, head_time_b=top.time_b,
        head_params=float(top.params),
        embedding_params=float(sum(p.numel() for p in embedding.parameters())) if embedding is not None else 0.0,
        model_flops=model_flops, source="profile" if tp == 1 else f"profile (tp={tp})", tp=tp,
    )


def measure_action_overhead(*, microbatches: int = 8, steps: int = 20, width: int = 16) -> float:
    """Seconds the runtime spends per compute action besides the stage's own compute, on the CPU:
    ``PipelineRunner`` runs interleaved 1F1B on one rank over two one-``Linear`` stages (microbatches of
    one row, so compute is small), against the same forwards and backwards called directly; the
    difference of the medians over ``steps``, per compute action (dispatch, the stages' bookkeeping,
    hand-offs between local stages, the trace): the median over ``steps`` paired runs (after three
    warm-up pairs) of the difference, per compute action. Not below 0."""
    from pipeoffload.runtime import PipelineRunner
    from pipeoffload.schedules import generate

    torch.manual_seed(0)
    modules = [nn.Linear(width, width) for _ in range(2)]
    inputs, targets = torch.randn(microbatches, width), torch.randn(microbatches, width)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    runner = PipelineRunner(modules, generate("interleaved-1f1b", 1, microbatches, 2), 0, loss_fn=loss_fn,
                            measure_memory=False)

    def through_runtime() -> float:
        runner.step(inputs, targets)
        return runner.trace.wall  # type: ignore[union-attr]

    def direct() -> float:
        start = time.perf_counter()
        for x, t in zip(inputs.split(1), targets.split(1)):  # F, F, B, B as the stages would run them
            hidden = modules[0](x)
            boundary = hidden.detach().requires_grad_(True)
            loss = loss_fn(modules[1](boundary), t) / microbatches
            torch.autograd.backward([loss])
            torch.autograd.backward([hidden], [boundary.grad])
        return time.perf_counter() - start

    try:
        differences = []
        for _ in range(steps + 3):
            runtime = through_runtime()
            differences.append(runtime - direct())
    finally:
        runner.close()
    return max(statistics.median(differences[3:]), 0.0) / (4 * microbatches)


_COMPUTE = (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W)
_BUSY = (*_COMPUTE, ActionKind.R)  # what occupies a rank's core


def _replay_samples(runner: Any, inputs: Any, targets: Any, steps: int, warmup: int,
                    before_step: Callable[[], object] | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> dict[tuple[ActionKind, int], list[float]]:
    """Every compute action's duration by (kind, stage) over ``steps`` steps after ``warmup`` ones:
    the trace's wall durations (``time.perf_counter``) or each action's seconds on ``clock`` read
    around its handler (``time.thread_time``: the replaying thread's CPU); ``before_step()`` runs
    before each step (e.g. a barrier); gradients dropped."""
    samples: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    timed: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    with action_clock(runner, clock, timed):
        for n in range(warmup + steps):
            if before_step is not None:
                before_step()
            timed.clear()
            runner.step(inputs, targets)
            for stage in runner.stages.values():
                _zero_grads(stage.module)
            if n < warmup:
                continue
            if clock is not time.perf_counter:
                for key, values in timed.items():
                    samples[key] += values
                continue
            for r in runner.trace.records:
                if r.action.kind in _COMPUTE:
                    samples[(r.action.kind, r.action.stage)].append(r.end - r.start)
    return samples


@contextlib.contextmanager
def action_clock(runner: Any, clock: Callable[[], float],
                 sink: dict[tuple[ActionKind, int], list[float]]) -> Iterator[None]:
    """While inside, ``runner``'s compute actions (F, B, I, W) put their seconds on ``clock`` into
    ``sink`` by (kind, stage), e.g. ``time.thread_time`` (this thread's CPU: no waiting, no
    descheduling, no gloo thread), through ``PipelineRunner.wrapped_actions``, since its trace reads
    the wall clock only. Nothing is wrapped for ``time.perf_counter`` (the trace has it)."""
    if clock is time.perf_counter:
        yield
        return

    def timed(handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def run(self: Any, action: Any) -> None:
            start = clock()
            handler(self, action)
            if action.kind in _COMPUTE:
                sink[(action.kind, action.stage)].append(clock() - start)
        return run

    with runner.wrapped_actions(timed):
        yield


def replayed_action_times(runners: Sequence[Any], inputs: Any, targets: Any, *, steps: int = 3,
                          warmup: int = 1, clock: Callable[[], float] = time.perf_counter
                          ) -> dict[tuple[ActionKind, int], float]:
    """Median seconds of each compute action by (kind, stage) as the runtime runs them: each
    ``PipelineRunner`` in ``runners`` (one per rank of a schedule, each on a ``LoopbackTransport``:
    its receives are filled and its sends dropped, so it never waits on a peer) runs ``warmup +
    steps`` steps alone, one runner after the other, and the durations its trace records after the
    warm-up count. Unlike ``profile_stages``, which times each stage's F, I and W on their own in a
    warm loop, these include what the runtime does around the compute on that rank and schedule:
    the activation store's hooks where the backward is split, the trace, and the allocator and
    caches of many microbatches and stages alive at once. Gradients are dropped after each step.
    One rank at a time: what the ranks do to each other on shared cores is not in them
    (``concurrent_action_times`` measures that). ``clock``: ``time.perf_counter`` reads the trace's
    wall durations; any other clock is read around each action, e.g. ``time.thread_time`` (the
    replaying thread's CPU seconds, which other load on the machine does not stretch: the runtime's
    counterpart of ``profile_stages(..., clock=time.thread_time)``, for ``CostModel.cores``)."""
    samples: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
    for runner in runners:
        for key, values in _replay_samples(runner, inputs, targets, steps, warmup, clock=clock).items():
            samples[key] += values
    return {key: statistics.median(values) for key, values in samples.items()}


def concurrent_action_times(runner: Any, inputs: Any, targets: Any, *, barrier: Callable[[], object],
                            steps: int = 3, warmup: int = 1) -> dict[tuple[ActionKind, int], list[float]]:
    """This rank's compute-action durations by (kind, stage) while every rank replays at once: each
    rank calls this with its own ``runner`` on a ``LoopbackTransport`` (no waiting on a peer) and
    ``barrier`` (e.g. ``torch.distributed.barrier``) starts every replayed step together, so the
    durations carry what the ranks do to each other on the machine (shared cores, caches, memory
    bandwidth, clock speed), which ``replayed_action_times``, one rank alone, cannot. Every rank is
    busy for the whole replay, as a pipeline's ranks are outside its bubbles: where ranks outnumber
    cores, a real step (whose waiting ranks free their core) sees less contention than this. Returns
    every sample; gather the ranks' dicts and take medians (``with_action_times``)."""
    return dict(_replay_samples(runner, inputs, targets, steps, warmup, barrier))


def with_action_times(costs: CostModel, times: Mapping[tuple[ActionKind, int], float]) -> CostModel:
    """``costs`` with each stage's F, B, I and W times replaced by ``times`` (``replayed_action_times``)
    where they were measured, and no ``action_overhead`` or partial-recompute time on top (the
    replayed durations include both; the unmeasured stages keep theirs, folded in)."""
    n = len(costs.time_f) if isinstance(costs.time_f, tuple) else 1 + max((s for _, s in times), default=0)

    def merged(kind: ActionKind, base: Callable[[int], float]) -> tuple[float, ...]:
        return tuple(times.get((kind, s), base(s)) for s in range(n))

    return dataclasses.replace(
        costs, action_overhead=0.0, partial_recompute_time=0.0,
        time_f=merged(ActionKind.F, costs.f), time_b=merged(ActionKind.B, costs.b),
        time_i=merged(ActionKind.I, costs.i), time_w=merged(ActionKind.W, costs.w),
    )


def _chain_step(stages: Sequence[nn.Module], inputs: Any, loss_fn: LossFn, target: torch.Tensor) -> None:
    """One microbatch's forward through every stage, the loss and the backward (gradients dropped)."""
    out = inputs
    for stage in stages:
        out = stage(*_as_tuple(out))
    loss_fn(out, target).backward()
    for stage in stages:
        _zero_grads(stage)


def _concurrency_rank(rank: int, world: int, stages: Sequence[nn.Module], inputs: Any, loss_fn: LossFn,
                      target: torch.Tensor, repeats: int, warmup: int, rounds: int) -> dict[int, list[tuple[float, float]]]:
    """One rank of ``measure_concurrency``: for n = 1..world (then back, ``rounds`` times), ranks
    below n run ``_chain_step`` together while the others wait at the barrier; this rank's (wall,
    thread CPU) seconds of every step after the warm-up, for each n it took part in."""
    import torch.distributed as dist

    torch.manual_seed(0)
    order = [n for r in range(rounds) for n in (range(1, world + 1) if r % 2 == 0 else range(world, 0, -1))]
    samples: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for n in order:
        dist.barrier()
        if rank < n:
            for k in range(warmup + repeats):
                wall, cpu = time.perf_counter(), time.thread_time()
                _chain_step(stages, inputs, loss_fn, target)
                if k >= warmup:
                    samples[n].append((time.perf_counter() - wall, time.thread_time() - cpu))
    dist.barrier()
    return dict(samples)


def measure_concurrency(stages: Sequence[nn.Module], inputs: Any, *, loss_fn: LossFn, target: torch.Tensor,
                        ranks: int, repeats: int = 6, warmup: int = 2, rounds: int = 2, threads: int = 1,
                        clock: Callable[[], float] = time.perf_counter) -> tuple[float, ...]:
    """How much longer compute takes while n = 1..``ranks`` ranks compute at once on this machine
    (``CostModel.concurrency_slowdown``): ``ranks`` spawned processes (``threads`` each, as the
    pipeline's ranks) run one microbatch's forward and backward through ``stages`` in a loop, first
    one of them, then two together, and so on, in ``rounds`` passes up and down (so that a drift of
    the machine's load falls on every n alike). Factor n = the mean step wall with n computing (the
    mean: a pipeline's step is the sum of its actions, so the time slices a rank loses now and then
    count in full; under load the walls are skewed and their median is short) over the step alone
    read on ``clock``, the clock the profile was read on: ``time.perf_counter`` (the wall alone; factor 1
    is 1.0) or ``time.thread_time`` (the CPU time alone; factor 1 is then what other load on the
    machine adds to a rank computing alone). It carries what a profile taken alone cannot: more
    ranks than cores (time-sharing), caches and memory bandwidth shared, the machine's load now.
    CPU only (GPU ranks have a device each)."""
    from pipeoffload.runtime.launch import spawn

    if ranks < 1:
        raise ConfigError(f"measure_concurrency: ranks={ranks}; must be >= 1")
    if clock not in (time.perf_counter, time.thread_time):
        raise ConfigError("measure_concurrency: clock must be time.perf_counter or time.thread_time")
    run = spawn(_concurrency_rank, ranks, (list(stages), inputs, loss_fn, target, repeats, warmup, rounds),
                threads=threads, deadline=600)
    if not run.ok:
        raise RuntimeError("measure_concurrency: " + "; ".join(e for e in run.errors if e))
    per_n: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for result in run.results:
        for n, values in result.items():
            per_n[n] += values
    # the CPU time alone as the profile reads it (median); on the wall clock, factor 1 is 1.0 by definition
    alone = (statistics.median(cpu for _, cpu in per_n[1]) if clock is time.thread_time
             else statistics.mean(wall for wall, _ in per_n[1]))
    return tuple(statistics.mean(wall for wall, _ in per_n[n]) / alone for n in range(1, ranks + 1))


def other_load(slowdown: Sequence[float], cores: float) -> float:
    """Other processes' runnable threads on ``cores`` shared cores (``CostModel.other_load``), read from
    ``measure_concurrency``'s factors on the thread's CPU clock: with all n = len(slowdown) ranks
    computing, processor sharing makes each n's wall over its CPU time max(1, (n + load) / cores), so
    load = cores * factor_n - n (0 where that is below 0: the cores were not all taken)."""
    if not slowdown or cores <= 0:
        raise ConfigError(f"other_load: slowdown={tuple(slowdown)!r}, cores={cores!r}; need factors and cores > 0")
    return max(cores * slowdown[-1] - len(slowdown), 0.0)


def _scaled(costs: CostModel, factor: Sequence[float]) -> CostModel:
    """``costs`` with stage s's compute times (overhead and partial recompute folded in) times factor[s]."""
    n = len(factor)
    return dataclasses.replace(
        costs, action_overhead=0.0, partial_recompute_time=0.0, concurrency_slowdown=None,
        time_f=tuple(costs.f(s) * factor[s] for s in range(n)), time_i=tuple(costs.i(s) * factor[s] for s in range(n)),
        time_w=tuple(costs.w(s) * factor[s] for s in range(n)), time_b=tuple(costs.b(s) * factor[s] for s in range(n)),
        time_r=tuple(costs.r(s) * factor[s] for s in range(n)),
    )


def _harmonic_stretch(busy: list[list[tuple[float, float]]], costs: CostModel) -> list[float]:
    """Per rank, the slowdown its compute sees: over its busy intervals, the time-weighted harmonic
    mean of ``costs.concurrency(n)``, n the ranks busy at each moment (work done at speed 1/slowdown)."""
    edges = sorted({t for intervals in busy for a, b in intervals for t in (a, b)})
    counts = [sum(any(a <= lo and hi <= b for a, b in intervals) for intervals in busy)
              for lo, hi in zip(edges, edges[1:])]
    stretch = []
    for intervals in busy:
        time_, work = 0.0, 0.0
        for (lo, hi), n in zip(zip(edges, edges[1:]), counts):
            if any(a <= lo and hi <= b for a, b in intervals):
                time_ += hi - lo
                work += (hi - lo) / costs.concurrency(n)
        stretch.append(time_ / work if work else 1.0)
    return stretch


def contended_costs(schedule: Schedule, costs: CostModel, *, iterations: int = 30, tolerance: float = 1e-3) -> CostModel:
    """``costs`` for ``schedule`` (compute-only) with ``costs.concurrency_slowdown`` applied: the
    simulator gives every rank a machine of its own, so each rank's stage times are stretched by the
    slowdown its compute sees from the ranks busy at the same moments in the simulated timeline, to
    a fixed point (the stretched timeline gives the stretch; damped). A rank waiting in a bubble
    loads nobody, which a uniform factor would miss. Unchanged without a measured slowdown."""
    from pipeoffload.passes.lower import lower
    from pipeoffload.simulator import simulate

    if not costs.concurrency_slowdown:
        return costs
    placement = schedule.placement
    stretch = [1.0] * schedule.num_ranks
    for _ in range(iterations):
        current = _scaled(costs, [stretch[placement.rank_of(s)] for s in range(schedule.num_stages)])
        timeline = simulate(lower(schedule, current), current)
        busy = [[(a, b) for act, a, b in timeline.events(r) if act.kind in _BUSY and b > a]
                for r in range(schedule.num_ranks)]
        target = _harmonic_stretch(busy, costs)
        step = max(abs(t - s) / s for t, s in zip(target, stretch))
        stretch = [(s + t) / 2 for s, t in zip(stretch, target)]
        if step < tolerance:
            break
    return _scaled(costs, [stretch[placement.rank_of(s)] for s in range(schedule.num_stages)])


def _p2p_rank(rank: int, world: int, nbytes: int, seconds: float, busy: bool) -> float | None:
    """One rank of ``measure_p2p_time``: for ``seconds`` after a barrier, ranks 0 and 1 ping-pong and
    the others, if ``busy``, multiply matrices. Rank 0 returns the mean one-way seconds."""
    import torch.distributed as dist

    buf = torch.empty(max(nbytes // 4, 1))
    dist.barrier()
    end = time.perf_counter() + seconds
    samples = []
    if rank >= 2:
        a = torch.randn(128, 128)
        while busy and time.perf_counter() < end:
            a = torch.tanh(a @ a)
    else:
        for n in range(1 << 30):
            start = time.perf_counter()
            if rank == 0:  # rank 0 decides when to stop and tells rank 1 in the message's first element
                buf[0] = float(start < end)
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if n >= 2:
                samples.append((time.perf_counter() - start) / 2)
            if not buf[0].item():
                break
    dist.barrier()
    return statistics.mean(samples) if rank == 0 and samples else None


def measure_p2p_time(nbytes: int, *, ranks: int = 2, seconds: float = 1.0, busy: bool = True) -> float:
    """Seconds one message of ``nbytes`` takes from one CPU rank to another over gloo (the cost
    model's ``p2p_time``): ``ranks`` spawned one-thread processes, ranks 0 and 1 in a ping-pong for
    ``seconds``, the mean one-way time after two warm-ups (the mean: a pipeline's waits add up, so
    a late wake-up now and then counts in full). ``busy``: the other ranks compute meanwhile, as a
    pipeline's ranks do while two of them exchange a message; where the ranks outnumber the cores,
    the receiver then waits for a core to wake up on, which a ping-pong on an idle machine does not
    show."""
    from pipeoffload.runtime.launch import spawn

    if ranks < 2 or nbytes < 0 or seconds <= 0:
        raise ConfigError(f"measure_p2p_time: ranks={ranks}, nbytes={nbytes}, seconds={seconds}; "
                          "need ranks >= 2, nbytes >= 0 and seconds > 0")
    run = spawn(_p2p_rank, ranks, (nbytes, seconds, busy), deadline=120 + 2 * seconds)
    if not run.ok:
        raise RuntimeError("measure_p2p_time: " + "; ".join(e for e in run.errors if e))
    if run.results[0] is None:
        raise RuntimeError(f"measure_p2p_time: no round trip after the warm-ups in {seconds} s; give more seconds")
    return float(run.results[0])


@dataclass(frozen=True)
class MessageCosts:
    """What the runtime's messages cost, measured on its own transport (``measure_message_costs``).

    ``message_time``: seconds a rank's lane spends per SEND or RECV besides waiting (the cost model's
    ``message_time``; read from batches of sends only); ``p2p_time``: seconds from a send leaving its lane to a waiting
    receiver's lane taking it up (the cost model's ``p2p_time``: the transfer, the receiving thread's
    wake-up, a core to wake up on); ``samples``: how many messages gave each; ``measured_step`` and
    ``simulated_step``: the synthetic pipeline's step (median, slowest rank) and its simulation with
    these two figures and the runtime's own compute walls, a check of the model on the run measured;
    ``fitted_p2p_time``: the ``p2p_time`` at which that simulation takes the measured step (with this
    ``message_time``; 0 if it is already as long): what the transfers cost that pipeline in effect,
    where a delay now and then on its critical path weighs more than the mean says. ``message_cpu``:
    the CPU seconds per SEND/RECV of the ranks' other threads (the transport's; the cost model's
    ``message_cpu``, which competes for the cores where ranks share them: ``CostModel.cores``)."""

    message_time: float
    p2p_time: float
    samples: tuple[int, int]
    measured_step: float
    simulated_step: float
    fitted_p2p_time: float
    message_cpu: float = 0.0


_Record = tuple[str, int, int, float, float]  # (kind, stage, microbatch, start, end): seconds on the machine's clock


def _process_cpu() -> float:
    """CPU seconds of this process, every thread, user and system."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _message_rank(rank: int, world: int, family: str, v: int, microbatches: int, rows: int, width: int, depth: int,
                  steps: int, warmup: int) -> tuple[list[float], list[list[_Record]], list[float]]:
    """One rank of ``measure_message_costs``: ``PipelineRunner`` on the process group (the runtime's own
    transport) runs ``family`` over stages of ``depth`` ``Linear(width, width)`` + tanh on ``rows`` rows;
    this rank's step walls, per step after ``warmup`` its trace's records on the machine's clock, and
    the CPU seconds its other threads took during each step (the transport's: gloo's I/O thread, the
    socket's kernel work, the heartbeat), which the main thread's clock and the trace do not see."""
    import torch.distributed as dist

    from pipeoffload.passes.lower import lower
    from pipeoffload.runtime import PipelineRunner
    from pipeoffload.schedules import generate

    torch.manual_seed(0)
    schedule = lower(generate(family, world, microbatches, v))
    modules = {s: nn.Sequential(*(m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())))
               for s in schedule.placement.stages_of(rank)}

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    runner = PipelineRunner(modules, schedule, rank, loss_fn=loss_fn, measure_memory=False)
    inputs, targets = torch.randn(rows * microbatches, width), torch.randn(rows * microbatches, width)
    walls: list[float] = []
    steps_records: list[list[_Record]] = []
    others: list[float] = []
    try:
        for n in range(warmup + steps):
            dist.barrier()
            process, thread = _process_cpu(), time.thread_time()
            runner.step(inputs, targets)
            process, thread = _process_cpu() - process, time.thread_time() - thread
            for module in modules.values():
                _zero_grads(module)
            if n >= warmup:
                others.append(max(process - thread, 0.0))
                trace = runner.trace
                assert trace is not None
                walls.append(trace.wall)
                steps_records.append([(r.action.kind.value, r.action.stage, r.action.microbatch, trace.epoch + r.start,
                                       trace.epoch + r.end) for r in trace.records])
    finally:
        runner.close()
    return walls, steps_records, others


def _message_samples(step: Sequence[Sequence[_Record]]) -> tuple[list[float], list[tuple[float, float]]]:
    """From one step's records of every rank (a comm batch's actions share their start and end): per
    send of a batch of sends only (nothing to wait for: the lane's own cost), the batch's seconds per
    send; and per receive alone in a batch that began before its send's batch, (send batch start,
    receive batch end): a receiver waiting, the transfer in between. (A receive whose send left
    before it began may still be in flight, so it gives neither.)"""
    sends = {(kind, stage, mb): start for kind, stage, mb, start, _ in
             (r for records in step for r in records) if kind in ("SEND_F", "SEND_B")}
    peer = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", 1)}
    batches: dict[tuple[int, float, float], list[float | None]] = defaultdict(list)  # send starts; None: a send
    for rank, records in enumerate(step):
        for kind, stage, mb, start, end in records:
            if kind in peer:
                send, offset = peer[kind]
                batches[(rank, start, end)].append(sends.get((send, stage + offset, mb), -math.inf))
            elif kind in ("SEND_F", "SEND_B"):
                batches[(rank, start, end)].append(None)
    posted: list[float] = []
    waited: list[tuple[float, float]] = []
    for (_, start, end), members in batches.items():
        receives = [m for m in members if m is not None]
        if not receives:
            posted += [(end - start) / len(members)] * len(members)
        elif len(receives) == 1 and receives[0] > start:
            waited.append((receives[0], end))
    return posted, waited


@dataclass(frozen=True)
class SyntheticRun:
    """A synthetic pipeline run through the runtime on spawned gloo ranks (``synthetic_run``):
    ``schedule`` (compute-only), ``measured_step`` (median over steps of the slowest rank's),
    ``compute`` (a ``CostModel`` of the runtime's own mean compute walls per kind and stage, no
    transfers: what a simulation of this run needs besides its messages) and ``steps`` (per step,
    every rank's trace records on the machine's clock)."""

    schedule: Schedule
    measured_step: float
    compute: CostModel
    steps: tuple[tuple[list[_Record], ...], ...]
    transport_cpu: float = 0.0  # CPU seconds per SEND/RECV on the ranks' other threads (mean over the run)


def synthetic_run(nbytes: int, *, ranks: int = 2, family: str = "1f1b", v: int = 1, microbatches: int = 8,
                  depth: int = 8, width: int = 128, steps: int = 20, warmup: int = 3) -> SyntheticRun:
    """Run ``family`` with ``PipelineRunner`` on ``ranks`` spawned one-thread gloo processes (the
    runtime's own transport) over synthetic stages whose boundary messages are ``nbytes`` (``depth``
    ``Linear(width, width)`` + tanh each: the cores are busy between messages, as a pipeline's are),
    ``warmup + steps`` steps; what ``measure_message_costs`` reads, and a run to check a message model on."""
    from pipeoffload.runtime.launch import spawn
    from pipeoffload.schedules import generate

    rows = nbytes // (4 * width)
    if ranks < 2 or rows < 1 or steps < 1 or depth < 1:
        raise ConfigError(f"synthetic_run: ranks={ranks}, nbytes={nbytes}, steps={steps}, depth={depth}; "
                          f"need ranks >= 2, nbytes >= {4 * width}, steps >= 1 and depth >= 1")
    run = spawn(_message_rank, ranks, (family, v, microbatches, rows, width, depth, steps, warmup), deadline=600)
    if not run.ok:
        raise RuntimeError("synthetic_run: " + "; ".join(e for e in run.errors if e))
    measured = statistics.median(max(step) for step in zip(*(walls for walls, _, _ in run.results)))
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for _, records, _ in run.results:
        for kind, stage, _, start, end in (x for step in records for x in step):
            times[(kind, stage)].append(end - start)
    schedule = generate(family, ranks, microbatches, v)

    def mean(kind: str) -> tuple[float, ...]:
        return tuple(statistics.mean(times[(kind, s)]) if times[(kind, s)] else 0.0 for s in range(schedule.num_stages))

    split = any(kind in ("I", "W") for kind, _ in times)
    compute = CostModel(time_f=mean("F"), time_i=mean("I"), time_w=mean("W"), time_b=None if split else mean("B"))
    messages = sum(1 for _, records, _ in run.results for step in records for r in step
                   if r[0].startswith(("SEND", "RECV")))
    transport = sum(sum(others) for _, _, others in run.results) / max(messages, 1)
    return SyntheticRun(schedule, measured, compute, tuple(zip(*(records for _, records, _ in run.results))),
                        transport)


def measure_message_costs(nbytes: int, *, ranks: int = 2, family: str = "1f1b", v: int = 1, microbatches: int = 8,
                          depth: int = 8, width: int = 128, steps: int = 20, warmup: int = 3) -> MessageCosts:
    """The runtime's cost per message on CPU ranks over gloo, read from its own traces: ``synthetic_run``
    (``PipelineRunner`` on the process group: tags, posting, bounded waits, hand-offs,
    what a ping-pong does not exercise; the ranks' traces share the machine's clock).
    ``message_time``: the median seconds per send of the batches of sends only (what the lane itself
    spends: nothing to wait for); ``p2p_time``: the mean, over receives that began waiting before
    their send was posted, of the time from the send's batch start to the receive's end, less the
    sender's and the receiver's lane costs (the mean: waits add up; the ranks' wake-ups are skewed).
    ``message_cpu``: the CPU seconds per SEND/RECV that the ranks' other threads took (process CPU less
    the main thread's), what the transport loads the cores with besides the lanes (``CostModel.cores``).
    All are this machine's and this rank count's, independent of the model that will be simulated;
    ``MessageCosts`` also gives the synthetic step simulated with them."""
    from pipeoffload.passes.lower import lower
    from pipeoffload.simulator import simulate

    if ranks < 2:
        raise ConfigError(f"measure_message_costs: ranks={ranks}; need ranks >= 2")
    run = synthetic_run(nbytes, ranks=ranks, family=family, v=v, microbatches=microbatches, depth=depth,
                        width=width, steps=steps, warmup=warmup)
    posted: list[float] = []
    waited: list[tuple[float, float]] = []
    for step in run.steps:
        p, w = _message_samples(step)
        posted += p
        waited += w
    if not posted or not waited:
        raise RuntimeError(f"measure_message_costs: no {'batch of sends only' if not posted else 'receive waiting'}"
                           f" in {steps} steps of {family}; give more steps or another family")
    message_time = statistics.median(posted)
    # the sender's lane posts first (``message_time``), then the transfer, then the receiver's lane
    p2p_time = max(statistics.mean(end - start - 2 * message_time for start, end in waited), 0.0)
    costs = dataclasses.replace(run.compute, p2p_time=p2p_time, message_time=message_time)
    simulated = simulate(lower(run.schedule, costs), costs).makespan
    return MessageCosts(message_time, p2p_time, (len(posted), len(waited)), run.measured_step, simulated,
                        _fitted_transfer(run.schedule, costs, run.measured_step), run.transport_cpu)


def _fitted_transfer(schedule: Schedule, costs: CostModel, measured: float) -> float:
    """The ``p2p_time`` at which ``schedule`` simulates to ``measured`` seconds under ``costs`` (bisection:
    the simulated step grows with it); 0 when it is that long without transfers."""
    from pipeoffload.passes.lower import lower
    from pipeoffload.simulator import simulate

    lowered = lower(schedule, costs)

    def makespan(p2p: float) -> float:
        return simulate(lowered, dataclasses.replace(costs, p2p_time=p2p)).makespan

    low, high = 0.0, 0.0 if makespan(0.0) >= measured else measured
    while high - low > 1e-7:
        mid = (low + high) / 2
        low, high = (mid, high) if makespan(mid) < measured else (low, mid)
    return high
