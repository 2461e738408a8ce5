"""Simulate one schedule: a typed request (family, sizes, costs, memory policies) and its result.

The CLI's ``simulate`` flags, the playground's query parameters and this request's fields carry the
same names (``--offload-ratio`` is ``offload_ratio``), and the same checks (``service.checks``) refuse
the same values.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from pipeoffload.costs import CostModel, load_cost_file
from pipeoffload.errors import FIELDS, ConfigError, Naming, flag_of, renaming
from pipeoffload.fileio import read_input_text
from pipeoffload.ir import ActionKind, Schedule, expand_overlaps, has_torch_cells
from pipeoffload.passes.lower import lower_with_report
from pipeoffload.passes.offload import OffloadReport
from pipeoffload.planner.formulas import formula1_k
from pipeoffload.policies import OFFLOAD_FORMS, RECOMPUTE_FORMS, OffloadPolicy, RecomputePolicy
from pipeoffload.schedules import MAX_ACTIONS, check_options, estimated_work, generate, get_spec
from pipeoffload.service.argtypes import default_of
from pipeoffload.service.checks import (
    boolean,
    check_work,
    checked,
    finite_at_least,
    int_at_least,
    offload_work_factor,
    one_of,
)
from pipeoffload.simulator import Timeline
from pipeoffload.simulator import simulate as simulate_timeline
from pipeoffload.units import TIME_UNIT, rank_costs, time_unit_help, units_dict
from pipeoffload.viz.chartdata import schedule_title

BACKWARDS = ("split", "full")
# The default offload ratio, so that offloading is never free unless asked for: the paper's Formula 1
# for a Llama-3-8B-like layer (hidden 4096, sequence 8192) on an A100 with the reference
# implementation's profiled constants (220 TFLOP/s, 15 GB/s host link), which `pipeoffload k --model
# llama3-8b` prints too. k > 1: one copy engine cannot hide every copy, as is typical for small hidden sizes.
DEFAULT_OFFLOAD_RATIO = round(formula1_k(4096, 8192, 220e12, 15e9), 2)  # 1.49
K_DEFAULT_HELP = (f"default {DEFAULT_OFFLOAD_RATIO}: Formula 1 for a Llama-3-8B-like layer (h=4096, s=8192) "
                  "on an A100 (220 TFLOP/s, 15 GB/s); a costs file's own copy times when one is given")
SIZE_FIELDS = ("family", "ranks", "microbatches", "stages_per_rank", "schedule_file")
SCHEDULE_SUFFIXES = (".json", ".txt", ".csv")  # the forms `pipeoffload show --format` writes
COST_FIELDS = ("time_f", "time_i", "time_w", "p2p_time")  # what a costs file gives instead (per stage)
# A schedule generator's refusals as this request (its fields, the playground's query parameters) and the
# flags of simulate, compare and show name what they set: the one mapping of these surfaces.
SCHEDULE_NAMES = {"num_ranks": "ranks", "num_microbatches": "microbatches"}
FAMILY_OPTIONS = ("group_size", "backward")  # the generator options a request (and a flag) sets


def costs_file_time_help(naming: Naming = FIELDS) -> str:
    """The units note of a run whose costs come from a file in the unit t: its times are per stage, not the
    request's per-rank times, so "one rank's forward of one microbatch (time_f=1)" would not be true."""
    times = "--time-f/-i/-w" if naming.flags else "the request's time_f, time_i and time_w"
    return ("t: the costs file's time unit; its time_f, time_i and time_w are per stage (one microbatch through "
            f"one stage), not per rank as {times} are")


