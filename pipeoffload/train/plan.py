"""``pipeoffload train --plan auto --memory GIB [--gpu NAME]``: ask the planner, then train its choice.

The planner (pure Python) searches layouts (pp x tp x dp over ``--nproc`` ranks), schedules and
offload/recompute policies for the model the run will train (the reference GPT, the Llama model of
the config keys, or an ``hf:DIR`` folder's ``config.json``, read by the planner's own reader) under
the memory budget. The keys the user gave (flags and ``--config``) are constraints of the search, not
values laid over its result: the plan chosen is the fastest one that keeps all of them, and where no
plan does, the run is refused in one line naming them. The plan fills every other layout/schedule key.
"""
from __future__ import annotations

import importlib.util
import math
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import SCHEDULE_NAMES, TrainConfig, check_recompute, flag_of

DEFAULT_GPU = "a100"
# the keys a plan sets, in the order they are reported
PLANNED = ("pp", "tp", "dp", "schedule", "stages_per_rank", "group_size", "offload", "recompute", "microbatches")


def planner_model(cfg: TrainConfig) -> Any:
    """The planner's ``ModelSpec`` of the model this config trains, at its sequence length, microbatch 1,
    with train's blocks (``planner.trainblocks``: the bytes they save in the run's ``dtype``, its
    attention: GPT written out, Llama-family SDPA)."""
    from pipeoffload.planner import ModelSpec
    from pipeoffload.planner.emit import DTYPES, train_blocks
    from pipeoffload.train.family import hf_path, kind, shape_from_keys

    m, family = cfg.model, kind(cfg.model.source)
    if family == "hf":
        from pipeoffload.planner.hfconfig import model_from_hf_config

        path = hf_path(m.source)
        assert path is not None
        spec = model_from_hf_config(path)  # the reader of `pipeoffload plan --model hf:DIR`
    elif family == "llama":
        spec = shape_from_keys(m, _tokenizer_vocab(cfg.data.tokenizer)).model_spec("llama", m.seq_len)
    else:
        spec = ModelSpec(name="gpt", layers=m.layers, hidden=m.hidden, heads=m.heads, seq=m.seq_len,
                         vocab=m.vocab or _tokenizer_vocab(cfg.data.tokenizer))
    return train_blocks(spec.with_(seq=m.seq_len, microbatch=1), DTYPES[m.dtype])


def planner_setup(cfg: TrainConfig) -> Any:
    """The planner's ``TrainingSetup`` of this run (``planner.emit.train_setup``): AdamW's moments sharded
    over the dp replicas only with ``zero`` or ``fsdp``."""
    from pipeoffload.planner.emit import train_setup

    p = cfg.parallel
    return train_setup(distributed_optimizer=bool(p.zero or p.fsdp))


def _tokenizer_vocab(tokenizer: str) -> int:
    """The vocabulary of a byte or ``bpe:N`` tokenizer (256 for anything else: validation names a bad one)."""
    name, _, size = tokenizer.partition(":")
    return int(size) if name == "bpe" and size.isdigit() else 256


def _hardware(gpu: str | None) -> Any:
    from pipeoffload.planner import hardware_preset
    from pipeoffload.planner.hardware import HARDWARE_PRESETS

    try:
        return hardware_preset(gpu or DEFAULT_GPU)
    except ConfigError:
        raise ConfigError(f"--gpu {gpu!r}: not a GPU preset of --plan auto; use one of "
                          f"{', '.join(HARDWARE_PRESETS)} (default {DEFAULT_GPU})") from None


def _divisors(n: int) -> list[int]:
    return [x for x in range(1, n + 1) if n % x == 0]


def _norm(flat: str, value: Any) -> Any:
    """A planned key's value in one spelling (policies as their parsers print them)."""
    from pipeoffload.policies import OffloadPolicy, RecomputePolicy
    from pipeoffload.schedules import get_spec

    if flat == "offload":
        return str(OffloadPolicy.parse(str(value)))
    if flat == "recompute":
        return str(RecomputePolicy.parse(str(value)))
    if flat == "schedule":
        return get_spec(str(value)).name
    return value


def _fixed_text(fixed: dict[str, Any]) -> str:
    return " ".join(f"{flag_of(k)} {v}" for k, v in fixed.items())


def planned_config(cfg: TrainConfig, memory_gib: float | None, gpu: str | None, explicit: set[str]) -> TrainConfig:
    """The config with the keys of the plan ``plan_run`` chooses."""
    return plan_run(cfg, memory_gib, gpu, explicit)[0]


