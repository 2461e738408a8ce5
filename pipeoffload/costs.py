"""The cost model: per-stage compute times, activation sizes, P2P and host-link copy costs.

A ``CostModel`` is a typed value passed explicitly to passes, the simulator and the planner.
Time is in arbitrary units (seconds when built from hardware); memory in *activation units*
(one microbatch's saved activations for one stage), converted to bytes by ``activation_bytes``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeoffload.errors import ConfigError

PerStage = float | tuple[float, ...]


def _at(value: PerStage, stage: int) -> float:
    return value if isinstance(value, (int, float)) else value[stage]


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Costs of one stage and one microbatch; each per-stage field is a scalar or a per-stage tuple.

    ``time_b`` defaults to ``time_i + time_w``; ``time_r`` (recompute) defaults to ``time_f``.
    ``w_fraction`` is the part of a stage's activation still needed by W after I has run (1.0 is the
    conservative default the reference implementation and PyTorch's liveness analysis use).
    Copy times are per activation unit, one direction; they scale with the stage's ``activation``.
    ``partial_recompute_saving`` is the fraction of activation bytes not stored because the backward
    recomputes them (LayerNorm/GeLU/dropout: about 14/34), at ``partial_recompute_time`` times the
    stage's F time of extra work in its backward (I or B); both default to 0 (no partial recompute).
    ``action_overhead`` is a fixed time added to every compute action (F, B, I, W, R): what the
    runtime spends per action besides the stage's own compute (dispatch, bookkeeping, the trace),
    which weighs on small models where actions are short (the profiler measures it; default 0).
    ``message_time`` is what the runtime's lane spends on each SEND and each RECV action besides the
    transfer itself (``p2p_time``): posting, matching, the receiving thread's wake-up and hand-off; a
    message then costs ``message_time`` on the sender's lane, ``p2p_time`` in flight and
    ``message_time`` on the receiver's lane once it has arrived (a compute-only schedule's implicit
    transfers take ``p2p_time + 2 * message_time``, on no lane). The profiler measures it on the
    runtime's own transport (``profiling.measure_message_costs``); default 0.
    ``concurrency_slowdown[n - 1]`` is how many times longer a compute action takes while ``n`` ranks
    compute at once on the machine than its time here (1.0 for ``n = 1`` with times read on the wall
    clock; more with CPU times on a loaded machine): cores, caches and memory bandwidth shared by
    ranks of one host, above all more ranks than cores. The profiler measures it
    (``measure_concurrency``); ``concurrency(n)`` reads it; ``profiling.contended_costs`` applies it
    to a schedule; ``simulate`` itself does not, and cost files do not carry it. None: every rank
    has a machine of its own.
    ``cores``: the CPU cores the ranks share (CPU ranks on one host; None, the default: every rank has
    a processor of its own). ``simulate`` then runs a processor-sharing timeline: each of the n
    runnable lanes (computing, or a SEND's/RECV's ``message_time``) and pending transports progresses
    at min(1, cores / n) of its speed; a rank waiting for data loads no core. ``message_cpu`` is what
    each SEND and RECV costs its rank's transport thread besides the lane (copies, the socket's
    kernel work, wake-ups): CPU that competes for the cores but holds no lane; charged only with
    ``cores`` (the profiler measures both: ``measure_message_costs``). ``other_load``: threads of other
    processes runnable on those cores the whole time (the machine's load; ``profiling.other_load``
    reads it from ``measure_concurrency``): n runnable then progress at min(1, cores / (n + other_load)).
    No offload copies with ``cores``.
    """

    time_f: PerStage = 1.0
    time_i: PerStage = 1.0
    time_w: PerStage = 1.0
    time_b: PerStage | None = None
    time_r: PerStage | None = None
    activation: PerStage = 1.0
    w_fraction: float = 1.0
    activation_bytes: float | None = None
    p2p_time: float = 0.0
    d2h_time: float = 0.0
    h2d_time: float = 0.0
    shared_copy_engine: bool = True
    shared_host_link: bool = False
    partial_recompute_saving: PerStage = 0.0
    partial_recompute_time: PerStage = 0.0
    # measured per stage (the profiler: ~0.5 for transformer blocks, 1.0 for a first stage whose
    # backward is all weight gradients); None: ``w_fraction`` for every stage. Passes that take one
    # number use ``w_fraction``; ``from_dict`` sets it to the largest per-stage value (conservative).
    stage_w_fraction: tuple[float, ...] | None = None
    action_overhead: float = 0.0
    message_time: float = 0.0
    concurrency_slowdown: tuple[float, ...] | None = None
    cores: float | None = None
    message_cpu: float = 0.0
    other_load: float = 0.0

    def __post_init__(self) -> None:
        for name in _NUMBERS:  # inf or nan would make every time and peak after it silently wrong
            value = getattr(self, name)
            values = [value] if value is None or isinstance(value, (int, float)) else list(value)
            if any(v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)) for v in values):
                raise ConfigError(f"{name}={value!r}: must be a finite number")
        for name in ("time_f", "time_i", "time_w", "time_b", "time_r", "activation"):
            value = getattr(self, name)
            values = [value] if value is None or isinstance(value, (int, float)) else list(value)
            if any(v is not None and v < 0 for v in values):
                raise ConfigError(f"{name}={value!r}: times and sizes must be >= 0")
        if self.cores is not None and not self.cores > 0:
            raise ConfigError(f"cores={self.cores!r}: must be > 0 (or None: a processor per rank)")
        for name in ("p2p_time", "d2h_time", "h2d_time", "action_overhead", "message_time", "message_cpu",
                     "other_load"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be >= 0")
        saving = self.partial_recompute_saving
        if any(not 0.0 <= x < 1.0 for x in ([saving] if isinstance(saving, (int, float)) else saving)):
            raise ConfigError(f"partial_recompute_saving={saving!r}: must be in [0, 1)")
        extra = self.partial_recompute_time
        if any(not x >= 0.0 for x in ([extra] if isinstance(extra, (int, float)) else extra)):
            raise ConfigError(f"partial_recompute_time={extra!r}: must be >= 0")
        if not 0.0 <= self.w_fraction <= 1.0:
            raise ConfigError(f"w_fraction={self.w_fraction!r}: must be in [0, 1]")
        if self.stage_w_fraction is not None and any(not 0.0 <= x <= 1.0 for x in self.stage_w_fraction):
            raise ConfigError(f"stage_w_fraction={self.stage_w_fraction!r}: every value must be in [0, 1]")
        if self.concurrency_slowdown is not None and (
                not self.concurrency_slowdown or any(x <= 0 for x in self.concurrency_slowdown)):
            raise ConfigError(f"concurrency_slowdown={self.concurrency_slowdown!r}: one factor > 0 per number of "
                              "ranks computing at once (1, 2, ...)")

    # ---- per-stage lookups -------------------------------------------------------------------
    def f(self, stage: int) -> float:
        return _at(self.time_f, stage) + self.action_overhead

    def i(self, stage: int) -> float:
        return _at(self.time_i, stage) + self._partial_extra(stage) + self.action_overhead

    def w(self, stage: int) -> float:
        return _at(self.time_w, stage) + self.action_overhead

    def b(self, stage: int) -> float:
        """One action: the overhead counted once, though ``time_b`` defaults to I + W."""
        if self.time_b is None:
            return _at(self.time_i, stage) + self._partial_extra(stage) + _at(self.time_w, stage) + self.action_overhead
        return _at(self.time_b, stage) + self._partial_extra(stage) + self.action_overhead

    def r(self, stage: int) -> float:
        return self.f(stage) if self.time_r is None else _at(self.time_r, stage) + self.action_overhead

    def concurrency(self, ranks: int) -> float:  # ranks >= 1
        """Slowdown of a compute action while ``ranks`` ranks compute at once; past the measured
        counts, the last one stretched in proportion (the ranks time-share what was measured)."""
        measured = self.concurrency_slowdown
        if not measured:
            return 1.0
        if ranks <= len(measured):
            return measured[ranks - 1]
        return measured[-1] * ranks / len(measured)

    def w_fraction_of(self, stage: int) -> float:
        """Part of ``stage``'s activation that W still needs after I."""
        return self.w_fraction if self.stage_w_fraction is None else self.stage_w_fraction[stage]

    def act(self, stage: int) -> float:
        """Stored activation of one microbatch (after partial recomputation drops its share)."""
        return _at(self.activation, stage) * (1.0 - _at(self.partial_recompute_saving, stage))

    def _partial_extra(self, stage: int) -> float:
        extra = _at(self.partial_recompute_time, stage)
        return extra * _at(self.time_f, stage) if extra else 0.0

    def d2h(self, stage: int) -> float:
        return self.d2h_time * self.act(stage)

    def h2d(self, stage: int) -> float:
        return self.h2d_time * self.act(stage)

    def offload_ratio(self, stage: int = 0) -> float:
        """The paper's k: (D2H + H2D time of one activation unit) / (F + I + W time of that unit)."""
        compute = self.f(stage) + self.b(stage)
        return (self.d2h(stage) + self.h2d(stage)) / compute if compute else float("inf")

    def copy_time_for(self, k: float, stage: int = 0) -> float:
        """The one-way copy time per activation unit that makes ``offload_ratio(stage) == k`` (inf or nan
        where the times are too large: callers that know which inputs they came from say so)."""
        return k * (self.f(stage) + self.b(stage)) / 2 / max(self.act(stage), 1e-300)

    def with_offload_ratio(self, k: float, stage: int = 0) -> CostModel:
        """Set symmetric D2H/H2D times so that ``offload_ratio(stage) == k``."""
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ConfigError(f"offload ratio k={k!r}: must be a number >= 0 (e.g. 0.5; 0 means instant copies)")
        if k < 0:
            raise ConfigError(f"offload ratio k={k!r}: must be >= 0 (0 means instant copies)")
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
            raise ConfigError(f"stage={stage!r}: must be a stage index, an integer >= 0")
        try:
            one_way = self.copy_time_for(k, stage)
        except IndexError:  # a per-stage tuple shorter than the index
            raise ConfigError(f"stage={stage}: the cost model's per-stage times hold fewer stages; give a stage "
                              "it has (0 is the first)") from None
        return replace(self, d2h_time=one_way, h2d_time=one_way)

    def check_stages(self, num_stages: int) -> None:
        for name in ("time_f", "time_i", "time_w", "time_b", "time_r", "activation",
                     "partial_recompute_saving", "partial_recompute_time", "stage_w_fraction"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != num_stages:
                raise ConfigError(
                    f"{name} has {len(value)} per-stage values but the schedule has {num_stages} stages"
                )

    @classmethod
    def uniform(
        cls, f: float = 1.0, i: float = 1.0, w: float = 1.0, p2p: float = 0.0, **kwargs: object
    ) -> CostModel:
        return cls(time_f=f, time_i=i, time_w=w, p2p_time=p2p, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def per_stage(
        cls, f: Sequence[float], i: Sequence[float], w: Sequence[float], **kwargs: object
    ) -> CostModel:
        return cls(time_f=tuple(f), time_i=tuple(i), time_w=tuple(w), **kwargs)  # type: ignore[arg-type]


# ---- files: the profiler's output or a hand-written cost model ------------------------------------
COSTS_FORMAT = "pipeoffload-costs/1"
_FIELDS = ("time_f", "time_i", "time_w", "time_b", "time_r", "activation", "w_fraction", "stage_w_fraction",
           "activation_bytes", "p2p_time", "d2h_time", "h2d_time", "shared_copy_engine", "shared_host_link",
           "partial_recompute_saving", "partial_recompute_time", "action_overhead", "message_time", "cores",
           "message_cpu", "other_load")
_UNSET = {"message_cpu": 0.0, "other_load": 0.0}  # written only when set: files of cost models without them stay as they were
# not a cost-file key: ``simulate`` does not apply it (``profiling.contended_costs`` does, for one schedule),
# so a file that carried it would promise what `pipeoffload simulate --costs` does not do
_IN_MEMORY_ONLY = ("concurrency_slowdown",)


# every number a cost model holds (scalars or per-stage tuples)
_NUMBERS = ("time_f", "time_i", "time_w", "time_b", "time_r", "activation", "w_fraction", "activation_bytes",
            "p2p_time", "d2h_time", "h2d_time", "partial_recompute_saving", "partial_recompute_time",
            "stage_w_fraction", "action_overhead", "message_time", "concurrency_slowdown", "cores", "message_cpu",
            "other_load")


def cost_model_to_dict(costs: CostModel) -> dict:
    out: dict[str, object] = {"format": COSTS_FORMAT}
    for name in _FIELDS:
        value = getattr(costs, name)
        if value is not None and (name not in _UNSET or value != _UNSET[name]):
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def cost_model_from_dict(data: dict, where: str = "cost file") -> CostModel:
    """A ``CostModel`` from a mapping of its fields (scalars or per-stage lists); ``w_fraction`` may be
    a per-stage list too. Unknown keys are refused with the list of valid ones."""
    data = _fields_of(data, where)
    fmt = data.pop("format", COSTS_FORMAT)
    for note in ("device", "source", "comment", "time_unit"):  # descriptive keys (see cost_file_time_unit)
        data.pop(note, None)
    if fmt != COSTS_FORMAT:
        raise ConfigError(f"{where}: format {fmt!r}, expected {COSTS_FORMAT!r}")
    unknown = sorted(set(data) - set(_FIELDS))
    if set(unknown) & set(_IN_MEMORY_ONLY):
        raise ConfigError(f"{where}: {', '.join(sorted(set(unknown) & set(_IN_MEMORY_ONLY)))} is not applied by "
                          "simulate; apply it with profiling.contended_costs and remove it from the file")
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(_FIELDS)}")
    values: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, list):
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
                raise ConfigError(f"{where}: {key} = {value!r}: expected numbers")
            value = tuple(float(x) for x in value)
        values[key] = value
    wf = values.get("w_fraction")
    if isinstance(wf, tuple):  # per stage: the scalar is the conservative maximum
        values["stage_w_fraction"], values["w_fraction"] = wf, max(wf, default=1.0)
    try:
        return CostModel(**values)  # type: ignore[arg-type]
    except (TypeError, ConfigError) as err:
        raise ConfigError(f"{where}: {err}") from None


TIME_UNIT_KEY = "time_unit"


def _fields_of(data: dict, where: str) -> dict:
    """The mapping of CostModel fields: ``data`` itself, or its ``costs`` table."""
    fields = data.get("costs", data)
    if not isinstance(fields, dict):
        raise ConfigError(f"{where}: costs = {fields!r}: expected a table of CostModel fields")
    return dict(fields)


def cost_file_time_unit(data: dict, where: str = "cost file") -> str:
    """The time unit of a cost file's numbers: its ``time_unit`` ("s" or "t"); without one, "s" for the
    profiler's files (they name their ``device``: measured seconds) and "t" for hand-written ones."""
    data = _fields_of(data, where)
    unit = data.get(TIME_UNIT_KEY, "s" if "device" in data else "t")
    if unit not in ("s", "t"):
        raise ConfigError(f"{where}: time_unit {unit!r}: use \"s\" (seconds) or \"t\" (the CLI's unit)")
    return str(unit)


def load_cost_model(path: str) -> CostModel:
    """Read a cost model from JSON (``.json``) or TOML (anything else)."""
    return load_cost_file(path)[0]


def load_cost_file(path: str) -> tuple[CostModel, str]:
    """A cost file's model and the time unit of its numbers (``cost_file_time_unit``). An error names the
    file as the request's ``costs_file`` (the command line: ``--costs``)."""
    where = "costs file"  # the reader's messages start with it: replaced by the field (the flag) and the path
    try:
        return _read_cost_file(path, where)
    except ConfigError as err:
        why = str(err).removeprefix(f"{where}: ")
        raise ConfigError.named(lambda n: f"{n.given('costs_file', repr(path))}: {why}") from None


def _read_cost_file(path: str, where: str) -> tuple[CostModel, str]:
    import json

    import tomllib

    from pipeoffload.fileio import read_input_text

    try:
        text = read_input_text(path)
        data = json.loads(text) if str(path).endswith(".json") else tomllib.loads(text)
    except (OSError, ValueError) as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ConfigError(f"{where}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object of CostModel fields")
    costs, unit = cost_model_from_dict(data, where=where), cost_file_time_unit(data, where)
    stages = max((len(v) for v in (costs.time_f, costs.time_i, costs.time_w, costs.time_b) if isinstance(v, tuple)),
                 default=1)
    if all(costs.f(s) + costs.b(s) <= 0 for s in range(stages)):
        raise ConfigError(f"{where}: every compute time (time_f, time_i, time_w, time_b) is 0; "
                          "at least one must be positive")
    return costs, unit


def require_costs(value: object, who: str) -> None:
    """Refuse (one ``ConfigError`` line) ``costs`` that are neither a ``CostModel`` nor None."""
    if value is not None and not isinstance(value, CostModel):
        raise ConfigError(f"{who}: costs={value!r} must be a CostModel (e.g. CostModel.uniform(1.0, 1.0, 1.0)) "
                          "or None for unit costs")
