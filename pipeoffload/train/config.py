"""The training configuration: one flat record, read from TOML and flags, validated before any rank starts.

Keys are the ``pipeoffload train`` flags with ``-`` replaced by ``_`` (the interface shared with
``pipeoffload plan --emit``). ``validate`` raises ``ConfigError`` with one line naming the key, the
rule and the fix. This module never imports torch, so a bad value is refused in milliseconds.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py3.10
    import tomli as tomllib

DEFAULT_TIMEOUT = 120.0  # seconds: a loaded 2-core CPU machine can take tens of seconds for one step


@dataclass(frozen=True)
class TrainConfig:
    # pipeline
    schedule: str = "1f1b"
    stages_per_rank: int = 0  # 0: the family's own default
    group_size: int = 0  # group-interleaved only; 0: the family's default
    offload: str = "none"
    recompute: str = "none"
    offload_ratio: float = 0.0  # k for the placement pass's cost model; 0: the default cost model
    # parallelism
    pp: int = 1
    dp: int = 1
    tp: int = 1
    zero: int = 0
    # batch and steps
    microbatches: int = 4
    global_batch: int = 8
    steps: int = 100
    stop_at: int = 0  # stop (save, exit) after this step though `steps` sets the LR schedule; 0: run to the end
    seed: int = 0
    # model (reference GPT)
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    seq_len: int = 64
    # data
    data: str = ""
    tokenizer: str = "byte"
    val_fraction: float = 0.05
    eval_batches: int = 2
    # run
    nproc: int = 0  # 0: world size from torchrun's env, else one process
    out: str = ""
    timeout: float = DEFAULT_TIMEOUT
    eval_every: int = 50
    save_every: int = 100
    keep: int = 2
    lr: float = 3e-4
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0  # global gradient-norm clip; 0: off
    progress: bool = True

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


KEYS = tuple(f.name for f in fields(TrainConfig))
_TYPES = {f.name: type(getattr(TrainConfig(), f.name)) for f in fields(TrainConfig)}
# What makes two runs' checkpoints interchangeable: the model, the data and its order. The layout
# (pp, dp, tp, schedule, policies, zero) may change on resume: DCP reshards by parameter name.
FINGERPRINT_KEYS = ("layers", "hidden", "heads", "seq_len", "data", "tokenizer", "val_fraction", "seed",
                    "global_batch")


def _coerce(key: str, value: Any) -> Any:
    kind = _TYPES[key]
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
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        return str(value)
    raise ConfigError(f"{key}={value!r}: must be {'an integer' if kind is int else kind.__name__}")


def load_toml(path: str | Path) -> dict[str, Any]:
    """The keys of a flat TOML file; unknown keys are refused (a typo must not pass silently)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {str(p)!r}: no such file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"--config {str(p)!r}: not valid TOML ({str(err).splitlines()[0]})") from None
    return data


def build_config(*layers: dict[str, Any]) -> TrainConfig:
    """Defaults, then each mapping in turn (TOML, then flags); ``None`` values are skipped."""
    values: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            if key not in _TYPES:
                raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(KEYS)}")
            values[key] = _coerce(key, value)
    return replace(TrainConfig(), **values)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def resolve_stages_per_rank(cfg: TrainConfig) -> TrainConfig:
    """Fill the family's default stages per rank (and check the name)."""
    from pipeoffload.schedules import get_spec

    spec = get_spec(cfg.schedule)  # ConfigError naming the valid families
    v = cfg.stages_per_rank or spec.default_stages_per_rank()
    return replace(cfg, schedule=spec.name, stages_per_rank=v)