@dataclass(frozen=True)
class SimulateRequest:
    """One simulation. Costs are per rank and microbatch (all of a rank's layers, split evenly over its
    stages) in the time unit t, unless ``costs_file`` gives a cost model: its ``CostModel`` fields are
    per stage (``time_f`` is one microbatch's forward through one stage), so with v stages per rank a
    file's ``time_f`` 1 is the flags' ``time_f`` v; the four times are then left at their defaults.
    ``offload_ratio`` is the paper's k = (D2H + H2D time of one activation) / (F + I + W time); 0 means
    instant copies; None means ``DEFAULT_OFFLOAD_RATIO`` (or a costs file's own copy times).
    ``plan_ratio`` plans the copies for another k than they then take (a host link faster or slower
    than planned); None plans them for the k they take. ``max_stall`` lets the offload plan make the
    step up to that many percent longer than without copies, for a lower peak. Field order is the order of
    ``pipeoffload simulate --help``. ``schedule_file`` simulates a schedule written as data instead of a
    family's (JSON, text or CSV, as ``pipeoffload show --format`` writes them): the file sets the ranks,
    microbatches, stages per rank and placement, so ``family`` is then left empty."""

    family: str = ""
    ranks: int = 4
    microbatches: int | None = None  # None: 2 * ranks
    stages_per_rank: int | None = None  # None: the family's default
    time_f: float = 1.0
    time_i: float = 1.0
    time_w: float = 1.0
    p2p_time: float = 0.0
    costs_file: str | None = None
    group_size: int | None = None
    backward: str | None = None  # group-interleaved: "split" (I and W) or "full" (one B)
    offload: str = "none"
    recompute: str = "none"
    offload_ratio: float | None = None  # None: DEFAULT_OFFLOAD_RATIO, or the costs file's copy times
    plan_ratio: float | None = None  # None: the copies are planned for the k they take
    max_stall: float = 0.0  # percent of the step without copies the offload plan may add for a lower peak
    shared_host_link: bool = False
    separate_copy_engines: bool = False
    schedule_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.family, str):
            raise ConfigError(f"family={self.family!r}: give a schedule family's name, e.g. 1f1b")
        if self.schedule_file is not None:
            self._check_schedule_file()
        elif not self.family.strip():
            raise ConfigError("family is missing: choose a schedule family, e.g. 1f1b (or give schedule_file)")
        # the checked value is kept: text a front end passes ("8", "0.5") is stored as the number it reads as
        for name in ("ranks", "microbatches", "stages_per_rank", "group_size"):
            if name == "ranks" or getattr(self, name) is not None:
                object.__setattr__(self, name, checked(name, int_at_least, getattr(self, name)))
        for name in ("time_f", "time_i", "time_w", "p2p_time", "offload_ratio", "plan_ratio", "max_stall"):
            if getattr(self, name) is not None:  # + 0.0: -0.0 is 0, never "k=-0"
                object.__setattr__(self, name, checked(name, finite_at_least, getattr(self, name)) + 0.0)
        for name in ("shared_host_link", "separate_copy_engines"):
            checked(name, boolean, getattr(self, name))
        for name, forms in (("offload", OFFLOAD_FORMS), ("recompute", RECOMPUTE_FORMS)):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={getattr(self, name)!r}: a policy is text, one of {forms}")
        given = [f"{name}={getattr(self, name):g}" for name in COST_FIELDS
                 if getattr(self, name) != default_of(SimulateRequest, name)]
        if self.costs_file and given:
            raise ConfigError(f"costs_file {self.costs_file!r} gives the costs, so {', '.join(given)} cannot be "
                              "combined with it (the file's times are per stage, these per rank): put the times "
                              "in the file or leave the costs file out")
        if self.backward is not None:
            checked("backward", one_of, self.backward, BACKWARDS)
        if OffloadPolicy.parse(self.offload).kind == "none" and self.plan_ratio is not None:
            raise ConfigError.named(lambda n: (
                f"{n.given('plan_ratio', f'{self.plan_ratio:g}')} plans offload copies, but "
                f"{n('offload')} is none: choose an offload policy (e.g. {n.given('offload', 'all')}) "
                f"or leave {n('plan_ratio')} out"))
        if self.plan_ratio is not None and self.max_stall > 0:
            raise ConfigError.named(lambda n: (
                f"{n.given('plan_ratio', f'{self.plan_ratio:g}')} with {n.given('max_stall', f'{self.max_stall:g}')}: "
                "a stall budget plans the copies for faster links itself and judges them at the k they take; "
                "use one of the two"))
        self.offload_policy()
        RecomputePolicy.parse(self.recompute)
        if self.schedule_file is None:
            # the family's name and options (``generate``'s own check); its sizes are checked when it is generated
            with renaming(SCHEDULE_NAMES):
                check_options(get_spec(self.family), {"group_size": self.group_size, "backward": self.backward},
                              settable=FAMILY_OPTIONS)

    def _check_schedule_file(self) -> None:
        """A schedule file replaces the family and everything a family's generator takes."""
        path = self.schedule_file
        if not isinstance(path, str) or not path.lower().endswith(SCHEDULE_SUFFIXES):
            raise ConfigError(f"schedule file {path!r}: name a schedule file ending in "
                              f"{', '.join(SCHEDULE_SUFFIXES)} (as `pipeoffload show --format json|text|csv` writes)")
        if self.family.strip():
            raise ConfigError(f"family={self.family!r} and schedule file {path!r}: the file is the schedule; "
                              "give one of the two")
        fixed = [name for name in ("microbatches", "stages_per_rank", "group_size", "backward")
                 if getattr(self, name) is not None]
        if fixed:
            raise ConfigError.named(lambda n: f"{', '.join(n(name) for name in fixed)} with schedule file {path!r}: "
                                    "the file sets the sizes and the order; leave them out or edit the file")

    def offload_policy(self) -> OffloadPolicy:
        """The offload policy with its stall budget (``max_stall``)."""
        return replace(OffloadPolicy.parse(self.offload), max_stall=self.max_stall)

    @property
    def k(self) -> float | None:
        """The offload ratio the simulation uses: the one asked for, else the default (None: a costs
        file's own copy times)."""
        if self.offload_ratio is not None:
            return self.offload_ratio
        return None if self.costs_file else DEFAULT_OFFLOAD_RATIO

    @property
    def planned_k(self) -> float | None:
        """The offload ratio the copies are planned for: ``plan_ratio``, else the one they take."""
        return self.plan_ratio if self.plan_ratio is not None else self.k

    @property
    def num_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.ranks

    def sizes(self) -> tuple[int, int, int]:
        """(ranks, microbatches, stages per rank) with the defaults filled in (the family's v)."""
        v = self.stages_per_rank or get_spec(self.family).default_stages_per_rank()
        return self.ranks, self.num_microbatches, v

    def options(self) -> list[tuple[str, Any]]:
        """(flag name, value) of every option that differs from its default, sizes excluded."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in SIZE_FIELDS and value != f.default:
                out.append((flag_of(f.name).removeprefix("--"), value))
        return out

    def command(self) -> list[str]:
        """The ``pipeoffload simulate`` command line that makes the same request."""
        argv = ["pipeoffload", "simulate", self.schedule_file or self.family]
        for name in ("ranks", "microbatches", "stages_per_rank"):
            value = getattr(self, name)
            if value is not None and value != default_of(SimulateRequest, name):
                argv += ["--" + name.replace("_", "-"), str(value)]
        for flag, value in self.options():
            argv += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
        return argv


@dataclass(frozen=True)
class SimulateResult:
    """What ``run(SimulateRequest(...))`` gives: the ``Timeline`` (times, bubbles, memory per rank), the offload
    pass's ``OffloadReport`` and the time unit (``t``, or ``s`` for a costs file in seconds); ``as_dict`` is
    ``simulate --json``'s object, ``label`` the row name ``compare`` and ``--report`` use."""

    request: SimulateRequest
    timeline: Timeline
    report: OffloadReport
    time_unit: str  # "t", or "s" for a cost file in measured seconds

    def label(self) -> str:
        """Schedule, resolved sizes, then every option that differs from its default, e.g.
        ``group-interleaved d=8 m=32 v=2 · group-size 4 · offload all``: no two different runs share one."""
        return join_label(*self.label_parts())

    def title(self) -> str:
        """The chart header: schedule and sizes, the offload ratio k the copies took (a costs file's
        own), and an offload budget the plan could not meet."""
        text = schedule_title(self.timeline) + ", " + ratio_text(self.request, self.planned_k, self.file_k())
        note = self.budget_note()
        return text + (f", {note}" if note else "")

    def budget_note(self) -> str | None:
        """``offload budget 1 NOT met (planned peak 4)`` where the plan could not meet the policy's budget
        (activation units), else None: what ``compare`` names a row by."""
        if self.report.budget_met is not False:
            return None
        return f"offload budget {self.report.budget:g} NOT met (planned peak {self.report.peak_after:g})"

    def file_k(self) -> str | None:
        """A costs file's own offload ratio k, e.g. ``0.5`` (``0.4 to 0.6`` where its stages differ); None
        without a costs file or where the request sets k."""
        return costs_k(self.timeline) if self.request.k is None else None

    def time_help(self, naming: Naming = FIELDS) -> str:
        """The note on what one time unit is (``costs_file_time_help`` for a costs file in t), naming the
        request's fields (``naming``: ``FLAGS`` for the command line's words)."""
        if self.request.costs_file and self.time_unit == TIME_UNIT:
            return costs_file_time_help(naming)
        return time_unit_help(self.time_unit, naming)

    @property
    def planned_k(self) -> float | None:
        """The offload ratio the copies were planned for: ``request.planned_k``, times the copy-time
        factor of a stall budget's plan (None: a costs file's own copy times)."""
        k = self.request.planned_k
        return None if k is None else k * self.report.copy_time_factor

    def label_parts(self) -> tuple[list[str], list[str]]:
        """(schedule name and resolved sizes, every non-default option), e.g. (["zb-v", "d=8", "m=16",
        "v=2"], ["offload all"]): what ``label`` joins, and what ``compare`` drops when every row shares it.
        A schedule file is named by its path: the name inside it may be a family's (``show --format json``
        writes it), and an edited file is not that family."""
        s = self.timeline.schedule
        sizes = [self.request.schedule_file or s.name, f"d={s.num_ranks}", f"m={s.num_microbatches}",
                 f"v={s.stages_per_rank}"]
        return sizes, [flag if value is True else f"{flag} {_typed(value)}" for flag, value in self.request.options()]


    def as_dict(self, naming: Naming = FIELDS) -> dict[str, Any]:
        """The object the playground serves and ``simulate --json`` prints (``naming``: ``FLAGS``): the
        timeline's numbers, their units, the policy report."""
        out = self.timeline.as_dict()
        v = max(self.timeline.schedule.stages_per_rank, 1)
        out["peak_host_rank_units"] = self.timeline.peak_host_rank_units  # peak_host_units: activation units
        for rank in out["per_rank"]:
            rank["peak_host_rank_units"] = rank["peak_host_units"] / v
        out["offload_ratio"] = self.request.k  # null: the costs file's own copy times
        out["planned_offload_ratio"] = self.planned_k  # what the copies were planned for
        out["offload_report"] = report_dict(self.report)
        out["units"] = units_dict(self.time_unit, naming) | {"time": self.time_help(naming)}
        return out


