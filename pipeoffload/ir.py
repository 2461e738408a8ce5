"""The schedule IR: actions, per-rank action lists, and their text/JSON/CSV forms.

Glossary (used everywhere in the package):
  rank             one process of the pipeline group, 0..num_ranks-1
  stage            a contiguous slice of the model's layers, global index 0..num_stages-1
  stages_per_rank  the virtual-pipeline degree v
  placement        the stage -> rank map (loop, v, or custom)
  microbatch       index 0..num_microbatches-1
  action           (kind, stage, microbatch); text form ``{stage}{KIND}{microbatch}``, e.g. ``2F0``,
                   ``3WAIT5`` (the compute lane waits until the OFFLOAD of stage 3, microbatch 5 is done)
  step             a position in one rank's action list

Comm actions follow ``torch.distributed.pipelining``: ``SEND_F`` is posted by the stage that
produced the activation, ``RECV_F`` by the stage that consumes it; ``SEND_B`` by the stage that
produced the input gradient, ``RECV_B`` by the stage that consumes it.
"""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import chain, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement

if TYPE_CHECKING:  # pragma: no cover
    from pipeoffload.semantics import CodedSchedule


class ActionKind(str, Enum):
    """What an ``Action`` does; its value is the text form's KIND (``2F0``, ``0OFFLOAD5``)."""

    F = "F"  # forward
    B = "B"  # full backward (input and weight gradients)
    I = "I"  # noqa: E741  backward for input gradients only
    W = "W"  # backward for weight gradients only
    R = "R"  # recompute the forward of a stage whose activations were dropped
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    OFFLOAD = "OFFLOAD"  # start the device->host copy of one (stage, microbatch) activation
    RELOAD = "RELOAD"  # allocate and start the host->device copy back
    # the second offload window, between I and W: the part of the activation W still needs
    OFFLOAD_W = "OFFLOAD_W"  # start the device->host copy of what W needs, after I
    RELOAD_W = "RELOAD_W"  # allocate and start its copy back, before W
    # the compute lane waits until the OFFLOAD of (stage, microbatch) has completed: it throttles the
    # forwards after it to the speed of the host link (zero duration, no memory effect of its own)
    WAIT = "WAIT"

    def __str__(self) -> str:
        return self.value


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W, ActionKind.R})
COMM_KINDS = frozenset({ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B})
COPY_KINDS = frozenset({ActionKind.OFFLOAD, ActionKind.RELOAD, ActionKind.OFFLOAD_W, ActionKind.RELOAD_W})
OFFLOAD_KINDS = frozenset({ActionKind.OFFLOAD, ActionKind.OFFLOAD_W})  # device -> host, one per window
WAIT_KINDS = frozenset({ActionKind.WAIT})  # the compute lane waits for a copy: placed by lowering, like copies

# Longest names first so that "SEND_F" is not read as "S" + ...; torch's UNSHARD/RESHARD/REDUCE_GRAD
# are no actions of ours (``expand_overlaps`` drops them from torch's CSVs).
# Above this many actions ``from_text``/``from_json``/``from_csv`` refuse a schedule before parsing it:
# the lowered form of generate's largest schedule (schedules.MAX_ACTIONS compute actions) has about
# five actions per compute action once comms, copies and waits are in; parsing takes ~2 s per million.
MAX_FILE_ACTIONS = 10_000_000
_KIND_NAMES = sorted((k.value for k in ActionKind), key=len, reverse=True)
_ACTION_RE = re.compile(r"^(\d+)(" + "|".join(_KIND_NAMES) + r")(\d+)$")


class Action(NamedTuple):
    """One thing a rank does: ``kind`` applied to ``(stage, microbatch)``.

    An immutable value ordered and hashed as the tuple ``(kind, stage, microbatch)``. A named tuple,
    not a dataclass: lowering creates 10^5 actions, and a tuple is built in C (``tuple.__new__``)
    in about half the time a frozen dataclass's ``__init__`` takes.
    """

    kind: ActionKind
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @classmethod
    def parse(cls, text: str) -> Action:
        """The action ``text`` writes, or one ``ConfigError`` line (a ``ValueError``) saying the form."""
        match = _ACTION_RE.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            upper = text.strip().upper() if isinstance(text, str) else ""
            hint = f" (did you mean {upper!r}?)" if upper and upper != text.strip() and _ACTION_RE.match(upper) else ""
            raise ConfigError(
                f"cannot parse action {text!r}{hint}: expected {{stage}}{{KIND}}{{microbatch}} such as '2F0' "
                f"with KIND one of {', '.join(k.value for k in ActionKind)}"
            )
        return cls(ActionKind(match.group(2)), int(match.group(1)), int(match.group(3)))


