"""Error types: one for bad schedules (with a rendered grid), one for bad configuration; the names a
configuration error gives what the user set (a request's fields, or the command line's flags); and the
one line for a missing optional extra, which every entry point (the ``pipeoffload`` commands, ``python -m
pipeoffload.runtime``) prints instead of a traceback."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from pipeoffload.textgrid import render_grid

# The command-line flag of each request field whose flag is not ``--`` + its name with dashes; a dotted
# field is one of the request's model or hardware (``model.layers``: ``--layers``).
FLAG_OF_FIELD = {
    "costs_file": "--costs", "memory_budget": "--memory", "host_memory_budget": "--host-memory",
    "tp_sizes": "--tp", "pp_sizes": "--pp", "model.microbatch": "--microbatch-size",
    "memory_asked": "--memory", "measured": "--profile", "hardware.d2h_bandwidth": "--offload-bw",
}


def flag_of(field: str) -> str:
    """The command-line flag that sets request field ``field``: ``time_f`` is ``--time-f``."""
    return FLAG_OF_FIELD.get(field) or "--" + field.rpartition(".")[2].replace("_", "-")


class Naming:
    """How a message names what the user set: a request's field (``tp=3``: the Python API, and the
    playground, whose query parameters are the fields) or its command-line flag (``--tp 3``). ``names``
    renames the fields of a lower layer first, as one surface calls them (a schedule generator's
    ``num_ranks`` is ``simulate``'s ``ranks``, ``--ranks``, and ``train``'s ``pp``, ``--pp``)."""

    def __init__(self, flags: bool, names: Mapping[str, str] | None = None) -> None:
        self.flags = flags
        self.names = dict(names or {})

    def __call__(self, field: str) -> str:
        """The name alone: ``tp`` or ``--tp``."""
        field = self.names.get(field, field)
        return flag_of(field) if self.flags else field

    def given(self, field: str, value: object) -> str:
        """The name with the value given: ``tp=3`` or ``--tp 3``. Text is shown as it is (the caller
        formats numbers); a tuple is ``(4, 8)`` for a field and ``4,8`` for a flag (``''`` when empty)."""
        if isinstance(value, tuple):
            value = (",".join(map(str, value)) or "''") if self.flags else repr(value)
        return f"{self(field)} {value}" if self.flags else f"{self(field)}={value}"

    def renamed(self, names: Mapping[str, str]) -> Naming:
        """This naming with a lower layer's fields renamed by ``names`` first."""
        return Naming(self.flags, {**self.names, **names})


FIELDS = Naming(flags=False)
FLAGS = Naming(flags=True)
_E = TypeVar("_E", bound="ConfigError")


class Worded(str):
    """A note or warning that names what the user set, as ``ConfigError.named`` is an error: the text
    names the request's fields (what a Python user and the playground read), and carries the same text
    naming the command line's flags (``in_words(text, FLAGS)``), which the CLI prints. Put into other
    text it is plain text, naming fields: hand it on whole."""

    flag_text: str

    def __new__(cls, fields: str, flags: str) -> Worded:
        text = super().__new__(cls, fields)
        text.flag_text = flags
        return text

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # pickled: both namings travel
        return str(self), self.flag_text

    @classmethod
    def named(cls, words: Callable[[Naming], str]) -> Worded:
        """The text ``words(naming)`` in both namings."""
        return cls(words(FIELDS), words(FLAGS))


def in_words(text: str, naming: Naming) -> str:
    """``text`` naming ``naming``'s way where it is ``Worded``; other text names neither, and is as it is."""
    return text.flag_text if naming.flags and isinstance(text, Worded) else str(text)