def plan_run(cfg: TrainConfig, memory_gib: float | None, gpu: str | None,
             explicit: set[str]) -> tuple[TrainConfig, str]:
    """The config with the keys of the fastest plan that keeps ``explicit``, and the line that says what was
    chosen (``train`` prints it with the resolved configuration, once every check has passed, so that a
    refusal after the search stays its one line)."""
    from pipeoffload.planner.emit import offload_ratio, plan_split
    from pipeoffload.planner.hardware import GIB
    from pipeoffload.planner.report import memory_text

    if memory_gib is None or not (math.isfinite(memory_gib) and memory_gib > 0):
        given = "" if memory_gib is None else f"--memory {memory_gib:g}: "
        raise ConfigError(f"{given}--plan auto needs --memory GIB (a finite number > 0): the per-GPU memory "
                          "budget to plan for")
    if "recompute" in explicit:  # a partial form is refused as validate refuses it, not searched for
        check_recompute(cfg.schedule.recompute)
    hardware = _hardware(gpu)
    if memory_gib * GIB > hardware.memory_bytes:  # the request's own refusal named neither flag
        raise ConfigError(f"--memory {memory_gib:g}: above the {hardware.memory_bytes / GIB:.2f} GiB of --gpu "
                          f"{hardware.name}; give at most that, or the --gpu the budget is for")
    ranks = cfg.parallel.nproc or cfg.world
    model = planner_model(cfg)
    # 0 for v or g means the family's own: not a constraint
    fixed = {k: _norm(k, cfg.get(k)) for k in PLANNED
             if k in explicit and not (k in ("stages_per_rank", "group_size") and cfg.get(k) == 0)}
    _check_fixed_tp(cfg, fixed)
    given_split = cfg.parallel.layers_per_stage if "layers_per_stage" in explicit else ""
    stages = len(given_split.split(",")) if given_split else 0  # a given split fixes pp*v
    pairs = _stage_layouts(cfg, fixed, _layouts(cfg, fixed, ranks, hardware), stages)
    _check_fixed(cfg, fixed, pairs, ranks)
    base = dict(hardware=hardware, gpus=ranks, global_batch=cfg.data.global_batch, memory_budget=memory_gib * GIB,
                setup=planner_setup(cfg))
    if stages:  # each pp with the v that makes the stages given: a fixed v for that pp's search
        requests = [r for pp in sorted({pp for pp, _ in pairs}) for r in
                    _requests(cfg, dict(fixed, stages_per_rank=stages // pp), model, [x for x in pairs if x[0] == pp],
                              base)]
    else:
        requests = _requests(cfg, fixed, model, pairs, base)
    found = _best_keeping(requests, fixed)
    if found is None:
        split = f"--layers-per-stage {cfg.parallel.layers_per_stage}" if stages else ""
        kept = " ".join(filter(None, (_fixed_text(fixed), split, _sharding_text(cfg))))
        keep = f" keeping {kept}" if kept else ""
        fix = "leave some of those keys to the planner, " if kept else ""
        raise ConfigError(f"--plan auto: no plan for {ranks} ranks{keep} fits {memory_gib:g} GiB per GPU on "
                          f"{hardware.name}; {fix}raise --memory, use more ranks (--nproc) or a smaller model")
    plan, request = found
    chosen = _chosen(plan)
    updates = {k: v for k, v in chosen.items() if k not in fixed}
    if "schedule" in updates:  # a new family alone would reset stages_per_rank to the family's own (``updated``)
        updates["stages_per_rank"] = chosen["stages_per_rank"]
    c = plan.choice
    updates["max_stall"] = c.offload.max_stall  # the budget stays only where the chosen plan uses it
    if c.offload.kind != "none" and "offload_ratio" not in explicit:  # copies planned for the planner's link
        updates["offload_ratio"] = round(offload_ratio(request, plan), 4)
    if "layers_per_stage" not in explicit:  # the split the plan was costed with (none without a pipeline)
        updates["layers_per_stage"] = ",".join(map(str, plan_split(request, plan))) if plan.layout.pp > 1 else ""
    summary = (f"--plan auto chose {', '.join(f'{k}={v}' for k, v in chosen.items())} "
               f"({plan.tokens_per_second:.0f} tokens/s predicted, {memory_text(plan.memory.total, 2)} per GPU, "
               f"model {model.name})")
    if cfg.schedule.max_stall > 0 and not c.offload.max_stall:  # given, searched, and dropped: said, not silent
        summary += f"; --max-stall {cfg.schedule.max_stall:g} is not used by the plan chosen (max_stall = 0)"
    return cfg.updated(nproc=ranks if cfg.parallel.nproc else 0, **updates), summary


def _check_fixed_tp(cfg: TrainConfig, fixed: dict[str, Any]) -> None:
    """A ``--tp`` given for a Llama-family model, checked by the model's rule (it divides the key/value heads
    and the MLP width) before the search: the planner only searches layouts the model can take, so a tp
    breaking the rule was refused as if no plan fitted the memory budget."""
    from pipeoffload.train.config import check_llama_tp
    from pipeoffload.train.family import kind, run_shape

    if "tp" in fixed and kind(cfg.model.source) in ("llama", "hf"):
        check_llama_tp(cfg, run_shape(cfg.model, _tokenizer_vocab(cfg.data.tokenizer), None))


def _layouts(cfg: TrainConfig, fixed: dict[str, Any], ranks: int, hardware: Any) -> list[tuple[int, int]]:
    """The (pp, tp) pairs of ``ranks`` the explicit layout keys allow (tp within a node, and only 1
    where this install has no tensor parallelism); one line if there is none."""
    p = cfg.parallel
    tp_ok = importlib.util.find_spec("pipeoffload.models.tensor_parallel") is not None
    pps = [p.pp] if "pp" in fixed else _divisors(ranks)
    tps = [p.tp] if "tp" in fixed else [t for t in _divisors(ranks) if t <= hardware.gpus_per_node and (tp_ok or t == 1)]
    pairs = [(pp, tp) for pp in pps for tp in tps if ranks % (pp * tp) == 0
             and ("dp" not in fixed or ranks // (pp * tp) == p.dp) and _shards(cfg, ranks // (pp * tp), tp)]
    if not pairs:
        keys = " ".join(filter(None, (_fixed_text({k: fixed[k] for k in ("pp", "tp", "dp") if k in fixed}),
                                      _sharding_text(cfg))))
        rules = "; --fsdp needs dp >= 2 and tp 1" if cfg.parallel.fsdp else "; --zero 1 needs tp 1" if cfg.parallel.zero else ""
        raise ConfigError(f"--plan auto: {keys} cannot split the {ranks} ranks (dp*pp*tp must equal --nproc {ranks}"
                          f"{rules}); change --nproc or leave a layout key to the planner")
    return pairs


def _stage_layouts(cfg: TrainConfig, fixed: dict[str, Any], pairs: list[tuple[int, int]],
                   stages: int) -> list[tuple[int, int]]:
    """The layouts whose pp (times a fixed v) can make the ``stages`` a given ``--layers-per-stage`` lists
    (validate refused the plan's layout after the search); one line if none can."""
    if not stages:
        return pairs
    kept = [(pp, tp) for pp, tp in pairs
            if stages % pp == 0 and fixed.get("stages_per_rank", stages // pp) == stages // pp]
    if not kept:
        keys = _fixed_text({k: fixed[k] for k in ("pp", "tp", "dp", "stages_per_rank") if k in fixed})
        keeping = f" keeping {keys}" if keys else ""
        raise ConfigError(f"--plan auto: --layers-per-stage {cfg.parallel.layers_per_stage} lists {stages} stages, "
                          f"which no layout of the ranks{keeping} has (pp*stages_per_rank: pp in "
                          f"{sorted({pp for pp, _ in pairs})}); give one number per stage of such a layout, or leave "
                          "--layers-per-stage to the planner")
    return kept


def _shards(cfg: TrainConfig, dp: int, tp: int) -> bool:
    """Whether the layout can run the config's ZeRO or FSDP (validate's rules): neither shards tensor-parallel
    stages, and FSDP needs two replicas; the search keeps to such layouts, so the plan is not refused after it."""
    p = cfg.parallel
    return not ((p.zero or p.fsdp) and tp > 1) and not (p.fsdp and dp < 2)


def _sharding_text(cfg: TrainConfig) -> str:
    return " ".join(flag for flag, on in (("--fsdp", cfg.parallel.fsdp), ("--zero 1", cfg.parallel.zero)) if on)


def _check_fixed(cfg: TrainConfig, fixed: dict[str, Any], pairs: list[tuple[int, int]], ranks: int) -> None:
    """The schedule keys the user fixed (family, v, g, microbatches), checked by the rules a run without
    --plan applies (the family's generator), before the search: where no allowed layout can keep them, the
    refusal names the rule (``stages_per_rank=3: zb-v uses V placement ...``), not a memory budget that no
    plan fits. Only where every allowed layout and microbatch count breaks a rule; the first one is said."""
    from pipeoffload.planner.candidates import family_stages_per_rank
    from pipeoffload.planner.plans import default_families
    from pipeoffload.schedules import generate, get_spec

    if not fixed.keys() & {"schedule", "stages_per_rank", "group_size"}:
        return
    if "schedule" in fixed:
        families: tuple[str, ...] = (fixed["schedule"],)
    else:
        families = default_families()
        if "group_size" in fixed:  # only a family with a group size can keep one
            families = tuple(f for f in families if "group_size" in get_spec(f).options) or families
        if "stages_per_rank" in fixed:
            v = fixed["stages_per_rank"]
            families = tuple(f for f in families if v in family_stages_per_rank(f, (v,))) or families
    gb = cfg.data.global_batch
    first: ConfigError | None = None
    for family in families:
        spec = get_spec(family)
        v = fixed.get("stages_per_rank") or spec.default_stages_per_rank()
        options = {"group_size": fixed["group_size"]} if "group_size" in fixed else {}
        for pp, tp in pairs:
            dp = ranks // (pp * tp)
            if "microbatches" in fixed:
                counts = [cfg.schedule.microbatches]
            else:  # the planner's choice: a few of the counts that divide the replica's batch, largest first
                counts = [m for m in _divisors(gb // dp) if gb % dp == 0][::-1][:3]
            for m in counts:
                try:
                    generate(family, pp, m, v, **options)
                    return
                except ConfigError as err:
                    first = first or err
    if first is not None:  # in train's words (``--pp 4``, not the generator's ``num_ranks=4``)
        raise first.renamed(SCHEDULE_NAMES).prefixed("--plan auto")


def _requests(cfg: TrainConfig, fixed: dict[str, Any], model: Any, pairs: list[tuple[int, int]],
              base: dict[str, Any]) -> list[Any]:
    """The planner requests that search the allowed layouts under the explicit schedule, v, g and policy
    keys (a fixed v searches only the families that can have it, a fixed g only those with a group size):
    one for all of them, or one per layout where a fixed dp or microbatch count sets its microbatch size;
    none where no family can keep v."""
    from pipeoffload.planner import PlanRequest
    from pipeoffload.planner.candidates import family_stages_per_rank
    from pipeoffload.planner.plans import default_families

    offload: tuple[str, ...] | None = (fixed["offload"],) if "offload" in fixed else None
    recompute: tuple[str, ...] | None = (fixed["recompute"],) if "recompute" in fixed else None
    if offload is not None and recompute is None:  # the other policy stays the planner's to choose
        recompute = ("none", "first:1", "auto")
    elif recompute is not None and offload is None:
        offload = ("none", "auto")
    schedules: tuple[str, ...] | None = (fixed["schedule"],) if "schedule" in fixed else None
    stages_per_rank: tuple[int, ...] = (2, 4)
    if "stages_per_rank" in fixed:
        v = fixed["stages_per_rank"]
        stages_per_rank = (v,)
        schedules = tuple(f for f in schedules or default_families() if v in family_stages_per_rank(f, (v,)))
        if not schedules:
            return []
    base = dict(base, schedules=schedules, stages_per_rank=stages_per_rank,
                group_sizes=(fixed["group_size"],) if "group_size" in fixed else None,
                offload=offload, recompute=recompute, max_stall=cfg.schedule.max_stall, top=1)
    if "dp" not in fixed and "microbatches" not in fixed:
        return [PlanRequest(model=model, pp_sizes=tuple(sorted({pp for pp, _ in pairs})),
                            tp_sizes=tuple(sorted({tp for _, tp in pairs})), **base)]
    gb, ranks = cfg.data.global_batch, base["gpus"]
    requests = []
    for pp, tp in pairs:
        dp = ranks // (pp * tp)
        size = 1
        if "microbatches" in fixed:
            m = cfg.schedule.microbatches
            if gb % dp or (gb // dp) % m:
                continue
            size = gb // dp // m
        requests.append(PlanRequest(model=model.with_(microbatch=size), pp_sizes=(pp,), tp_sizes=(tp,), **base))
    return requests


def _best_keeping(requests: list[Any], fixed: dict[str, Any]) -> tuple[Any, Any] | None:
    """The fastest fitting plan, over ``requests``, that keeps every explicit key, with its request (the
    requests search only such plans; the check guards that), and whose copies the run makes
    (``run_keeps_plan``: at a small model's large k the run's copy lane may make none of them, keeping
    on the device what the plan counted off it) unless the offload policy is the user's."""
    from pipeoffload.planner import find_plans
    from pipeoffload.planner.emit import run_keeps_plan

    found: list[tuple[Any, Any]] = []
    for request in requests:
        try:
            result = find_plans(request)
        except ConfigError:  # nothing fits this layout (or no layout of it): the others may
            continue
        for plan in result.fitting:
            if (all(_norm(k, v) == fixed[k] for k, v in _chosen(plan).items() if k in fixed)
                    and ("offload" in fixed or run_keeps_plan(request, plan))):
                found.append((plan, request))
                break
    return min(found, key=lambda pr: pr[0].sort_key()) if found else None


def _chosen(plan: Any) -> dict[str, Any]:
    c = plan.choice
    return {"pp": plan.layout.pp, "tp": plan.layout.tp, "dp": plan.layout.dp, "schedule": c.family,
            "stages_per_rank": c.stages_per_rank, "group_size": c.group_size or 0,
            "offload": str(c.offload), "recompute": str(c.recompute), "microbatches": plan.microbatches}