def _typed(value: object) -> str:
    """An option's value as it would be typed: ``5`` for 5.0, ``0.5``, every digit of ``0.123456789``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def costs_k(timeline: Timeline) -> str:
    """The offload ratio k of the timeline's cost model, ``0.5``, or ``0.4 to 0.6`` where its stages differ."""
    ks = [timeline.costs.offload_ratio(stage) for stage in range(timeline.schedule.num_stages)] or [0.0]
    low, high = f"{min(ks):.3g}", f"{max(ks):.3g}"
    return low if low == high else f"{low} to {high}"


def ratio_text(req: SimulateRequest, planned: float | None = None, file_k: str | None = None) -> str:
    """``offload ratio k=0.5``, ``copy times from the costs file (k=0.5)`` (``file_k``: the file's k), and
    what the copies were planned for when that differs (``offload ratio k=0.5, copies planned for k=1``;
    ``planned``: the result's, else the request's), and the stall budget if any."""
    if req.k is None:
        text = "copy times from the costs file" + (f" (k={file_k})" if file_k is not None else "")
    else:
        text = f"offload ratio k={req.k:g}"
    planned = req.plan_ratio if planned is None else planned
    if planned is not None and planned != req.k:
        text += f", copies planned for k={planned:.3g}"
    if req.max_stall > 0:
        text += f", stall budget {req.max_stall:g} %"
    return text


