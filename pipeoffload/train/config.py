"""The training configuration: nested sections, each key's default and help written once, here.

``TrainConfig`` holds one frozen dataclass per section (``model``, ``data``, ``parallel``,
``schedule``, ``optim``, ``checkpoint``, ``metrics``, ``run``). Everything else is derived from the
fields: the ``pipeoffload train`` flags (``add_flags``; a field's flag is ``--`` + its *flat key*
with ``_`` as ``-``), the TOML file (one table per section: ``[parallel] pp = 2``) and the help
text with its default. The flat key of a field is its name, except where the section makes the name
redundant (``schedule.family`` is ``schedule``, ``data.path`` is ``data``, ``model.source`` is
``model``); flat keys at the top level of a TOML file are read too (the format before sections,
still in old runs' ``config.toml``). ``validate`` raises ``ConfigError`` with one line naming the
key, the rule and the fix. This module never imports torch, so a bad value is refused in milliseconds.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError, Naming
from pipeoffload.fileio import why_not_a_file
from pipeoffload.policies import INT_TEXT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py3.10
    import tomli as tomllib

DEFAULT_TIMEOUT = 120.0  # seconds: a loaded 2-core CPU machine can take tens of seconds for one step
MAX_TIMEOUT = 7 * 86400.0  # a week: beyond it (inf, 1e300) the process group's timedelta overflows
MIN_TIMEOUT = 1.0  # below a second, starting the ranks alone times out
# seconds for the ranks' start-up (process group, mesh, data, model, resume): minutes on a cluster or a loaded
# machine, like torchrun's rendezvous (600 s), while --timeout finds a rank stopped mid-run fast
DEFAULT_STARTUP_TIMEOUT = 600.0
DEFAULT_STOP_GRACE = 10.0  # seconds the ranks get after SIGINT/SIGTERM: a step and a save of a small model


def key(default: Any, help: str, *, flat: str = "", saved: bool = True, metavar: str = "") -> Any:
    """A config field: its default, its help (the flag's and the docs'), and optionally its flat key
    (when it differs from the field name) and ``saved=False`` for per-invocation options that a
    resumed run must not inherit from ``config.toml``."""
    return field(default=default, metadata={"help": help, "flat": flat, "saved": saved, "metavar": metavar})


@dataclass(frozen=True)
class ModelConfig:
    source: str = key("gpt", "gpt (the reference GPT) | llama | hf:DIR (a local Hugging Face folder); "
                             "'own' marks a run of train_model", flat="model", metavar="NAME")
    layers: int = key(4, "transformer blocks")
    hidden: int = key(64, "hidden size")
    heads: int = key(4, "attention heads")
    kv_heads: int = key(0, "key/value heads of grouped-query attention (0: = heads)")
    ffn_hidden: int = key(0, "feed-forward hidden size (0: the family's default, 4*hidden for gpt)")
    vocab: int = key(0, "vocabulary size: rows of the embedding and the head, at least the tokenizer's (0: the "
                        "tokenizer's)")
    rope_theta: float = key(10000.0, "RoPE base frequency (llama)")
    tie_embeddings: bool = key(False, "share the weights of the token embedding and the output head")
    seq_len: int = key(64, "tokens per sequence")
    dtype: str = key("fp32", "fp32 | bf16 (bf16 autocast; fp32 master weights and optimizer state)")


@dataclass(frozen=True)
class DataConfig:
    path: str = key("", "text file, .jsonl (a text field per line), folder of them, or .npy/.bin tokens "
                        "(default: the stdlib's sources)",
                    flat="data", metavar="PATH")
    tokenizer: str = key("byte", "byte | bpe:N (BPE trained offline on the data, saved in the run) | hf (set by "
                                 "model=hf:DIR: the folder's tokenizer.json)")
    val_fraction: float = key(0.05, "share of the tokens held out for validation (the tail)")
    global_batch: int = key(8, "sequences per optimizer step over all dp replicas")


@dataclass(frozen=True)
class ParallelConfig:
    pp: int = key(1, "pipeline-parallel size")
    dp: int = key(1, "data-parallel size")
    tp: int = key(1, "tensor-parallel size")
    zero: int = key(0, "1: shard the optimizer state over the dp group (ZeroRedundancyOptimizer); not with tp > 1")
    fsdp: bool = key(False, "shard each stage's weights, gradients and optimizer state over the dp group "
                            "(FSDP2 fully_shard; gathered for the step, reduce-scattered after the stage's last "
                            "backward); needs dp >= 2, not with zero, tp > 1 or tie_embeddings")
    nproc: int = key(0, "spawn this many local ranks (0: torchrun's env, else one process)")
    layers_per_stage: str = key("", "transformer blocks per pipeline stage, comma-separated, one per stage "
                                    "(pp*stages_per_rank; the first stage also holds the embedding, the last the "
                                    "head; `plan --emit` writes its split); empty: the modules split evenly",
                                metavar="N,N,...")


@dataclass(frozen=True)
class ScheduleConfig:
    family: str = key("1f1b", "schedule family (see `pipeoffload schedules`)", flat="schedule", metavar="NAME")
    stages_per_rank: int = key(0, "stages per pipeline rank v (0: the family's own; a new --schedule resets it)")
    group_size: int = key(0, "group size g of group-interleaved (0: the family's)")
    microbatches: int = key(4, "microbatches per step per replica; must divide global_batch/dp")
    offload: str = key("none", "offload policy: none | all | first:K | auto | budget:X")
    recompute: str = key("none", "recompute policy: none | all | first:K | auto (whole stages; the planner's "
                                 "partial/LGD forms ,lgd and ,partial:S:T are not performed by train and are refused)")
    offload_ratio: float = key(0.0, "k of the offload placement cost model (0: the default cost model)")
    max_stall: float = key(0.0, "percent the offload plan may lengthen the step for a lower peak (0: never; "
                                "needs offload_ratio > 0)", metavar="PCT")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = key(3e-4, "peak learning rate of AdamW (betas 0.9, 0.95)")
    warmup: int = key(20, "linear warm-up steps before the cosine decay")
    min_lr_ratio: float = key(0.1, "the cosine decays to this fraction of lr at --steps")
    weight_decay: float = key(0.1, "AdamW weight decay")
    clip: float = key(1.0, "clip gradients to this global norm (0: off)")
    skip_nonfinite: int = key(0, "non-finite steps (loss or gradient norm) skipped before the run stops")


@dataclass(frozen=True)
class CheckpointConfig:
    save_every: int = key(100, "checkpoint every N steps and at the end")
    keep: int = key(2, "checkpoints kept")
    async_save: bool = key(False, "write checkpoints in the background (dcp.async_save) while the next steps run; "
                                  "a checkpoint appears once complete, at the latest at the next save or the end")


@dataclass(frozen=True)
class MetricsConfig:
    eval_every: int = key(50, "validation loss every N steps (and after step 1 and the last)")
    eval_batches: int = key(2, "held-out batches (of global_batch sequences) per validation")
    progress: bool = key(True, "the progress bar", saved=False)
    log_every: int = key(1, "a metrics record (and its memory measurement) every N steps; the last step, and "
                            "every step with a validation loss, always")
    tensorboard: bool = key(False, "also write TensorBoard event files to RUN_DIR/tensorboard "
                                   "(pip install 'pipeoffload[tensorboard]')")
    keep_records: int = key(1000, "metrics records kept in memory and returned by train_model (the whole run is "
                                  "in metrics.jsonl)", saved=False)


@dataclass(frozen=True)
class RunConfig:
    steps: int = key(100, "optimizer steps; also the length of the cosine LR schedule")
    stop_at: int = key(0, "save and stop after this step though --steps sets the schedule (0: run all steps)",
                       saved=False)
    seed: int = key(0, "seeds the weights, the data order and every random-number generator")
    deterministic: bool = key(False, "deterministic kernels on CUDA (torch.use_deterministic_algorithms, the "
                                     "math attention kernel instead of the fused ones): the same run twice, or "
                                     "stopped and resumed, gives bitwise the same losses on a GPU; slower and "
                                     "more memory at long sequences. CPU runs are deterministic without it; "
                                     "a resumed run keeps it")
    out: str = key("", "run directory (default runs/<timestamp>)", metavar="DIR")
    timeout: float = key(DEFAULT_TIMEOUT, "seconds bounding every wait between ranks once training runs (from "
                                          "the first step on; start-up has --startup-timeout)")
    startup_timeout: float = key(DEFAULT_STARTUP_TIMEOUT, "seconds bounding every wait between ranks before the "
                                                          "first step: joining the process group, the mesh, "
                                                          "loading the data, the model and a checkpoint to resume")
    stop_grace: float = key(DEFAULT_STOP_GRACE, "seconds the ranks get after SIGINT/SIGTERM to finish their step "
                                                "and save before they are killed (raise it for a big model's save)")


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def world(self) -> int:
        return self.parallel.dp * self.parallel.pp * self.parallel.tp

    @classmethod
    def build(cls, **keys: Any) -> TrainConfig:
        """A config from flat keys: ``TrainConfig.build(pp=2, nproc=2, schedule="zb-v")``."""
        return build_config(keys)

    def updated(self, **keys: Any) -> TrainConfig:
        """A copy with these flat keys changed (values coerced and checked like the file's). A new
        ``schedule`` without ``stages_per_rank`` takes the new family's own v, as the flag does."""
        base = self.flat()
        if keys.get("schedule") not in (None, self.schedule.family) and "stages_per_rank" not in keys:
            base["stages_per_rank"] = 0
        return build_config(base, keys)

    def get(self, flat: str) -> Any:
        section, name = KEYS[flat]
        return getattr(getattr(self, section), name)

    def flat(self) -> dict[str, Any]:
        return {k: self.get(k) for k in KEYS}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(TrainConfig)  # type: ignore[misc]
                             if f.default_factory is not MISSING}