_kind_of = attrgetter("kind")


def make_actions(kinds: Iterable[ActionKind], stages: Iterable[int], microbatches: Iterable[int]) -> Iterator[Action]:
    """Actions from parallel sequences, each built by ``tuple.__new__`` in C (no Python frame per
    action, unlike ``Action(...)``): for passes that create 10^5 of them at once."""
    return map(tuple.__new__, repeat(Action), zip(kinds, stages, microbatches))  # type: ignore[arg-type]


def act(kind: ActionKind | str, stage: int, microbatch: int) -> Action:
    """Shorthand used by generators: ``act("F", 2, 0)`` is ``2F0``."""
    return Action(ActionKind(kind), stage, microbatch)


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists plus the sizes and placement they refer to.

    A Schedule is plain immutable data: nothing in it refers to a module, tensor or process group.

    ``coded``: the integer-coded form of ``actions`` when whoever built the schedule already had it
    (``add_comms`` builds it by insertion, ``lower`` keeps its validation's), so that validating and
    simulating the schedule do not build it again (``semantics.coded``). Not part of the value:
    equality, hashing, ``repr``, pickling and the text forms leave it out.
    """

    actions: tuple[tuple[Action, ...], ...]
    placement: Placement
    num_microbatches: int
    name: str = ""
    coded: CodedSchedule | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.actions) != self.placement.num_ranks:
            raise ConfigError(
                f"schedule has {len(self.actions)} rank lists but placement has {self.placement.num_ranks} ranks"
            )

    def __hash__(self) -> int:
        """From the shape (placement, sizes, name, list lengths): O(ranks), not O(actions), so a cache
        keyed by schedules (``_perf.Memo``) looks one up cheaply. Equal schedules have equal shapes;
        a dict compares the actions of two schedules only when their shapes match."""
        return hash((self.placement, self.num_microbatches, self.name, tuple(map(len, self.actions))))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without ``coded`` (derived data, as large as the actions): the receiver rebuilds it."""
        return {**self.__dict__, "coded": None}

    @property
    def num_ranks(self) -> int:
        return self.placement.num_ranks

    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def stages_per_rank(self) -> int:
        return self.placement.stages_per_rank

    def __iter__(self) -> Iterator[tuple[Action, ...]]:
        return iter(self.actions)

    def __getitem__(self, rank: int) -> tuple[Action, ...]:
        return self.actions[rank]

    def num_actions(self) -> int:
        return sum(len(r) for r in self.actions)

    def with_actions(self, actions: Sequence[Sequence[Action]]) -> Schedule:
        return Schedule(tuple(tuple(r) for r in actions), self.placement, self.num_microbatches, self.name)

    def kinds(self) -> Iterator[ActionKind]:
        """Every action's kind, in rank then list order (a C-level scan: no Python frame per action)."""
        return map(_kind_of, chain.from_iterable(self.actions))

    def is_lowered(self) -> bool:
        return not COMM_KINDS.isdisjoint(self.kinds())

    def compute_only(self) -> Schedule:
        """Drop comm, copy and wait actions, leaving what a generator produces (``self`` if there are none)."""
        if COMPUTE_KINDS.issuperset(self.kinds()):
            return self
        return self.with_actions([[a for a in r if a.kind in COMPUTE_KINDS] for r in self.actions])

    # ---- text form: one line per rank, actions separated by spaces ---------------------------
    def to_text(self) -> str:
        return "".join(" ".join(str(a) for a in rank) + "\n" for rank in self.actions)

    @classmethod
    def from_text(cls, text: str, placement: Placement | None = None, name: str = "", *,
                  max_actions: int | None = MAX_FILE_ACTIONS) -> Schedule:
        """One line per rank (blank lines and ``#`` comments skipped); a mistake is one ``ConfigError``
        line naming the rank and step. ``max_actions``: refuse a larger text before parsing it (None: no limit)."""
        lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
        return cls._from_tokens([ln.split() for ln in lines if ln.strip()], placement, name, max_actions)

    @classmethod
    def from_rows(
        cls, rows: Sequence[Sequence[Action]], placement: Placement | None = None, name: str = ""
    ) -> Schedule:
        if not any(rows):
            raise ConfigError("the schedule has no actions: give one list of actions per rank, e.g. "
                              "'0F0 0B0' on rank 0's line")
        if placement is None:
            placement = infer_placement(rows)
        microbatches = 1 + max((a.microbatch for r in rows for a in r), default=-1)
        return cls(tuple(tuple(r) for r in rows), placement, microbatches, name)

    @classmethod
    def _from_tokens(cls, tokens: Sequence[Sequence[object]], placement: Placement | None, name: str,
                     max_actions: int | None) -> Schedule:
        return cls.from_rows(_parse_rows(tokens, max_actions), placement, name)

    # ---- JSON ------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "num_microbatches": self.num_microbatches,
                "placement": list(self.placement.stage_to_rank),
                "placement_kind": self.placement.kind,
                "actions": [[str(a) for a in r] for r in self.actions],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, *, max_actions: int | None = MAX_FILE_ACTIONS) -> Schedule:
        """The schedule ``to_json`` wrote: equal to it, its placement's kind included. A hand-written one
        with a field of the wrong type is one ``ConfigError`` line naming the field."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as err:  # json's own message says only "Expecting value: line 1 ..."
            raise ConfigError(f"schedule JSON that does not parse ({err}): give the text Schedule.to_json() "
                              "writes") from None
        missing = [k for k in _JSON_FIELDS if not isinstance(data, dict) or k not in data]
        if missing:
            unknown = sorted(set(data) - {*_JSON_FIELDS, "name", "placement_kind"}) if isinstance(data, dict) else []
            also = f" (it has {', '.join(map(repr, unknown))}: a misspelling?)" if unknown else ""
            raise ConfigError(f"schedule JSON without the field(s) {', '.join(missing)}{also}: give what "
                              f"Schedule.to_json() writes (an object with {', '.join(_JSON_FIELDS)} and a name)")
        _check_json_types(data)
        rows = _parse_rows(data["actions"], max_actions)
        ranks = len(rows)
        if max(data["placement"], default=0) >= ranks:
            raise ConfigError(f"schedule JSON: placement {data['placement']} puts stages on ranks up to "
                              f"{max(data['placement'])} but actions has {ranks} rank list(s): give one list per rank")
        kind = data.get("placement_kind")  # absent in hand-written JSON: recognised from the map
        placement = Placement(data["placement"], ranks, kind) if kind else Placement.custom(data["placement"], ranks)
        return cls(rows, placement, data["num_microbatches"], data.get("name", ""))

    # ---- CSV in torch.distributed.pipelining's format: one row per rank -------------------------
    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for rank in self.actions:
            writer.writerow([str(a) for a in rank])
        return out.getvalue()

    @classmethod
    def from_csv(cls, text: str, placement: Placement | None = None, name: str = "", *,
                 max_actions: int | None = MAX_FILE_ACTIONS) -> Schedule:
        """Read torch's ``_dump_csv`` format; empty cells (its deliberate bubbles) are skipped."""
        rows = [[cell for cell in row if cell.strip()] for row in csv.reader(io.StringIO(text))]
        return cls._from_tokens(rows, placement, name, max_actions)