def join_label(sizes: list[str], options: list[str]) -> str:
    """``"zb-v d=8 m=16 v=2 · offload all"``: sizes with spaces, then the options with dots."""
    return " · ".join([" ".join(sizes), *options] if sizes else options)


def report_dict(report: OffloadReport) -> dict[str, Any]:
    return {
        "policy": str(report.policy),
        "recompute": str(report.recompute),
        "recomputed": len(report.recomputed),
        "unhidden": len(report.unhidden),
        "offloaded_after_i": report.offloaded_after_i,  # the second window (I -> W)
        "unhidden_after_i": len(report.unhidden_after_i),
        "kept_until_i": report.kept_until_i,  # first windows left on the device, their I -> W window offloaded
        "offloaded_units_by_window": list(report.units_by_window),
        # null without an offload plan (no offload policy): the timeline's peaks are the real ones
        "planned_peak_before": report.peak_before if report.per_rank else None,
        "planned_peak_after": report.peak_after if report.per_rank else None,
        "budget": report.budget,
        "budget_met": report.budget_met,
        "max_stall": report.policy.max_stall,  # percent of the step without copies the plan may add
        "copy_time_factor": report.copy_time_factor,  # below 1: planned for faster copies (under max_stall)
    }


def base_costs(req: SimulateRequest, stages_per_rank: int) -> tuple[CostModel, str]:
    """The cost model before memory options, and the unit of its times."""
    if req.costs_file:
        return load_cost_file(req.costs_file)
    if req.time_f + req.time_i + req.time_w <= 0:
        raise ConfigError.named(lambda n: f"{_times(n, req)} is 0: at least one compute time must be positive")
    return rank_costs(req.time_f, req.time_i, req.time_w, stages_per_rank, req.p2p_time), TIME_UNIT