def _flat_key(f: Field) -> str:
    return f.metadata.get("flat") or f.name


# flat key -> (section, field name), in the order of the sections
KEYS: dict[str, tuple[str, str]] = {_flat_key(f): (s, f.name) for s, kind in SECTIONS.items() for f in fields(kind)}
_FIELDS: dict[str, Field] = {_flat_key(f): f for kind in SECTIONS.values() for f in fields(kind)}
_TYPES = {k: type(f.default) for k, f in _FIELDS.items()}
UNSAVED = tuple(k for k, f in _FIELDS.items() if not f.metadata["saved"])
# What makes two runs' checkpoints interchangeable: the model, the data and its order. The layout
# (pp, dp, tp, schedule, policies, zero) may change on resume: DCP reshards by parameter name.
# The later model keys compare with their default when an older manifest lacks them.
FINGERPRINT_KEYS = ("layers", "hidden", "heads", "seq_len", "data", "tokenizer", "val_fraction", "seed",
                    "global_batch", "model", "kv_heads", "ffn_hidden", "vocab", "rope_theta", "tie_embeddings")
LAYOUT_KEYS = ("pp", "dp", "tp", "schedule", "stages_per_rank", "zero", "fsdp", "layers_per_stage")
# the layout keys whose change reorders sums (gradient reductions, sharded matmuls); the others only move stages
ARITHMETIC_LAYOUT_KEYS = ("pp", "dp", "tp", "zero", "fsdp")


