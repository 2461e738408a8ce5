"""The interpreter: one loop over this rank's lowered actions, dispatched through a handler table.

``PipelineRunner.step`` splits the batch into microbatches, runs the rank's action list (the same
lowered list the simulator reads), and returns the mean loss on the rank holding the last stage.
Each action goes where its lane in ``semantics.LANE`` says: each run of consecutive send/receive
actions is one batch (see ``comm``), the peer stage of each from ``semantics.peer_stage``; compute
kinds (F/B/I/W/R) go to the stages and copy kinds (OFFLOAD/RELOAD) and WAIT to the activation store, through
a handler table keyed by kind. A kind semantics defines but the table lacks is refused when the
runner is built, by name. After the kinds in ``semantics.ENDS_ACTIVATION`` (B, W) the activation's
saved tensors are released. Every action is recorded in a ``Trace``.

Values between stages: a stage's output for microbatch ``mb`` goes to the next stage's inputs,
either through SEND_F/RECV_F or, when both stages are on this rank, directly (detached, so each
stage has its own graph). Input gradients come back the same way. Losses are divided by the number
of microbatches, so parameter gradients are those of the mean loss over the batch.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeoffload import semantics as sem
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule, require_schedule
from pipeoffload.models.split import stage_modules
from pipeoffload.passes.forward import forward_only
from pipeoffload.passes.lower import lower
from pipeoffload.runtime.comm import (
    LoopbackTransport,
    ProcessGroupTransport,
    Transport,
    check_fifo,
    check_tag_space,
    comm_batches,
    message_tag,
)
from pipeoffload.runtime.copier import Copier
from pipeoffload.runtime.hostmem import keep_freed_memory
from pipeoffload.runtime.offload import ActivationStore
from pipeoffload.runtime.spec import (
    Spec,
    TensorSpec,
    as_inputs,
    as_spec,
    assemble,
    check_values,
    flatten,
    grad_specs,
    infer_specs,
    spec_of,
    split_on_host,
    tensor_specs,
    to_device,
)
from pipeoffload.runtime.stage import LossFn, PipelineStage
from pipeoffload.runtime.trace import Trace, TraceRecord
from pipeoffload.validation import validate

log = logging.getLogger(__name__)
K = ActionKind
Handler = Callable[["PipelineRunner", Action], None]

# The wire side of each transfer kind: message direction in the tag (0: an activation, 1: its gradient).
_DIRECTION = {K.SEND_F: 0, K.RECV_F: 0, K.SEND_B: 1, K.RECV_B: 1}
_SENDS = frozenset(k for k in sem.KINDS if sem.lane_of(k) == sem.SEND)
_RECEIVES = frozenset(k for k in sem.KINDS if sem.lane_of(k) == sem.RECV)
# Kinds that need the activation store whether or not memory is measured: copies move its storages,
# I releases the ones W does not need (``ActivationStore.trim``).
_STORE_KINDS = frozenset(k for k in sem.KINDS if sem.lane_of(k) == sem.COPY) | {K.I}


def check_handled(row: Sequence[Action], handlers: Mapping[ActionKind, Handler], rank: int) -> None:
    """Refuse, by name, a kind on this rank's list that the runtime does not run: compute and copy
    kinds need a handler, send and receive kinds a message direction (``_DIRECTION``)."""
    for kind, example in {a.kind: a for a in reversed(row)}.items():
        comm = kind in _SENDS or kind in _RECEIVES
        if not (kind in _DIRECTION if comm else kind in handlers):
            raise ConfigError(
                f"rank {rank}: the schedule has {sem.lane_name(kind)} actions of kind {kind} (e.g. {example}), which "
                "pipeoffload.semantics defines but the runtime has no handler for; add one to "
                "PipelineRunner's handler table, or run a schedule without them")


def schedule_fingerprint(schedule: Schedule) -> str:
    """A short description and hash of the lowered schedule, equal on ranks that run the same one."""
    digest = hashlib.sha1(schedule.to_text().encode()).hexdigest()[:12]
    return (f"{schedule.name or 'schedule'} ranks={schedule.num_ranks} microbatches={schedule.num_microbatches} "
            f"stages={schedule.num_stages} #{digest}")


def _device_of(modules: Mapping[int, nn.Module], rank: int) -> torch.device:
    for module in modules.values():
        for t in (*module.parameters(), *module.buffers()):
            return t.device
    raise ConfigError(
        f"rank {rank}: its stage modules have no parameters or buffers to take the device from; "
        "pass PipelineRunner(..., device=...) (e.g. 'cpu' or 'cuda:0')"
    )


class PipelineError(RuntimeError):
    """A step failed on this rank; the message names the rank, the step and the action."""

    def __init__(self, message: str, rank: int, step: int, action: Action | None) -> None:
        super().__init__(message)
        self.rank, self.step, self.action = rank, step, action


class PipelineRunner:
    """Runs ``schedule`` for ``rank`` on the given stage modules.

    ``stages``: ``{global stage index: module}`` for this rank's stages (or a list in placement
    order). ``schedule``: compute-only (lowered here) or already lowered. ``group``: the pipeline's
    process group (default: the world); ``None`` with one rank needs no process group at all.
    ``loss_fn(output, target)`` runs on the last stage. ``timeout`` bounds every wait (seconds).
    ``min_offload_bytes``: smaller saved storages stay on the device. ``output_specs``: optionally
    declare each stage's output spec (list per microbatch, or one for all) instead of inferring it.
    ``transport``: replace the process group (``LoopbackTransport`` replays one rank alone).
    ``measure_memory``: the default of ``step(..., measure=)``; see ``step``.
    ``on_stage_gradients(stage)``: called once per step and local stage, right after the stage's
    last B or W, when its parameters' gradients are final (a data-parallel reduction starts there).
    """

    def __init__(
        self,
        stages: Mapping[int, nn.Module] | Sequence[nn.Module],
        schedule: Schedule,
        rank: int,
        *,
        group: dist.ProcessGroup | None = None,
        loss_fn: LossFn | None = None,
        device: torch.device | str | None = None,
        timeout: float = 300.0,
        min_offload_bytes: int = 4096,
        output_specs: Mapping[int, Any] | None = None,
        transport: Transport | None = None,
        copier: Copier | None = None,
        measure_memory: bool = True,
        on_stage_gradients: Callable[[int], None] | None = None,
    ) -> None:
        require_schedule(schedule, "PipelineRunner")
        self.schedule = schedule if schedule.is_lowered() or schedule.num_ranks == 1 else lower(schedule)
        validate(self.schedule)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise ConfigError(f"rank={rank!r}: must be an integer in 0..{self.schedule.num_ranks - 1} (this "
                              "process's pipeline rank)")
        if not 0 <= rank < self.schedule.num_ranks:
            raise ConfigError(f"rank={rank}: the schedule has ranks 0..{self.schedule.num_ranks - 1}")
        self.rank = rank
        placement = self.schedule.placement
        modules = stage_modules(stages, placement, rank)
        self.device = torch.device(device) if device is not None else _device_of(modules, rank)
        self.num_microbatches = self.schedule.num_microbatches
        self.num_stages = placement.num_stages
        self.store = ActivationStore(self.device, min_bytes=min_offload_bytes, copier=copier)
        self.device = self.store.device
        if self.device.type == "cpu":  # freed activations stay in the process for the next microbatch
            keep_freed_memory()
        for module in modules.values():
            self.store.exclude(module.parameters())
            self.store.exclude(module.buffers())
        self.stages = {
            s: PipelineStage(m, s, self.num_stages, self.store, loss_fn=loss_fn, num_microbatches=self.num_microbatches)
            for s, m in modules.items()
        }
        self.transport = transport if transport is not None else self._default_transport(group, timeout)
        if self.transport.matches_in_posting_order:
            check_fifo(self.schedule)
        check_tag_space(self.num_stages, self.num_microbatches)
        self.row = self.schedule.actions[rank]
        self.measure_memory = measure_memory
        # All of this rank's stages or none go through the store: a storage may be saved by several
        # slots (a tensor a module keeps across microbatches), and the store may free only what it knows of.
        self._store_needed = any(a.kind in _STORE_KINDS for a in self.row)
        self.recomputed = {(a.stage, a.microbatch) for a in self.row if a.kind == K.R}
        # slots offloaded in both windows: their RELOAD keeps the host copy for OFFLOAD_W (semantics)
        windows = {kind: {(a.stage, a.microbatch) for a in self.row if a.kind == kind}
                   for kind in (K.OFFLOAD, K.OFFLOAD_W)}
        self._keep_host = windows[K.OFFLOAD] & windows[K.OFFLOAD_W]
        self.specs: dict[int, list[Spec]] | None = self._declared(output_specs)
        # evaluation's own boundary specs, by the input specs of stage 0 that every rank learns from its
        # owner (a validation batch of another size than the training's needs its own receive buffers)
        self._spec_inputs: list[Spec] | None = None  # stage 0's input specs that ``specs`` were inferred for
        self._eval_specs: list[tuple[list[Spec] | None, dict[int, list[Spec]]]] = []
        self._evaluating = False
        self.step_count = 0  # steps run by this runner
        self.last_step = 0  # the number the last step was named by (``step(..., step=)``; 0: none yet)
        self.slot_bytes: dict[int, int] = {}  # largest bytes one (stage, microbatch) F saved, per stage
        self.w_bytes: dict[int, int] = {}  # largest bytes one slot still held after its I (what W needs)
        self.trace: Trace | None = None
        # Unbound functions, not bound methods: a runner must not refer to itself (a cycle would keep
        # it, and its transport's heartbeat thread, alive until the cyclic collector runs).
        cls = type(self)
        self._handlers: dict[ActionKind, Handler] = {
            K.F: cls._forward, K.B: cls._backward, K.I: cls._backward_input, K.W: cls._backward_weight,
            K.R: cls._recompute, K.OFFLOAD: cls._offload, K.RELOAD: cls._reload,
            K.OFFLOAD_W: cls._offload, K.RELOAD_W: cls._reload, K.WAIT: cls._await_offload,
        }
        check_handled(self.row, self._handlers, rank)
        # the stage at the other end of each transfer of this rank (semantics.peer_stage)
        self._peer_stage = {(a.kind, a.stage): sem.peer_stage(a.kind, a.stage, self.num_stages)
                            for a in self.row if a.kind in _DIRECTION}
        self._program = comm_batches(self.row)
        # the program position of each local stage's last B or W of a step: its gradients are final
        # there (what a data-parallel reduction can start from, while the rank runs its other work)
        self.on_stage_gradients = on_stage_gradients
        last = {a.stage: i for i, a in enumerate(self._program) if a.__class__ is not list and a.kind in (K.B, K.W)}
        self._gradients_final = {i: stage for stage, i in last.items()}
        # gloo matches messages by tag, so every receive of the step is posted when the step starts:
        # each message then lands in its buffer whenever it arrives, while this rank computes. A
        # receive posted after its data arrived costs gloo milliseconds (docs/runtime.md); posting
        # one comm batch ahead still left some late. (NCCL matches in posting order, and its batches
        # are group calls: there each batch posts its own.)
        self._prefetch = not self.transport.matches_in_posting_order
        self._early = _receives(self._program) if self._prefetch else []
        self._eval: tuple[list, list[Action]] | None = None  # evaluate's program, built on first use
        self._reset_state()

    def refresh_parameters(self) -> None:
        """The modules' parameters were replaced between steps (FSDP's all-gathered ones, whose storage
        each all-gather allocates anew): the store leaves the current ones alone, I and W use them."""
        modules = [stage.module for stage in self.stages.values()]
        self.store.exclude([t for m in modules for t in (*m.parameters(), *m.buffers())], replace=True)
        for stage in self.stages.values():
            stage.params = [p for p in stage.module.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def wrapped_actions(self, wrap: Callable[[Handler], Handler]) -> Iterator[None]:
        """While inside, each action kind's handler ``h(runner, action)`` is replaced by ``wrap(h)``:
        instrumentation such as a per-action clock (``profiling.action_clock``), with no branch in the
        interpreter when nobody asks for it. The table is restored on exit."""
        handlers = self._handlers
        self._handlers = {kind: wrap(handler) for kind, handler in handlers.items()}
        try:
            yield
        finally:
            self._handlers = handlers

    def close(self) -> None:
        """Stop the transport's heartbeat (also done when the runner is garbage)."""
        self.transport.close()

    # ---- set-up helpers ---------------------------------------------------------------------------
    def _default_transport(self, group: dist.ProcessGroup | None, timeout: float) -> Transport:
        if self.schedule.num_ranks == 1:
            return LoopbackTransport(self.device)
        if not dist.is_initialized():
            raise ConfigError(
                f"schedule has {self.schedule.num_ranks} ranks but torch.distributed is not initialised; "
                "call init_process_group first (or run under torchrun)"
            )
        size = dist.get_world_size(group)
        if size != self.schedule.num_ranks:
            raise ConfigError(
                f"process group has {size} ranks but the schedule has {self.schedule.num_ranks}; "
                "give a group with one process per pipeline rank"
            )
        return ProcessGroupTransport(group, timeout, self.device)

    def _declared(self, output_specs: Mapping[int, Any] | None) -> dict[int, list[Spec]] | None:
        if output_specs is None:
            return None
        out = {}
        for s, spec in output_specs.items():
            out[s] = [as_spec(x) for x in spec] if isinstance(spec, list) else [as_spec(spec)] * self.num_microbatches
        return out

    def _local(self, stage: int) -> bool:
        return self.schedule.placement.rank_of(stage) == self.rank

    def _reset_state(self) -> None:
        self._inputs: dict[tuple[int, int], tuple] = {}
        self._grads: dict[tuple[int, int], list] = {}
        self._outbox: dict[tuple[ActionKind, int, int], list[torch.Tensor]] = {}
        self._inflight: list[tuple[Any, list[torch.Tensor], int]] = []  # sends of pinned tensors, polled
        self._sent: list[tuple[Any, int]] = []  # the other sends (nothing to unpin): waited at the end of the step
        self._losses: dict[int, torch.Tensor] = {}
        self._posted: dict[Action, tuple[list[torch.Tensor], list[Any], list[int]]] = {}  # receives posted early

    # ---- specs ------------------------------------------------------------------------------------
    def _ensure_specs(self, mb_inputs: list[tuple] | None) -> None:
        """Infer every stage's output spec in stage order; each owner broadcasts its stage's. Training
        infers them once, at the first step; an evaluation whose batch has other shapes infers its own
        (once per shape: ``_eval_specs``) and leaves the training's in place."""
        if self._evaluating and (self._spec_inputs is not None or self.specs is None):
            self._ensure_eval_specs(mb_inputs)
            return
        if self.specs is not None:
            return
        self.specs = self._infer_specs(mb_inputs)
        self._spec_inputs = self._input_signature(mb_inputs)

    def _input_signature(self, mb_inputs: list[tuple] | None) -> list[Spec] | None:
        """Stage 0's input specs per microbatch, on every rank (its owner's, broadcast)."""
        owner = self.schedule.placement.rank_of(0)
        mine = [spec_of(x) for x in mb_inputs] if owner == self.rank and mb_inputs is not None else None
        return self.transport.broadcast(mine, owner)  # type: ignore[no-any-return]

    def _ensure_eval_specs(self, mb_inputs: list[tuple] | None) -> None:
        signature = self._input_signature(mb_inputs)
        if self.specs is not None and signature == self._spec_inputs:
            return  # the training's shapes
        for known, specs in self._eval_specs:
            if known == signature:
                self.specs = specs
                return
        self.specs = self._infer_specs(mb_inputs)
        self._eval_specs = [*self._eval_specs[-7:], (signature, self.specs)]  # a few shapes (a last, smaller batch)

    def _infer_specs(self, mb_inputs: list[tuple] | None) -> dict[int, list[Spec]]:
        self._check_same_schedule()
        specs: dict[int, list[Spec]] = {}
        for s in range(self.num_stages - 1):
            owner = self.schedule.placement.rank_of(s)
            mine = None
            if owner == self.rank:
                if s == 0:
                    if mb_inputs is None:
                        raise ConfigError(f"rank {self.rank} holds stage 0: pass the batch as step(inputs, ...)")
                    in_specs, values = [spec_of(x) for x in mb_inputs], _OnDevice(mb_inputs, self.device)
                else:
                    in_specs, values = specs[s - 1], None
                mine = infer_specs(self.stages[s].module, in_specs, self.device, values)
            specs[s] = self.transport.broadcast(mine, owner)
            if specs[s] is None:
                raise ConfigError(
                    f"rank {self.rank} cannot infer the output spec of stage {s} (held by rank {owner}) without a "
                    "process group; declare it with PipelineRunner(..., output_specs={stage: spec})"
                )
        return specs

    def _check_same_schedule(self) -> None:
        """Every rank must run the same lowered schedule (else messages silently pair up wrongly)."""
        mine = schedule_fingerprint(self.schedule)
        prints = self.transport.all_gather(mine)
        if len(set(prints)) > 1:
            by_print: dict[str, list[int]] = {}
            for r, fp in enumerate(prints):
                by_print.setdefault(fp, []).append(r)
            groups = "; ".join(f"ranks {ranks}: {fp}" for fp, ranks in by_print.items())
            others = [r for r, fp in enumerate(prints) if fp != mine]
            raise ConfigError(
                f"ranks {others} run a different schedule from rank {self.rank} ({groups}); build every rank's "
                "PipelineRunner from the same schedule, microbatches and policies"
            )

    # ---- the step ---------------------------------------------------------------------------------
    def step(self, inputs: Any = None, targets: Any = None, *, measure: bool | None = None,
             step: int | None = None) -> torch.Tensor | None:
        """Run one training step (forward and backward of every microbatch); gradients accumulate in
        the stage modules' parameters. Returns the mean loss on the last stage's rank, else None.

        ``measure`` (default: the runner's ``measure_memory``): count the activation bytes (the
        trace's memory fields, ``slot_bytes``, ``w_bytes``). A rank whose actions neither copy nor
        split the backward runs an unmeasured step with no saved-tensor hooks at all; the trace then
        says ``measured=False`` and its byte fields are 0. Rows that copy or split always measure.

        ``step``: the caller's number for this step, which a failure names ("failed at step 257"):
        a training loop passes its own (1-based, continuing after a resume). Without it the runner
        names its steps by its own count, from 1 as ``train`` and ``python -m pipeoffload.runtime`` do
        (``step_count`` after the step)."""
        m = self.num_microbatches
        self._split(inputs, targets, "step")
        if step is None:
            step = self.step_count + 1
        trace = Trace(self.rank, step)  # named as its failures are: a trace's step is the one the log shows
        self.last_step = step
        self.step_count += 1
        measure = self.measure_memory if measure is None else measure
        self.store.active = trace.measured = measure or self._store_needed
        self.store.reset_peak()
        self._run(self._program, self._early, self._handlers, trace, f"step {step}", step,
                  self._gradients_final)
        trace.peak_bytes = self.store.peak_bytes
        trace.peak_host_bytes = self.store.peak_host_bytes
        trace.end_bytes = self.store.resident_bytes
        self.trace = trace
        if self._mb_targets is None:
            return None
        total = self._losses[0]
        for mb in range(1, m):
            total = total + self._losses[mb]
        self._losses.clear()
        return total

    @torch.no_grad()
    def evaluate(self, inputs: Any = None, targets: Any = None, *, step: int | None = None) -> list[torch.Tensor] | None:
        """Forward only, without autograd: each microbatch's loss (not divided by the number of
        microbatches) on the last stage's rank, else None. Runs the forward-only schedule of this
        runner's schedule (``passes.forward.forward_only``: the same placement and F order) through
        the same interpreter, transport and failure handling as ``step``; nothing is saved, so the
        activation store is not involved. Put the modules in eval mode first if they need it.
        ``step``: the step the evaluation follows, as a failure names it ("the evaluation after step
        4"); default: the last step this runner ran, by the number ``step`` named it with."""
        if self._eval is None:
            program = comm_batches(forward_only(self.schedule).actions[self.rank])
            self._eval = program, _receives(program) if self._prefetch else []
        m = self.num_microbatches
        self._split(inputs, targets, "evaluate")
        active, self.store.active = self.store.active, False
        training, self._evaluating = self.specs, True
        try:
            after = self.last_step if step is None else step
            self._run(*self._eval, {K.F: type(self)._forward_eval}, Trace(self.rank, after),
                      f"the evaluation after step {after}", after)
        finally:
            self.store.active = active
            self.specs, self._evaluating = training, False
        if self._mb_targets is None:
            return None
        losses = [self._losses[mb] for mb in range(m)]
        self._losses.clear()
        return losses

    def _split(self, inputs: Any, targets: Any, caller: str) -> None:
        """The microbatches of the batch this rank needs: inputs on stage 0's rank, targets on the last's, where
        the caller's batch is (``split_on_host``): each goes to the device when its forward needs it (``_take``)."""
        m, pin = self.num_microbatches, self.device.type == "cuda"
        self._mb_inputs = split_on_host(inputs, m, "inputs", pin) if 0 in self.stages else None
        self._mb_targets = None
        if self.num_stages - 1 in self.stages:
            if targets is None:
                raise ConfigError(f"rank {self.rank} holds the last stage: pass targets to {caller}(inputs, targets)")
            self._mb_targets = split_on_host(targets, m, "targets", pin)

    def _take(self, pieces: list[tuple | None], mb: int) -> tuple:
        """Microbatch ``mb``'s inputs or targets as its own copy on the device, which the runner no longer holds:
        the forward keeps what it needs (saved for the backward, or kept for R), no longer than the microbatch
        is in flight."""
        piece, pieces[mb] = pieces[mb], None
        return to_device(piece, self.device)  # type: ignore[arg-type]

    def _target(self, mb: int) -> Any:
        targets = self._take(self._mb_targets, mb)  # type: ignore[arg-type]
        return targets if len(targets) > 1 else targets[0]

    def _run(self, program: list, early: list[Action], handlers: Mapping[ActionKind, Handler],
             trace: Trace, label: str, step: int, final: Mapping[int, int] | None = None) -> None:
        """Interpret ``program`` (this rank's actions, comms in batches) into ``trace``; a failure
        becomes a ``PipelineError`` naming ``label`` (e.g. "step 3") and the action. ``early``: the
        receives to post before the first action (gloo: all of them). ``final``: the positions after
        which a stage's gradients are final (``on_stage_gradients``)."""
        record, clock, store = trace.records.append, time.perf_counter, self.store
        ready = final if final and self.on_stage_gradients is not None else {}
        index, current = 0, None  # current: the action running (or a phase name), for error messages
        t0 = clock()
        trace.epoch = time.time()  # the step start on the wall clock ranks share (trace.epoch)
        try:
            current = "shape inference"
            self._ensure_specs(self._mb_inputs)
            current = "posting the step's receives"
            self._post_early(early)
            current = None
            for position, item in enumerate(program):
                begin = clock() - t0
                current = item
                if item.__class__ is list:  # a batch of comm actions
                    self._exchange(item)
                    end, resident, host = clock() - t0, store.resident_bytes, store.host_bytes
                    for a in item:
                        record(TraceRecord(a, begin, end, resident, host))
                    index += len(item)
                else:
                    handlers[item.kind](self, item)
                    if position in ready:
                        self.on_stage_gradients(ready[position])  # type: ignore[misc]
                    store.poll()
                    record(TraceRecord(item, begin, clock() - t0, store.resident_bytes, store.host_bytes))
                    index += 1
            current = None
            self._finish_step()
        except (Exception, SystemExit) as exc:  # a sys.exit() in the model or the loss too: name the action
            raise self._fail(exc, label, step, index, current) from exc
        trace.wall = time.perf_counter() - t0

    def _finish_step(self) -> None:
        for work, _tensors, peer in self._inflight:
            self.transport.wait([work], [peer], "a send to")
        for work, peer in self._sent:
            self.transport.wait([work], [peer], "a send to")
        self._sent.clear()
        self._unpin_sent(everything=True)
        self.store.finish()
        leftovers = [s for s, st in self.stages.items() if st.pending()]
        if leftovers or self._inputs or self._grads or self._outbox or self._posted:
            raise RuntimeError(
                f"step ended with unconsumed state: stages {leftovers} pending, inputs {sorted(self._inputs)}, "
                f"receives posted early {sorted(map(str, self._posted))}, "
                f"gradients {sorted(self._grads)}, unsent {sorted(map(str, (Action(*k) for k in self._outbox)))}"
            )

    def _who(self) -> str:
        """This rank as errors name it: by its global number when that differs from the pipeline's."""
        g = self.transport.global_name(self.rank)
        return f"pipeline rank {self.rank}" if g == self.rank else f"rank {g} (pipeline rank {self.rank})"

    def _fail(self, exc: BaseException, label: str, step: int, index: int, action: Any) -> PipelineError:
        if isinstance(action, list) and len(action) == 1:  # a comm batch of one: "action #4 1RECV_F0", not "#4-4"
            action = action[0]
        if isinstance(action, Action):
            where = f"{label}, action #{index} {action}"
        elif isinstance(action, list):  # a comm batch: name all of it, it fails as one
            where = f"{label}, actions #{index}-{index + len(action) - 1} [{' '.join(map(str, action))}]"
            action = action[0]
        else:
            where = f"{label}, {action or 'end of step'}"
            action = None
        message = f"{self._who()} failed at {where}: {type(exc).__name__}: {exc}"
        if isinstance(exc, SystemExit):
            message += " (sys.exit() called in the model or the loss: a rank may not end on its own)"
        first = self.transport.first_failure()
        if first is not None and first != message:
            message += f"\n  first failure in the pipeline: {first}"
        else:
            self.transport.record_failure(message)
        log.error(message)
        for stage in self.stages.values():
            stage.reset()
        self.store.clear()
        self._reset_state()
        return PipelineError(message, self.rank, step, action)

    # ---- compute handlers -------------------------------------------------------------------------
    def _forward(self, a: Action) -> None:
        s, mb = a.stage, a.microbatch
        stage = self.stages[s]
        args = self._take(self._mb_inputs, mb) if s == 0 else self._inputs.pop((s, mb))  # type: ignore[arg-type]
        target = self._target(mb) if stage.is_last else None
        out = stage.forward(mb, args, target, recompute=(s, mb) in self.recomputed)
        self._note_slot(s, mb)
        if stage.is_last:
            self._losses[mb] = out
            return
        leaves, tree = flatten(out)
        spec = self.specs[s][mb]  # type: ignore[index]
        check_values(leaves, tree, spec, f"output of stage {s}, microbatch {mb}")
        if self._local(s + 1):
            # a copy, as a transfer between ranks makes: a storage this stage saved (its last op's output)
            # would otherwise be saved by the next stage's slot too, one storage where the simulator
            # counts one per slot, and kept on the device by whichever slot is not offloaded
            self._inputs[(s + 1, mb)] = as_inputs(_copied(leaves, spec), spec)
        else:
            self._outbox[(K.SEND_F, s, mb)] = [v for v, sp in zip(leaves, spec.leaves) if isinstance(sp, TensorSpec)]

    def _forward_eval(self, a: Action) -> None:
        """F of an evaluation: the module alone (no saving, no loss scaling); the value goes on as in ``_forward``."""
        s, mb = a.stage, a.microbatch
        stage = self.stages[s]
        args = self._take(self._mb_inputs, mb) if s == 0 else self._inputs.pop((s, mb))  # type: ignore[arg-type]
        out = stage.module(*args)
        if stage.is_last:
            if stage.loss_fn is None:
                raise ValueError(f"stage {s} is the last stage but no loss_fn was given")
            self._losses[mb] = stage.loss_fn(out, self._target(mb))
            return
        leaves, tree = flatten(out)
        spec = self.specs[s][mb]  # type: ignore[index]
        check_values(leaves, tree, spec, f"output of stage {s}, microbatch {mb}")
        if self._local(s + 1):
            self._inputs[(s + 1, mb)] = as_inputs(leaves, spec)
        else:
            self._outbox[(K.SEND_F, s, mb)] = [v for v, sp in zip(leaves, spec.leaves) if isinstance(sp, TensorSpec)]

    def _route_input_grads(self, s: int, mb: int, grads: list[torch.Tensor | None]) -> None:
        if s == 0:
            return
        specs = grad_specs(self.specs[s - 1][mb])  # type: ignore[index]
        full = [g if g is not None else torch.zeros(sp.shape, dtype=sp.dtype, device=self.device)
                for g, sp in zip(grads, specs)]
        if self._local(s - 1):
            self._grads[(s - 1, mb)] = full
        else:
            self._outbox[(K.SEND_B, s, mb)] = full

    def _backward(self, a: Action) -> None:
        self._input_gradient(a, self.stages[a.stage].backward)

    def _backward_input(self, a: Action) -> None:
        self._input_gradient(a, self.stages[a.stage].backward_input)

    def _input_gradient(self, a: Action, run: Callable[[int, Any], list]) -> None:
        """B or I: run it on the output gradient, release the activation if that ends it, send on the
        input gradient."""
        s, mb = a.stage, a.microbatch
        grads = None if self.stages[s].is_last else self._grads.pop((s, mb))
        if a.kind is K.I and self._inflight:  # I releases what W does not need: a pin would keep it
            self._settle_sends(s, mb)
        in_grads = run(mb, grads)
        if a.kind is K.I:
            kept = self.store.slot_bytes(s, mb)
            if kept > self.w_bytes.get(s, 0):
                self.w_bytes[s] = kept
        self._release_if_ended(a)
        self._route_input_grads(s, mb, in_grads)

    def _backward_weight(self, a: Action) -> None:
        self.stages[a.stage].backward_weight(a.microbatch)
        self._release_if_ended(a)

    def _release_if_ended(self, a: Action) -> None:
        """Drop the activation's saved tensors after a kind that leaves nothing of it (B, or W after I)."""
        if a.kind in sem.ENDS_ACTIVATION:
            self.store.release(a.stage, a.microbatch)

    def _recompute(self, a: Action) -> None:
        self.stages[a.stage].recompute(a.microbatch)
        self._note_slot(a.stage, a.microbatch)

    def _note_slot(self, s: int, mb: int) -> None:
        if not self.store.active:
            return
        saved = self.store.slot_bytes(s, mb)
        if saved > self.slot_bytes.get(s, 0):
            self.slot_bytes[s] = saved

    def _offload(self, a: Action) -> None:
        if self._inflight:
            self._settle_sends(a.stage, a.microbatch)
        self.store.offload(a.stage, a.microbatch)

    def _await_offload(self, a: Action) -> None:
        """WAIT: hold this rank until the slot's OFFLOAD has completed and its device memory is freed."""
        self.store.await_offload(a.stage, a.microbatch)

    def _reload(self, a: Action) -> None:
        """RELOAD or RELOAD_W (the slot after I holds only what W needs: the same call moves it)."""
        keep = a.kind is K.RELOAD and (a.stage, a.microbatch) in self._keep_host
        self.store.reload(a.stage, a.microbatch, keep_host=keep)

    # ---- communication ----------------------------------------------------------------------------
    def _exchange(self, batch: list[Action]) -> None:
        """Post one batch of sends and receives; block until the receives arrived."""
        S, M = self.num_stages, self.num_microbatches
        placement = self.schedule.placement
        sends, recvs, arrivals = [], [], []
        for a in batch:
            s, mb = a.stage, a.microbatch
            if a.kind in _SENDS:
                direction, peer = _DIRECTION[a.kind], self._peer_stage[(a.kind, s)]
                tensors = [t.contiguous() for t in self._outbox.pop((a.kind, s, mb))]
                peer_rank = placement.rank_of(peer)
                sends += [(peer_rank, message_tag(direction, s, mb, i, S, M), t) for i, t in enumerate(tensors)]
            else:
                spec, bufs, peer_rank, tags = self._receive_plan(a)
                recvs += [(peer_rank, tag, t) for tag, t in zip(tags, bufs)]
                arrivals.append((a, spec, bufs))
        early = [self._posted.pop(a) for a, _, _ in arrivals if a in self._posted]
        send_works, recv_works = self.transport.post(sends, recvs)
        for (peer, _, t), work in zip(sends, send_works):  # one work per tensor (gloo)
            if self.store.pin(t):  # an activation the store manages: unpinned once its send is waited (_settle_sends)
                self._inflight.append((work, [t], peer))
            else:  # the work holds the tensor until it is sent; nothing to poll for
                self._sent.append((work, peer))
        for _, works, peers in early:
            self.transport.wait(works, peers)
        self.transport.wait(recv_works, [peer for peer, _, _ in recvs])
        for a, spec, bufs in arrivals:
            if a.kind == K.RECV_F:
                self._inputs[(a.stage, a.microbatch)] = assemble(spec, bufs)
            else:
                self._grads[(a.stage, a.microbatch)] = bufs
        if self._inflight:
            self._unpin_sent()

    def _receive_plan(self, a: Action) -> tuple[Spec, list[torch.Tensor], int, list[int]]:
        """For RECV_F/RECV_B ``a``: the spec of the value, its buffers, the peer and the message
        tags; for a receive already posted early, its buffers and no tags (nothing to post)."""
        S, M = self.num_stages, self.num_microbatches
        s, mb = a.stage, a.microbatch
        if a in self._posted:
            spec_src = self.specs[s - 1 if a.kind == K.RECV_F else s][mb]  # type: ignore[index]
            return spec_src, self._posted[a][0], -1, []
        sender, direction = self._peer_stage[(a.kind, s)], _DIRECTION[a.kind]
        if a.kind == K.RECV_F:  # the sender's output
            spec = self.specs[sender][mb]  # type: ignore[index]
            bufs = [ts.empty(self.device) for ts in tensor_specs(spec)]
        else:  # RECV_B: the gradient of this stage's output
            spec = self.specs[s][mb]  # type: ignore[index]
            bufs = [ts.empty(self.device) for ts in grad_specs(spec)]
        tags = [message_tag(direction, sender, mb, i, S, M) for i in range(len(bufs))]
        return spec, bufs, self.schedule.placement.rank_of(sender), tags

    def _post_early(self, actions: list[Action]) -> None:
        """Post these receives now (gloo); the comm batch of each waits for it (``_exchange``)."""
        for a in actions:
            _, bufs, peer, tags = self._receive_plan(a)
            _, works = self.transport.post([], [(peer, tag, t) for tag, t in zip(tags, bufs)])
            self._posted[a] = (bufs, list(works), [peer] * len(bufs))

    def _settle_sends(self, stage: int, microbatch: int) -> None:
        """Complete the pending sends of storages slot (stage, microbatch) saved and drop their pins,
        before the slot's OFFLOAD, OFFLOAD_W or I frees its storages (a stage whose last op saves its
        output sends a saved storage). The schedule posts each send before the copy or I that frees
        its storage, and the simulator frees the storage there; gloo's send work reports completion
        only once waited (``is_completed`` stays False until ``wait``), so polling would keep the pin,
        and the bytes, to the end of the step. The receiver posted its receives when its step began,
        so the wait is for the transfer alone. (NCCL pins nothing: waiting on a batch's works orders
        the compute stream after its sends, so the storage can go as soon as its copy has.)"""
        still = []
        for work, pinned, peer in self._inflight:
            if any(self.store.holds(t, stage, microbatch) for t in pinned):
                self.transport.wait([work], [peer], "a send to")
                for t in pinned:
                    self.store.unpin(t)
            else:
                still.append((work, pinned, peer))
        self._inflight = still

    def _unpin_sent(self, everything: bool = False) -> None:
        """Forget sends that completed (their buffers can go) and drop their pins."""
        still = []
        for work, pinned, peer in self._inflight:
            if everything or work.is_completed():
                for t in pinned:
                    self.store.unpin(t)
            else:
                still.append((work, pinned, peer))
        self._inflight = still


def _copied(leaves: Sequence[Any], spec: Spec) -> list[Any]:
    """``leaves`` with each tensor the spec sends copied into a storage of its own (detached)."""
    return [v.detach().clone() if isinstance(sp, TensorSpec) else v for v, sp in zip(leaves, spec.leaves)]


class _OnDevice(Sequence[tuple]):
    """Stage 0's microbatch inputs on the device one at a time, as a shape probe reads them (one per distinct
    shape, ``spec.infer_specs``); the step's own copies are made later, each by its forward."""

    def __init__(self, pieces: list[tuple], device: torch.device) -> None:
        self.pieces, self.device = pieces, device

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, i: int) -> tuple:  # type: ignore[override]
        return to_device(self.pieces[i], self.device)


def _receives(program: list) -> list[Action]:
    """The receive actions of ``program``'s comm batches, in program order."""
    return [a for item in program if isinstance(item, list) for a in item if a.kind in _RECEIVES]