def validate(cfg: TrainConfig, *, data_exists: bool = True, gpt: bool = True) -> TrainConfig:
    """Check every rule; return the config with defaults resolved. One ``ConfigError`` line per failure."""
    from pipeoffload.policies import OffloadPolicy, RecomputePolicy

    for key in ("pp", "dp", "tp", "microbatches", "global_batch", "steps", "layers", "hidden", "heads", "seq_len",
                "eval_every", "save_every", "keep", "eval_batches"):
        value = getattr(cfg, key)
        _need(value >= 1, f"{key}={value}: must be >= 1")
    for key in ("stages_per_rank", "group_size", "nproc", "warmup", "seed", "stop_at"):
        value = getattr(cfg, key)
        _need(value >= 0, f"{key}={value}: must be >= 0")
    _need(cfg.zero in (0, 1), f"zero={cfg.zero}: must be 0 or 1 (1: ZeroRedundancyOptimizer over the dp group)")
    _need(cfg.lr > 0, f"lr={cfg.lr}: must be > 0")
    _need(cfg.timeout > 0, f"timeout={cfg.timeout}: must be > 0 seconds")
    _need(cfg.clip >= 0, f"clip={cfg.clip}: must be >= 0 (0 turns clipping off)")
    _need(0 < cfg.val_fraction < 0.5, f"val_fraction={cfg.val_fraction}: must be in (0, 0.5)")
    _need(0 <= cfg.min_lr_ratio <= 1, f"min_lr_ratio={cfg.min_lr_ratio}: must be in [0, 1]")
    _need(cfg.hidden % cfg.heads == 0, f"hidden={cfg.hidden}: must be divisible by heads={cfg.heads}")
    if cfg.nproc:
        _need(cfg.nproc == cfg.world,
              f"nproc={cfg.nproc}: world size must equal dp*pp*tp = {cfg.dp}*{cfg.pp}*{cfg.tp} = {cfg.world}; "
              "change --nproc or the layout")
    _need(cfg.global_batch % cfg.dp == 0,
          f"global_batch={cfg.global_batch}: must be divisible by dp={cfg.dp} (sequences per replica)")
    per_replica = cfg.global_batch // cfg.dp
    _need(per_replica % cfg.microbatches == 0,
          f"microbatches={cfg.microbatches}: must divide the {per_replica} sequences per replica "
          f"(global_batch/dp); e.g. microbatches={_divisor_near(per_replica, cfg.microbatches)}")
    if cfg.tp > 1:
        _need(cfg.heads % cfg.tp == 0, f"tp={cfg.tp}: must divide heads={cfg.heads}")
        _need(cfg.seq_len % cfg.tp == 0,
              f"seq_len={cfg.seq_len}: sequence parallelism needs it divisible by tp={cfg.tp}")
    _check_tokenizer(cfg.tokenizer)
    if cfg.data and data_exists:
        _need(Path(cfg.data).exists(), f"data={cfg.data!r}: no such file or folder")
    OffloadPolicy.parse(cfg.offload)
    RecomputePolicy.parse(cfg.recompute)
    cfg = resolve_stages_per_rank(cfg)
    _check_schedule(cfg, gpt)
    return cfg


def _divisor_near(n: int, want: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), d))


def _check_tokenizer(text: str) -> None:
    if text == "byte":
        return
    name, _, arg = text.partition(":")
    ok = name == "bpe" and arg.isdigit() and 257 <= int(arg) <= 65535
    _need(ok, f"tokenizer={text!r}: must be 'byte' or 'bpe:N' with 257 <= N <= 65535 (e.g. bpe:1024)")


def schedule_options(cfg: TrainConfig) -> dict[str, Any]:
    return {"group_size": cfg.group_size} if cfg.group_size else {}


def _check_schedule(cfg: TrainConfig, gpt: bool) -> None:
    """Generate and lower the schedule once here, so a bad combination fails before any rank starts."""
    from pipeoffload.passes.lower import lower
    from pipeoffload.schedules import generate

    schedule = generate(cfg.schedule, cfg.pp, cfg.microbatches, cfg.stages_per_rank, **schedule_options(cfg))
    lower(schedule, offload=cfg.offload, recompute=cfg.recompute)
    stages = schedule.num_stages
    _need(not gpt or cfg.layers + 2 >= stages,
          f"layers={cfg.layers}: the GPT's {cfg.layers + 2} layers (embedding, blocks, head) cannot fill "
          f"{stages} stages (pp*stages_per_rank); use layers >= {stages - 2}")


def to_toml(cfg: TrainConfig) -> str:
    lines = ["# pipeoffload train: resolved configuration (flags override; see docs/training.md)"]
    for key, value in cfg.as_dict().items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in FINGERPRINT_KEYS}


def fingerprint_hash(cfg: TrainConfig) -> str:
    return hashlib.sha256(json.dumps(fingerprint(cfg), sort_keys=True).encode()).hexdigest()[:16]