# torch.distributed.pipelining's CSV cells that are no action of ours: an overlapped forward+backward
# (DualPipeV's ``(0F3;7B1)OVERLAP_F_B``) and its FSDP and gradient-sync bookkeeping
_OVERLAP = re.compile(r"^\((?P<subs>[^)]*)\)OVERLAP_F_B$")
TORCH_BOOKKEEPING = re.compile(r"^\d+(UNSHARD|RESHARD|REDUCE_GRAD)$")
_TORCH_CELL = re.compile(r"\)OVERLAP_F_B\b|\d(UNSHARD|RESHARD|REDUCE_GRAD)\b")


def has_torch_cells(text: str) -> bool:
    """Whether a CSV holds cells only torch's ``_dump_csv`` writes (``expand_overlaps`` reads them); our
    own CSV (``Schedule.to_csv``) has none, so the form is known from the content."""
    return _TORCH_CELL.search(text) is not None


def expand_overlaps(text: str) -> str:
    """Replace every ``(a;b)OVERLAP_F_B`` cell of torch's CSV by its sub-actions ``a`` and ``b``, in that
    order (our IR has no overlap action: the simulator times them back to back), and drop torch's
    UNSHARD/RESHARD/REDUCE_GRAD cells (FSDP and gradient-sync bookkeeping)."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        cells: list[str] = []
        for cell in row:
            match = _OVERLAP.match(cell.strip())
            if TORCH_BOOKKEEPING.match(cell.strip()):
                continue
            cells.extend(match.group("subs").split(";") if match else [cell])
        rows.append(cells)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


_JSON_FIELDS = ("num_microbatches", "placement", "actions")


def require_schedule(value: object, who: str) -> None:
    """Refuse (one ``ConfigError`` line) a ``value`` that is not a ``Schedule`` at a public entry point:
    a type check, not a validation, so that it costs nothing on the planner's hot paths."""
    if not isinstance(value, Schedule):
        shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
        raise ConfigError(f"{who} takes a Schedule, not {shown}: pass one from generate(name, ranks, microbatches) "
                          "(or Schedule.from_text / from_json)")