def memory_costs(req: SimulateRequest, costs: CostModel, planned: bool = False) -> CostModel:
    """Apply the host-link options, the offload ratio (the one the copies are planned for, with
    ``planned``) and partial recomputation to ``costs``."""
    costs = replace(costs, shared_host_link=req.shared_host_link or costs.shared_host_link,
                    shared_copy_engine=costs.shared_copy_engine and not req.separate_copy_engines)
    k = req.planned_k if planned else req.k
    if k is not None:
        check_copy_time(req, costs, k, planned)
        costs = costs.with_offload_ratio(k)
    return RecomputePolicy.parse(req.recompute).apply_to(costs)


def check_copy_time(req: SimulateRequest, costs: CostModel, k: float, planned: bool) -> None:
    """Refuse, naming the options it comes from, a copy time at offload ratio ``k`` that is not a finite
    number: the cost model would name its own field (``d2h_time=inf``), which no one gave."""
    if math.isfinite(costs.copy_time_for(k)):
        return
    if not math.isfinite(costs.f(0) + costs.b(0)):
        raise ConfigError.named(lambda n: f"{_times(n, req)} overflows (inf): the times are too large to add up; "
                                "give them in a larger time unit (smaller numbers)")
    raise ConfigError.named(lambda n: f"{_ratio(n, req, k, planned)} times {_times(n, req)} overflows: the copy "
                            "time would be inf; give a smaller offload ratio or the times in a larger time unit "
                            "(smaller numbers)")


def _times(n: Naming, req: SimulateRequest) -> str:
    """The request's compute times in a message: ``time_f + time_i + time_w`` (flags: ``--time-f + ...``)."""
    if req.costs_file:
        return "the costs file's F + I + W time"
    return " + ".join(n(field) for field in ("time_f", "time_i", "time_w"))


def _ratio(n: Naming, req: SimulateRequest, k: float, planned: bool) -> str:
    """The offload ratio ``k`` in a message: the field that set it (``offload_ratio=2``), or the default."""
    if planned and req.plan_ratio is not None:
        return n.given("plan_ratio", f"{k:g}")
    if req.offload_ratio is not None:
        return n.given("offload_ratio", f"{k:g}")
    return f"the default offload ratio {k:g}"


def check_size(req: SimulateRequest, limit: int = MAX_ACTIONS) -> None:
    """Refuse before any work what would take long: the schedule's actions and per-stage work (as
    ``generate`` counts them) times what planning its offload adds (``checks.offload_work_factor``). Checked
    here without offload too: ``generate``'s own refusal names ``max_actions``, which no flag sets."""
    ranks, m, v = req.sizes()
    factor = offload_work_factor(req.offload, req.planned_k, req.shared_host_link, req.max_stall)
    what = f"{req.family} with ranks={ranks}, microbatches={m}, stages per rank={v}"
    if factor > 1:
        what += (f", offload {req.offload}, "
                 f"k={'from the costs file' if req.planned_k is None else f'{req.planned_k:g}'}")
    check_work(estimated_work(get_spec(req.family), ranks, m, v), factor, limit, what)