def default_of(flat: str) -> Any:
    return _FIELDS[flat].default


# ---- the flags ---------------------------------------------------------------------------------------
def flag_of(flat: str) -> str:
    return "--" + flat.replace("_", "-")


def setting(cfg: TrainConfig, flat: str, value: str = "") -> str:
    """The setting ``flat`` as the run's caller gives it, for a message's remedy: a ``TrainConfig`` key
    (``skip_nonfinite=N``) in a run of ``train_model`` (``model = "own"``), else the CLI's flag
    (``--skip-nonfinite N``)."""
    if cfg.model.source == "own":
        return f"{flat}={value}" if value else f"{flat}="
    return f"{flag_of(flat)} {value}" if value else flag_of(flat)


def continue_with(run_dir: str | Path) -> str:
    """How to continue the run in ``run_dir``, in its caller's terms: ``train_model(..., resume=...)``
    for a run of your own model (its ``config.toml`` says ``model = "own"``; the CLI cannot rebuild it),
    else ``pipeoffload train --resume``."""
    try:
        own = load_toml(Path(run_dir) / "config.toml").get("model") == "own"
    except (OSError, ConfigError, KeyError):
        own = False
    if own:
        return f"train_model(cfg, layers, loss_fn, batches, resume={str(run_dir)!r})"
    return f"pipeoffload train --resume {run_dir}"


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"{default:g}" if isinstance(default, float) else str(default)


def _bool_flags(flat: str) -> str:
    """A switch's two flags, ``--KEY`` and ``--no-KEY``: either can override a config file's value."""
    return f"`{flag_of(flat)}`, `--no-{flat.replace('_', '-')}`"


def flag_help(flat: str) -> str:
    f = _FIELDS[flat]
    text = f.metadata["help"]
    if f.type in ("bool", bool):
        return f"{text} (default {_shown(f.default)})"
    if "(default" in text or (f.default == "" and "empty:" in text):  # the help says it already
        return text
    return f"{text} (default {_shown(f.default) or 'empty'})"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per key, one argument group per section; every default is ``None`` (= not given), so
    the layers under the flags (saved config, --config file, defaults) show through."""
    for section, kind in SECTIONS.items():
        group = parser.add_argument_group(section)
        for f in fields(kind):
            flat = _flat_key(f)
            if f.type in ("bool", bool):  # --KEY and --no-KEY
                group.add_argument(flag_of(flat), dest=flat, action=argparse.BooleanOptionalAction, default=None,
                                   help=flag_help(flat))
                continue
            kind_ = _TYPES[flat]
            metavar = f.metadata["metavar"] or {int: "N", float: "X"}.get(kind_, "TEXT")
            group.add_argument(flag_of(flat), dest=flat, type=kind_, default=None, metavar=metavar,
                               help=flag_help(flat))


def flags_given(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in KEYS if getattr(args, k, None) is not None}


def flags_markdown() -> str:
    """The flag table of docs/training.md, derived from the fields (a test keeps the docs equal to it)."""
    rows = ["| flag | TOML | default | meaning |", "|---|---|---|---|"]
    for flat, (section, name) in KEYS.items():
        f = _FIELDS[flat]
        flag = _bool_flags(flat) if f.type in ("bool", bool) else f"`{flag_of(flat)}`"
        text = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| {flag} | `[{section}] {name}` | {_shown(f.default)} | {text} |")
    return "\n".join(rows) + "\n"


# ---- values and files ----------------------------------------------------------------------------------
def _coerce(flat: str, value: Any) -> Any:
    kind = _TYPES[flat]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
    elif kind is int:
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            return value
        elif isinstance(value, float) and value.is_integer():
            return int(value)
        elif isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif kind is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{flat}={value!r}: must be a finite number")
            return number
    elif kind is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{flat}={value!r}: must be {'an integer' if kind is int else 'a ' + kind.__name__}")


def flatten(mapping: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """Flat keys of a mapping that may hold sections (``{"parallel": {"pp": 2}}``), flat keys
    (``{"pp": 2}``, the format before sections) or both; an unknown key is refused, naming the valid ones."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # flat key -> how the mapping gave it (a key given twice is refused)

    def put(flat: str, value: Any, shown: str) -> None:
        if flat in out:
            raise ConfigError(f"{flat}: given twice in {where} ({given_as[flat]} = {out[flat]!r} and {shown} = "
                              f"{value!r}); keep one of them (the [section] form)")
        out[flat], given_as[flat] = value, shown

    for name, value in mapping.items():
        if isinstance(value, dict) and name in SECTIONS:
            names = {f.name: _flat_key(f) for f in fields(SECTIONS[name])}
            for sub, v in value.items():
                if sub not in names:
                    raise ConfigError(f"unknown key {sub!r} in [{name}] of {where}; valid keys: {', '.join(names)}")
                put(names[sub], v, f"[{name}] {sub}")
        elif name in KEYS and not isinstance(value, dict):
            put(name, value, f"top-level {name}")
        else:
            raise ConfigError(f"unknown config key {name!r} in {where}; sections: {', '.join(SECTIONS)}; "
                              f"keys: {', '.join(KEYS)}")
    return out