def infer_placement(rows: Sequence[Sequence[Action]]) -> Placement:
    """Each stage on the rank whose line holds its actions; stages must be 0..S-1."""
    mapping: dict[int, int] = {}
    first: dict[int, int] = {}  # stage -> step of its first action on its rank's line
    for rank, row in enumerate(rows):
        for step, a in enumerate(row):
            owner = mapping.setdefault(a.stage, rank)
            step0 = first.setdefault(a.stage, step)
            if owner != rank and a.kind in COMPUTE_KINDS:
                raise ConfigError(f"rank {rank}, step {step}, action {a}: stage {a.stage} also has "
                                  f"{rows[owner][step0]} on rank {owner} (step {step0}): all of a stage's actions "
                                  "go on one rank's line")
    if sorted(mapping) != list(range(len(mapping))):
        gap = next(s for s in range(len(mapping) + 1) if s not in mapping)
        above = min(s for s in mapping if s > gap)
        rank = mapping[above]
        step, a = next((i, a) for i, a in enumerate(rows[rank]) if a.stage == above)
        raise ConfigError(f"stages used are not 0..S-1: stage {gap} has no actions but stage {above} has (rank "
                          f"{rank}, step {step}, action {a}); number the stages 0..{len(mapping) - 1}")
    return Placement.custom([mapping[s] for s in range(len(mapping))], num_ranks=len(rows))


def _parse_rows(tokens: object, max_actions: int | None) -> tuple[tuple[Action, ...], ...]:
    """Per rank, its actions from their text; a mistake is one ``ConfigError`` line naming rank and step.
    Counted before parsing: a file too large to load in a moment is refused at once."""
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in tokens):
        raise ConfigError(f"actions={_short(tokens)}: give one list per rank of action texts, "
                          "e.g. [[\"0F0\", \"0B0\"], [\"1F0\", \"1B0\"]]")
    total = sum(map(len, tokens))
    if max_actions is not None and total > max_actions:
        raise ConfigError(f"the schedule has {total:,} actions, above the limit of {max_actions:,} "
                          "(max_actions=None lifts it)")
    rows = []
    for rank, row in enumerate(tokens):
        try:
            rows.append(tuple(map(Action.parse, row)))
        except ConfigError as err:
            step = next(i for i, t in enumerate(row) if not isinstance(t, str) or not _ACTION_RE.match(t.strip()))
            raise ConfigError(f"rank {rank}, step {step}: {err}") from None
    return tuple(rows)


def _check_json_types(data: dict[str, Any]) -> None:
    """Refuse hand-written JSON whose fields have the wrong type, naming the field (one line)."""
    mb = data["num_microbatches"]
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
        raise ConfigError(f"schedule JSON: num_microbatches={_short(mb)}: must be an integer >= 1 (the number of "
                          "microbatches the actions run)")
    placement = data["placement"]
    if not isinstance(placement, list) or not placement or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in placement):
        raise ConfigError(f"schedule JSON: placement={_short(placement)}: give the rank of each stage, a list of "
                          "integers >= 0 such as [0, 1, 1, 0]")
    for key in ("name", "placement_kind"):
        if not isinstance(data.get(key, ""), str):
            raise ConfigError(f"schedule JSON: {key}={_short(data[key])}: must be text")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