class ConfigError(ValueError):
    """A value a user gave violates a constraint. The message names the value, the rule and the fix.

    One raised with ``named`` names what was set as the request's fields (``str(err)``), and carries the
    same message naming the command line's flags (``in_words(FLAGS)``), which the CLI prints."""

    flag_message: str | None = None  # set by ``named``; None: the message names no field
    words: Callable[[Naming], str] | None = None  # set by ``named``: the message in any naming (``renamed``)

    @classmethod
    def named(cls: type[_E], words: Callable[[Naming], str], *args: Any) -> _E:
        """The error whose message is ``words(naming)``: fields in ``str(err)``, flags for the CLI
        (``args``: a subclass's other arguments)."""
        err = cls(words(FIELDS), *args)
        err.flag_message = words(FLAGS)
        err.words = words
        return err

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (an error sent between processes) with both messages, less ``words`` (a function)."""
        return type(self), self.args, {k: v for k, v in vars(self).items() if k != "words"}

    def renamed(self, names: Mapping[str, str]) -> ConfigError:
        """This error with the fields it names renamed by ``names`` (``Naming.renamed``): a lower layer's
        refusal as the surface that called it names what its user set. An error not made by ``named``
        names no field, and is returned as it is."""
        words = self.words
        if words is None:
            return self
        return ConfigError.named(lambda n: words(n.renamed(names)))

    def in_words(self, naming: Naming) -> str:
        """The message naming fields or flags (the same text where it names neither)."""
        return self.flag_message if naming.flags and self.flag_message is not None else str(self)

    def worded(self) -> Worded:
        """The message as a ``Worded`` text (an error shown inside a result, in both namings)."""
        return Worded(str(self), self.in_words(FLAGS))

    def prefixed(self, prefix: str) -> ConfigError:
        """This error's first line after ``prefix: `` (the run or argument it came from), in both namings."""
        return ConfigError.named(lambda n: f"{prefix}: {self.in_words(n).splitlines()[0]}")


@contextmanager
def renaming(names: Mapping[str, str]) -> Iterator[None]:
    """Within it, a ``ConfigError`` of a lower layer (a schedule generator's) names its fields as ``names``
    renames them: the surface's one mapping (``ConfigError.renamed``)."""
    try:
        yield
    except ConfigError as err:
        renamed = err.renamed(names)
        if renamed is err:
            raise
        raise renamed from None


def in_flags(err: Exception) -> str:
    """``err``'s message as a command line prints it: a ``ConfigError`` naming the flags, not the fields."""
    return err.in_words(FLAGS) if isinstance(err, ConfigError) else str(err)


class ScheduleError(ValueError):
    """A schedule breaks an invariant at one (rank, step).

    The message names rank, step and action and ends with the rank x step grid,
    the bad cell marked, so the problem can be seen rather than reconstructed.
    """

    def __init__(
        self,
        reason: str,
        rank: int | None = None,
        step: int | None = None,
        action: object | None = None,  # an ``ir.Action`` (typed loosely: the IR imports this module)
        ranks: Sequence[Sequence[object]] | None = None,
    ) -> None:
        self.reason = reason
        self.rank = rank
        self.step = step
        self.action = action
        where = ""
        if rank is not None:
            where = f"rank {rank}, step {step}, action {action}: "
        message = where + reason
        if ranks is not None:
            message += "\n" + render_grid(ranks, mark=(rank, step) if rank is not None else None)
        super().__init__(message)


# the packages of each optional extra (pyproject.toml): a command that needs one that is not installed
# says which extra brings it, in one line, instead of a traceback
EXTRAS = {"torch": "train", "tokenizers": "train", "safetensors": "train", "tqdm": "train"}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one line for an import of an optional extra's package that is not installed, else None."""
    top = (err.name or "").partition(".")[0]
    if top not in EXTRAS or (top != err.name and importlib.util.find_spec(top) is not None):
        return None  # not an extra's package, or the package is there and only a part of it is missing
    return extra_line(top)


def extra_line(package: str) -> str:
    extra = EXTRAS[package]
    return f"this command needs {package} (the '{extra}' extra): pip install 'pipeoffload[{extra}]'"