def load_toml(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The flat keys of a TOML file (sections or the old flat form); unknown keys are refused. ``name``:
    how an error calls the file (default ``--config 'PATH'``)."""
    p = Path(path)
    name = name or f"--config {str(p)!r}"
    if not p.is_file():  # a FIFO would wait for a writer: refused before it is read
        raise ConfigError(f"{name}: {why_not_a_file(p)}")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{name}: not valid TOML ({str(err).splitlines()[0]})") from None
    flat = flatten(data, str(p))
    for key, value in flat.items():
        _check_toml_type(key, value, str(p))
    return flat


_TOML_TYPES: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _check_toml_type(flat: str, value: Any, where: str) -> None:
    """A TOML value of the key's own type: a quoted number or a number for a switch would be read as
    something it does not say (``microbatches = "8"`` ran; ``bool("false")`` is true)."""
    kind = _TYPES[flat]
    ok = isinstance(value, _TOML_TYPES[kind]) and (kind is bool or not isinstance(value, bool))  # True is an int
    if not ok:
        want = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "a quoted string")
        hint = "; write it without quotes" if isinstance(value, str) and kind is not str else ""
        raise ConfigError(f"{flat}={value!r} in {where}: must be {want}{hint}")


def check_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` as a path when it is a run's folder (the ``--out`` of ``pipeoffload train``, with its
    config.toml); else one line naming RUN_DIR and what is wrong. Torch-free: the CLI checks it first."""
    run = Path(run_dir)
    if not run.exists():
        raise ConfigError(f"RUN_DIR {str(run)!r} does not exist; give the --out folder of `pipeoffload train`")
    if not run.is_dir():
        raise ConfigError(f"RUN_DIR {str(run)!r} is a file, not a folder; give the --out folder of `pipeoffload train`")
    if not (run / "config.toml").is_file():
        raise ConfigError(f"RUN_DIR {str(run)!r}: no config.toml; give the --out folder of `pipeoffload train`")
    return run


def load_saved(run_dir: str | Path, given_as: str = "RUN_DIR") -> dict[str, Any]:
    """The flat keys a run saved, less the per-invocation ones (an old run's ``stop_at``). ``given_as``:
    how the caller was given ``run_dir`` (``--resume``, ``resume=``), which an error names."""
    path = Path(run_dir) / "config.toml"
    shown = f"{given_as}{'' if given_as.endswith('=') else ' '}{str(run_dir)!r}"
    saved = load_toml(path, f"{shown}: the run's config.toml ({str(path)!r})")
    return {k: v for k, v in saved.items() if k not in UNSAVED}


def build_config(*layers: dict[str, Any]) -> TrainConfig:
    """Defaults, then each mapping in turn (TOML, then flags; flat or with sections); ``None`` values
    are skipped."""
    values: dict[str, Any] = {}
    for layer in layers:
        for flat, value in flatten(layer).items():
            if value is not None:
                values[flat] = _coerce(flat, value)
    parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for flat, value in values.items():
        section, name = KEYS[flat]
        parts[section][name] = value
    return TrainConfig(**{s: kind(**parts[s]) for s, kind in SECTIONS.items()})


def overrides(base: dict[str, Any], top: dict[str, Any]) -> list[str]:
    """``key old -> new`` for each flat key ``top`` changes in ``base`` (after coercion), the values written
    as the TOML file holds them (``true``, ``"zb-v"``)."""
    out = []
    for flat, value in top.items():
        if value is None or flat not in base:
            continue
        old, new = _coerce(flat, base[flat]), _coerce(flat, value)
        if old != new:
            out.append(f"{flat} {toml_value(old)} -> {toml_value(new)}")
    return out


def to_toml(cfg: TrainConfig, notes: Sequence[str] = ()) -> str:
    """The saved form: one table per section, per-invocation keys left out; a model this package does
    not build (``own``) records only its kind. ``notes`` (what overrode what, settings without effect, the
    offload placement: ``train`` prints them, ``config.toml`` has none) are comments under the header, which
    names what follows."""
    lines = ["# pipeoffload train: resolved configuration (flags override; see docs/training.md)",
             *(f"# {note}" for note in notes)]
    for section, kind in SECTIONS.items():
        lines.append(f"\n[{section}]")
        for f in fields(kind):
            if not f.metadata["saved"]:
                continue
            if section == "model" and cfg.model.source == "own" and f.name != "source":
                continue
            lines.append(f"{f.name} = {toml_value(getattr(getattr(cfg, section), f.name))}")
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """``value`` as config.toml writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    return {k: cfg.get(k) for k in FINGERPRINT_KEYS}


def fingerprint_hash(cfg: TrainConfig) -> str:
    return hashlib.sha256(json.dumps(fingerprint(cfg), sort_keys=True).encode()).hexdigest()[:16]


def layout(cfg: TrainConfig) -> dict[str, Any]:
    return {k: cfg.get(k) for k in LAYOUT_KEYS}


# ---- validation ----------------------------------------------------------------------------------------
def _installed(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # sys.modules holds None for it: an import of it fails
        return False


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def resolve_stages_per_rank(cfg: TrainConfig) -> TrainConfig:
    """Fill the family's default stages per rank (and check the name)."""
    from pipeoffload.schedules import get_spec

    spec = get_spec(cfg.schedule.family)  # ConfigError naming the valid families
    v = cfg.schedule.stages_per_rank or spec.default_stages_per_rank()
    return replace(cfg, schedule=replace(cfg.schedule, family=spec.name, stages_per_rank=v))


_AT_LEAST_1 = ("pp", "dp", "tp", "microbatches", "global_batch", "steps", "layers", "hidden", "heads", "seq_len",
               "eval_every", "save_every", "keep", "eval_batches", "log_every", "keep_records")
_AT_LEAST_0 = ("stages_per_rank", "group_size", "nproc", "warmup", "seed", "stop_at", "kv_heads", "ffn_hidden",
               "vocab", "skip_nonfinite")


def validate(cfg: TrainConfig, *, data_exists: bool = True, gpt: bool = True, resumed: bool = False) -> TrainConfig:
    """Check every rule; return the config with defaults resolved. One ``ConfigError`` line per failure.
    ``gpt=False``: the model is the caller's (``train_model``), recorded as ``model = "own"``. ``resumed``: the
    config continues a run, whose checkpoint fixes the model (a remedy never offers to change it)."""
    for flat in _AT_LEAST_1:
        _need(cfg.get(flat) >= 1, f"{flat}={cfg.get(flat)}: must be >= 1")
    for flat in _AT_LEAST_0:
        _need(cfg.get(flat) >= 0, f"{flat}={cfg.get(flat)}: must be >= 0")
    cfg = _check_model(cfg, gpt)
    _check_numbers(cfg)
    _check_layout(cfg)
    _check_tokenizer(cfg.data.tokenizer)
    if cfg.data.path and data_exists:
        path = Path(cfg.data.path)
        _need(path.exists(), f"data={cfg.data.path!r}: no such file or folder")
        _need(path.is_file() or path.is_dir(), f"data={cfg.data.path!r}: not a regular file or a folder")
    if cfg.data.path:  # stored resolved: --resume from another directory finds it
        cfg = replace(cfg, data=replace(cfg.data, path=str(Path(cfg.data.path).resolve())))
    offload_policy(cfg)
    if cfg.schedule.max_stall > 0 and cfg.schedule.offload_ratio == 0:
        raise ConfigError.named(lambda n: (
            f"{n.given('max_stall', f'{cfg.schedule.max_stall:g}')}: needs {n('offload_ratio')} > 0 (with 0 the "
            f"copies are planned as instant and never stall); give the link's k, e.g. {n.given('offload_ratio', 0.7)} "
            "(`pipeoffload k` prints it for a model and GPU)"))
    check_recompute(cfg.schedule.recompute, cfg)
    if cfg.metrics.tensorboard:
        _need(_installed("tensorboard"), "tensorboard=true: the tensorboard package is not installed; "
                                         "pip install 'pipeoffload[tensorboard]', or leave out --tensorboard")
    cfg = resolve_stages_per_rank(cfg)
    _check_schedule(cfg, gpt, resumed)
    return cfg


def check_recompute(text: str, cfg: TrainConfig | None = None) -> None:
    """A recompute policy train performs: its partial forms (``,lgd``, ``,partial:S:T``) are the planner's
    model of recomputing LayerNorm/GeLU in the backward, which the runtime does not do; lowered with one,
    a budget's plan would count on a saving the run never makes (and exceed the budget). ``cfg``: the
    run's, to name the fix in its caller's terms (``setting``)."""
    from pipeoffload.policies import RecomputePolicy

    policy = RecomputePolicy.parse(text)  # ConfigError naming the valid forms
    if policy.partial:
        head = f"first:{policy.count}" if policy.kind == "first" else policy.kind
        raise ConfigError(f"recompute={text!r}: train does not perform partial (LGD) recomputation, so the memory "
                          f"it plans would not be saved; drop the partial part "
                          f"({setting(cfg, 'recompute', head) if cfg is not None else '--recompute ' + head})")


def no_effect_notes(cfg: TrainConfig, given: set[str]) -> list[str]:
    """One note per key in ``given`` (flat names the user set: flags, --config) that the validated
    ``cfg`` makes do nothing: accepted (a plan or a shared TOML may carry it), but said, not silent."""
    notes = []
    s, p = cfg.schedule, cfg.parallel
    if "zero" in given and p.zero and p.dp == 1:
        notes.append("zero=1 with dp=1: one replica holds the whole optimizer state, so nothing is sharded; "
                     "it has no effect (ZeRO shards over --dp 2 or more)")
    if s.offload == "none" and "offload_ratio" in given and s.offload_ratio:  # (max_stall is refused there)
        notes.append(f"offload_ratio={s.offload_ratio:g} with offload='none': no copies are planned, so it has no "
                     "effect (give --offload all, auto, ...)")
    if given & {"warmup", "steps"} and cfg.optim.warmup > cfg.run.steps > 0:
        w, n = cfg.optim.warmup, cfg.run.steps
        notes.append(f"warmup={w} is above steps={n}: the learning rate is still warming up at the last step "
                     f"({n}/{w} of lr) and the cosine decay never starts")
    if "stop_at" in given and cfg.run.stop_at >= cfg.run.steps > 0:
        notes.append(f"stop_at={cfg.run.stop_at} is not below steps={cfg.run.steps}: the run ends at step "
                     f"{cfg.run.steps} anyway, so it has no effect (give --stop-at below --steps to stop early)")
    return notes


def _check_model(cfg: TrainConfig, gpt: bool) -> TrainConfig:
    """The model keys of the family ``model.source`` names; an ``hf:DIR`` is checked whole here (torch-free)
    and its shape keys and tokenizer filled in."""
    from pipeoffload.train.family import kind

    m = cfg.model
    _need(m.dtype in ("fp32", "bf16"), f"dtype={m.dtype!r}: must be 'fp32' or 'bf16'")
    if not gpt:
        return cfg
    _need(m.source != "own", "model='own': this run was made with train_model (your own model), which the CLI "
                             "cannot rebuild; continue it with train_model(cfg, ..., resume=RUN_DIR)")
    family = kind(m.source)
    _need(family in ("gpt", "llama", "hf"), f"model={m.source!r}: must be 'gpt', 'llama' or 'hf:DIR' (a local "
                                            "Hugging Face folder)")
    _need(cfg.data.tokenizer != "hf" or family == "hf",
          "tokenizer='hf': only with model='hf:DIR' (the folder's tokenizer.json); use 'byte' or 'bpe:N'")
    if family == "hf":
        return _check_hf(cfg)
    _need(m.hidden % m.heads == 0, f"hidden={m.hidden}: must be divisible by heads={m.heads}")
    _check_vocab(cfg)
    if family == "llama":
        _check_llama(cfg)
        return cfg
    for flat in _NOT_GPT:  # keys of the other families: silently ignoring one would train another model
        value = cfg.get(flat)
        _need(value == default_of(flat), f"{flat}={value!r}: not used by model='gpt' (only by the llama family: "
                                         f"--model llama); leave it at {default_of(flat)!r}")
    return cfg


def _check_llama(cfg: TrainConfig) -> None:
    from pipeoffload.train.family import shape_from_keys

    shape = shape_from_keys(cfg.model, 256)  # ConfigError naming heads/kv_heads/head size
    check_llama_tp(cfg, shape)


def _check_vocab(cfg: TrainConfig) -> None:
    """A ``vocab`` of the gpt or llama family holds every id of its tokenizer (a token file's ids are checked
    against it when it is read)."""
    m, tok = cfg.model, cfg.data.tokenizer
    if m.vocab and Path(cfg.data.path).suffix not in (".npy", ".bin"):
        least = 256 if tok == "byte" else int(tok.partition(":")[2]) if tok.startswith("bpe:") else 1
        _need(m.vocab >= least, f"vocab={m.vocab}: smaller than the tokenizer's {least} tokens; raise it or leave "
                                "it at 0 (the tokenizer's)")


def check_llama_tp(cfg: TrainConfig, shape: Any) -> None:
    tp = cfg.parallel.tp
    if tp > 1:
        _need(shape.n_kv_heads % tp == 0, f"tp={tp}: must divide the {shape.n_kv_heads} key/value heads (kv_heads)")
        _need(shape.ffn % tp == 0, f"tp={tp}: must divide the MLP width {shape.ffn} (ffn_hidden)")


def _check_hf(cfg: TrainConfig) -> TrainConfig:
    from pipeoffload.hfdir import open_hf_dir
    from pipeoffload.train.family import SHAPE_KEYS, hf_keys, hf_path

    path = hf_path(cfg.model.source)
    assert path is not None
    hf = open_hf_dir(path)  # ConfigError naming the file, field or tensor
    filled = hf_keys(hf.shape)
    for flat in SHAPE_KEYS:
        given = cfg.get(flat)
        _need(given == default_of(flat) or given == filled[flat],
              f"{flat}={given!r}: model={cfg.model.source!r} sets {flat}={filled[flat]!r} (its config.json); "
              f"leave {flag_of(flat)} out")
    tok = cfg.data.tokenizer
    _need(tok in ("byte", "hf"), f"tokenizer={tok!r}: model={cfg.model.source!r} brings its own tokenizer "
                                 "(tokenizer.json); leave --tokenizer out")
    check_llama_tp(cfg, hf.shape)
    window = hf.shape.sliding_window
    _need(not window or cfg.model.seq_len <= window,
          f"seq_len={cfg.model.seq_len}: above the sliding_window={window} of model={cfg.model.source!r} (its "
          "config.json); "
          f"attention here is full causal, the window's own only on sequences of at most {window} tokens: "
          f"use --seq-len {window} or less")
    resolved = "hf:" + str(hf.path.resolve())
    return build_config(cfg.flat(), {**filled, "model": resolved, "tokenizer": "hf"})


_NOT_GPT = ("kv_heads", "ffn_hidden", "rope_theta", "tie_embeddings")


def _check_numbers(cfg: TrainConfig) -> None:
    _need(cfg.run.seed < 2**63, f"seed={cfg.run.seed}: must be < 2**63 (a 64-bit integer)")
    _need(cfg.parallel.zero in (0, 1),
          f"zero={cfg.parallel.zero}: must be 0 or 1 (1: ZeroRedundancyOptimizer over the dp group)")
    _need(cfg.optim.lr > 0, f"lr={cfg.optim.lr}: must be > 0")
    for name, example in (("timeout", 600), ("startup_timeout", 1800), ("stop_grace", 60)):
        seconds = getattr(cfg.run, name)
        _need(MIN_TIMEOUT <= seconds <= MAX_TIMEOUT,
              f"{name}={seconds:g}: must be >= {MIN_TIMEOUT:g} and <= {MAX_TIMEOUT:g} seconds (a week); "
              f"e.g. --{name.replace('_', '-')} {example}")
    _need(cfg.optim.clip >= 0, f"clip={cfg.optim.clip}: must be >= 0 (0 turns clipping off)")
    _need(cfg.optim.weight_decay >= 0, f"weight_decay={cfg.optim.weight_decay}: must be >= 0")
    _need(0 < cfg.data.val_fraction < 0.5, f"val_fraction={cfg.data.val_fraction}: must be in (0, 0.5)")
    _need(0 <= cfg.optim.min_lr_ratio <= 1, f"min_lr_ratio={cfg.optim.min_lr_ratio}: must be in [0, 1]")
    _need(cfg.schedule.offload_ratio >= 0, f"offload_ratio={cfg.schedule.offload_ratio}: must be >= 0")
    theta = cfg.model.rope_theta  # the llama family's base frequency ** -(i / d): 0 or below made every loss NaN
    _need(math.isfinite(theta) and theta > 0,
          f"rope_theta={theta:g}: must be a finite number > 0 (RoPE's base frequency, e.g. 10000)"
          + (f", as read from {cfg.model.source}'s config.json" if cfg.model.source.startswith("hf:") else ""))


def _check_layout(cfg: TrainConfig) -> None:
    p, m = cfg.parallel, cfg.model
    if p.nproc:
        _need(p.nproc == cfg.world,
              f"nproc={p.nproc}: world size must equal dp*pp*tp = {p.dp}*{p.pp}*{p.tp} = {cfg.world}; "
              "change --nproc or the layout")
    gb = cfg.data.global_batch
    _need(gb % p.dp == 0, f"global_batch={gb}: must be divisible by dp={p.dp} (sequences per replica)")
    per_replica = gb // p.dp
    mb = cfg.schedule.microbatches
    if per_replica % mb:  # (the suggestion is computed only when needed: it searches)
        raise ConfigError(f"microbatches={mb}: must divide the {per_replica} sequences per replica "
                          f"(global_batch/dp); e.g. microbatches={_divisor_near(per_replica, mb)}")
    if p.fsdp:
        _check_fsdp(cfg)
    if p.tp > 1:
        # torch's ZeroRedundancyOptimizer broadcasts plain tensors: a DTensor parameter fails in the ranks
        _need(not p.zero, f"zero=1 with tp={p.tp}: ZeroRedundancyOptimizer cannot shard tensor-parallel (DTensor) "
                          "parameters; leave out --zero (tensor parallelism already splits the optimizer state "
                          "over the tp group)")
        _need(m.heads % p.tp == 0, f"tp={p.tp}: must divide heads={m.heads}")
        _need(m.seq_len % p.tp == 0, f"seq_len={m.seq_len}: sequence parallelism needs it divisible by tp={p.tp}")


def _fsdp(n: Naming) -> str:
    """The switch that is on, as the caller set it: ``fsdp=true`` or ``--fsdp``."""
    return n("fsdp") if n.flags else "fsdp=true"


def _without(n: Naming, *keys: str) -> str:
    """Turning ``keys`` off, as the caller sets them: ``leave out --zero or --fsdp``, ``set zero=0 or fsdp=false``."""
    if n.flags:
        return "leave out " + " or ".join(map(n, keys))
    return "set " + " or ".join(f"{key}={toml_value(default_of(key))}" for key in keys)


def _check_fsdp(cfg: TrainConfig) -> None:
    p = cfg.parallel
    if p.dp < 2:
        raise ConfigError.named(lambda n: (
            f"{_fsdp(n)} with {n.given('dp', p.dp)}: FSDP shards over the data-parallel group; use "
            f"{n.given('dp', 2)} or more, or {_without(n, 'fsdp')}"
            + (" (a resumed run's: --config a TOML with [parallel] fsdp = false)" if n.flags else "")))
    if p.zero:
        raise ConfigError.named(lambda n: f"{_fsdp(n)} with {n.given('zero', 1)}: FSDP already shards the optimizer "
                                f"state; choose one ({_without(n, 'zero', 'fsdp')})")
    if p.tp != 1:
        raise ConfigError.named(lambda n: f"{_fsdp(n)} with {n.given('tp', p.tp)}: FSDP over tensor-parallel stages "
                                f"(a 2-D mesh) is not supported; use {n.given('tp', 1)} or {_without(n, 'fsdp')}")
    if cfg.model.tie_embeddings:
        hf = (cfg.model.source or "").startswith("hf:")
        raise ConfigError.named(lambda n: (
            f"{_fsdp(n)} with {n('tie_embeddings') if n.flags else 'tie_embeddings=true'}: the embedding and the "
            "head are two copies whose gradients are summed before each step, which is not done on FSDP shards; "
            + (f"{_without(n, 'fsdp')} (the model's config.json ties them)" if hf else
               _without(n, "fsdp", "tie_embeddings"))))


def _divisor_near(n: int, want: int) -> int:
    """The divisor of ``n`` nearest ``want`` (the smaller on a tie), searched outwards a bounded distance."""
    for delta in range(min(max(n, want), 100_000)):
        for d in (want - delta, want + delta):
            if 1 <= d <= n and n % d == 0:
                return d
    return 1


def _check_tokenizer(text: str) -> None:
    if text in ("byte", "hf"):
        return
    name, _, arg = text.partition(":")
    ok = name == "bpe" and arg.isdigit() and 257 <= int(arg) <= 65535
    _need(ok, f"tokenizer={text!r}: must be 'byte' or 'bpe:N' with 257 <= N <= 65535 (e.g. bpe:1024); "
              "'hf' (the model folder's) with model='hf:DIR'")


def blocks_per_stage(cfg: TrainConfig, stages: int) -> tuple[int, ...] | None:
    """``layers_per_stage`` as numbers, checked against the model and the schedule's ``stages``; None
    when not given (the modules then split evenly)."""
    text = cfg.parallel.layers_per_stage
    if not text:
        return None
    given = f"layers_per_stage={text!r}"
    parts = text.split(",")
    _need(all(INT_TEXT.fullmatch(p.strip()) for p in parts), f"{given}: give whole numbers separated by commas, "
                                                            "e.g. 0,3,3,2")
    counts = tuple(int(p) for p in parts)
    _need(len(counts) == stages, f"{given}: {len(counts)} numbers for the schedule's {stages} stages "
                                 "(pp*stages_per_rank); give one per stage")
    _need(all(c >= 0 for c in counts), f"{given}: a stage cannot hold a negative number of blocks")
    _need(sum(counts) == cfg.model.layers, f"{given}: adds up to {sum(counts)} blocks, the model has "
                                           f"layers={cfg.model.layers}; make them add up")
    empty = [s for s in range(1, stages - 1) if counts[s] == 0]
    _need(not empty, f"{given}: stage {empty[0] if empty else 0} would hold nothing (only the first stage, with "
                     "the embedding, and the last, with the head, may hold no block)")
    return counts


def offload_policy(cfg: TrainConfig) -> Any:
    """The offload policy of ``[schedule]``, with its stall budget (``max_stall``)."""
    from pipeoffload.policies import OffloadPolicy

    return replace(OffloadPolicy.parse(cfg.schedule.offload), max_stall=cfg.schedule.max_stall)


def schedule_options(cfg: TrainConfig) -> dict[str, Any]:
    return {"group_size": cfg.schedule.group_size} if cfg.schedule.group_size else {}


# A schedule generator's refusals as train names what it set: its keys (train_model's config, the TOML's
# flat keys) and, on the command line, their flags (``num_ranks`` is ``pp``, ``--pp``); group_size is the
# one family option train sets.
SCHEDULE_NAMES = {"num_ranks": "pp", "num_microbatches": "microbatches"}
FAMILY_OPTIONS = ("group_size",)


def _check_schedule(cfg: TrainConfig, gpt: bool, resumed: bool) -> None:
    """Generate and lower the schedule once here, so a bad combination fails before any rank starts."""
    from pipeoffload.errors import renaming
    from pipeoffload.passes.lower import lower
    from pipeoffload.schedules import check_options, generate, get_spec

    s = cfg.schedule
    with renaming(SCHEDULE_NAMES):
        check_options(get_spec(s.family), schedule_options(cfg), settable=FAMILY_OPTIONS)
        schedule = generate(s.family, cfg.parallel.pp, s.microbatches, s.stages_per_rank, **schedule_options(cfg))
    lower(schedule, offload=offload_policy(cfg), recompute=s.recompute)
    stages = schedule.num_stages
    layers = cfg.model.layers
    if cfg.parallel.layers_per_stage:
        _need(gpt, "layers_per_stage: only for the built-in models (gpt, llama, hf:DIR); train_model takes the "
                   "stages' layer counts itself (counts=)")
        blocks_per_stage(cfg, stages)  # ConfigError naming what does not add up
        return
    if not gpt or layers + 2 >= stages:
        return

    def fix(n: Naming) -> str:
        fewer = f"use fewer stages ({n('pp')}, {n('stages_per_rank')})"
        if cfg.model.source.startswith("hf:"):
            return f"{fewer}: its config.json sets layers"
        if resumed:  # the checkpoint fixes the model
            return f"{fewer}: a resumed run keeps its {n.given('layers', layers)}"
        return f"use {n('layers')} >= {stages - 2}, or {fewer}"

    raise ConfigError.named(lambda n: (
        f"{n.given('layers', layers)}: the model's {layers + 2} layers (embedding, blocks, head) cannot fill "
        f"{stages} stages ({n('pp')} x {n('stages_per_rank')}); {fix(n)}"))