def load_schedule_file(req: SimulateRequest, limit: int = MAX_ACTIONS) -> Schedule:
    """The schedule of ``req.schedule_file`` (JSON, one line per rank of text, or the CSV form, by its
    suffix, as ``Schedule.to_json``/``to_text``/``to_csv`` write them; a CSV may also be torch's, its
    overlapped F&B cells read as F then B), checked for size as a generated one is; a ``ranks`` other than
    the default must be the file's."""
    path = str(req.schedule_file)
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"schedule file {path!r}: cannot read it ({exc.__class__.__name__}: "
                          f"{getattr(exc, 'strerror', None) or exc}); give the path of a schedule file") from exc
    name = os.path.splitext(os.path.basename(path))[0]
    suffix = path.lower().rsplit(".", 1)[-1]
    try:
        if suffix == "json":
            schedule = Schedule.from_json(text)
        elif suffix == "txt":
            schedule = Schedule.from_text(text, name=name)
        else:  # ours, or torch.distributed.pipelining's (overlapped F&B cells), told apart by its cells
            schedule = Schedule.from_csv(expand_overlaps(text) if has_torch_cells(text) else text, name=name)
    except ValueError as exc:  # ConfigError too: the loaders' one line, with the file named
        raise ConfigError(f"schedule file {path!r}: {exc}".split("\n")[0]) from exc
    if req.ranks not in (default_of(SimulateRequest, "ranks"), schedule.num_ranks):
        raise ConfigError.named(lambda n: f"{n.given('ranks', req.ranks)} but schedule file {path!r} has "
                                f"{schedule.num_ranks} ranks: the file sets them; leave {n('ranks')} out")
    _check_hand_placed(req, schedule, path)
    factor = offload_work_factor(req.offload, req.planned_k, req.shared_host_link, req.max_stall)
    check_work(sum(len(row) for row in schedule.actions), factor, limit, f"schedule file {path!r}")
    return schedule


HAND_PLACED = frozenset({ActionKind.OFFLOAD, ActionKind.RELOAD, ActionKind.R})  # what ``lower`` keeps or refuses


def _check_hand_placed(req: SimulateRequest, schedule: Schedule, path: str) -> None:
    """A file that places its own copies or recomputation is simulated as written, with no policy: ``lower``'s
    refusal named the Python call's arguments (``pass offload='none'``) to a command-line user."""
    policies = [name for name in ("offload", "recompute") if getattr(req, name) != default_of(SimulateRequest, name)]
    if policies and not HAND_PLACED.isdisjoint(schedule.kinds()):
        raise ConfigError.named(lambda n: f"{', '.join(n.given(p, getattr(req, p)) for p in policies)} with schedule "
                                f"file {path!r}, which places its own OFFLOAD/RELOAD/R actions: leave "
                                f"{' and '.join(n(p) for p in policies)} out to simulate them as written, or remove "
                                "them from the file")


def simulate(req: SimulateRequest) -> SimulateResult:
    """Generate (or read from ``req.schedule_file``), lower (offload, recompute, communication) and simulate
    the requested schedule (its copies planned for ``req.planned_k``, simulated at ``req.k``)."""
    if req.schedule_file is not None:
        generated = load_schedule_file(req)
    else:
        check_size(req)
        with renaming(SCHEDULE_NAMES):
            generated = generate(req.family, req.ranks, req.num_microbatches, req.stages_per_rank,
                                 group_size=req.group_size, backward=req.backward)
    base, unit = base_costs(req, generated.stages_per_rank)
    costs = memory_costs(req, base)
    planned = costs if req.plan_ratio is None else memory_costs(req, base, planned=True)
    schedule, report = lower_with_report(generated, planned, offload=req.offload_policy(),
                                         recompute=RecomputePolicy.parse(req.recompute))
    timeline = simulate_timeline(schedule, costs)
    if not math.isfinite(timeline.makespan):  # finite times whose sum overflows (e.g. --time-f 1e308)
        raise ConfigError(f"the step time overflows ({timeline.makespan}): the times are too large to add up; "
                          "give them in a larger time unit (smaller numbers)")
    return SimulateResult(req, timeline, report, unit)
