"""Shape of a Llama-family decoder (Llama 2/3, Qwen2, Qwen3, Mistral, Phi-3), without torch.

One record for three readers: the trainable model (``models.llama``), the Hugging Face reader and
writer (``models.hf``) and the planner's presets (``planner.presets``, through ``model_spec``), so a
model's shapes are written once. ``from_hf`` maps a Hugging Face ``config.json`` onto it and refuses,
with one line naming the field, anything the model cannot reproduce exactly (mixtures of experts,
unknown rope types, other activations, sliding windows but Mistral's and Phi-3's). Qwen3 adds an RMSNorm over the head
width on every query and key head before RoPE (``qk_norm``) and takes transformers' Qwen3Config defaults
for the fields a config.json leaves out (``head_dim`` 128, 32 key/value heads, ...). Mistral's sliding window is kept
(``sliding_window``): attention here is full causal, which is the window's own attention on sequences of
at most that many tokens, so a run trains only such sequences (``train`` checks) and ``generate`` keeps at
most that many tokens of context. Phi-3 (``Phi3ForCausalLM``: Phi-3-mini/medium, Phi-4) is Llama's layer with
q, k and v fused into one ``qkv_proj`` and gate and up into one ``gate_up_proj`` in the checkpoint (``fused``:
``hfdir`` splits them on load and fuses them again on export); it slides its window in every layer whenever
``sliding_window`` is set (Phi-3-mini-4k's 2047), which is kept as Mistral's is; its LongRoPE (the 128k
models), a partial rotary factor (Phi-4-mini) and dropout are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeoffload.errors import ConfigError

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                 "MistralForCausalLM": "mistral", "Phi3ForCausalLM": "phi3"}
QWEN3, PHI3 = "Qwen3ForCausalLM", "Phi3ForCausalLM"
# max_position_embeddings where config.json leaves it out: transformers' default of each config class (an export
# writes the field, so it must be the value transformers read from the source folder)
_DEFAULT_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768, "Qwen3ForCausalLM": 32768,
                      "MistralForCausalLM": 4096 * 32, PHI3: 4096}
_DEFAULT_EPS = {PHI3: 1e-5}  # rms_norm_eps where config.json leaves it out: 1e-6 in the other config classes
# token ids where config.json leaves them out: the config class's defaults (LlamaConfig and MistralConfig: bos 1,
# eos 2; Phi3Config: bos 1, eos and pad 32000; Qwen2Config and Qwen3Config: none). The padding id is the
# embedding row left untrained and the end-of-sequence id ends every document: the defaults matter
_DEFAULT_TOKEN_IDS = {PHI3: {"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000},
                      "LlamaForCausalLM": {"bos_token_id": 1, "eos_token_id": 2},
                      "MistralForCausalLM": {"bos_token_id": 1, "eos_token_id": 2}}
# num_key_value_heads where config.json leaves it out (null: the query heads, in every class): LlamaConfig's
# default is the query heads, Qwen2Config's and Qwen3Config's 32, MistralConfig's 8
_DEFAULT_KV_HEADS = {"Qwen2ForCausalLM": 32, "Qwen3ForCausalLM": 32, "MistralForCausalLM": 8}
_QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim where config.json leaves it out (not hidden // heads)
_MAX_WINDOW_LAYERS = 28  # Qwen2Config's and Qwen3Config's max_window_layers where config.json leaves it out
# the architectures whose every layer slides the window whenever sliding_window is set (whatever use_sliding_window
# says) -> their config class's sliding_window where config.json leaves it out
_WINDOWED: dict[str, int | None] = {"MistralForCausalLM": 4096, PHI3: None}
_DROPOUTS = ("attention_dropout", "resid_pdrop", "embd_pdrop")  # Phi3Config's (the others': attention_dropout)
# the usual config.json keys of a mixture of experts (Mixtral, Qwen2-MoE, DeepSeek, ...), besides moe_*
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok")


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1's RoPE frequency scaling (``rope_type = "llama3"``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


@dataclass(frozen=True)
class LlamaShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int = 0  # 0: heads (multi-head attention)
    ffn_hidden: int = 0  # 0: the Llama rule (8/3 * hidden rounded up to a multiple of 256)
    head_dim: int = 0  # 0: hidden // heads
    rope_theta: float = 10000.0
    rope_scaling: Llama3Scaling | None = None
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: biases on q, k and v only
    o_bias: bool = False  # Llama's and Qwen3's attention_bias: a bias on o_proj too (with qkv_bias)
    mlp_bias: bool = False  # Llama's mlp_bias: biases on gate_proj, up_proj and down_proj
    max_positions: int = 4096
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None  # transformers' padding_idx: that embedding row gets no gradient
    sliding_window: int = 0  # Mistral's attention window (config.json's sliding_window, in tokens); 0: none

    def __post_init__(self) -> None:
        for key in ("vocab", "hidden", "layers", "heads"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model {key}={value!r}: must be an integer >= 1")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise ConfigError(f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                              "pick heads that divide hidden")
        if self.heads % self.n_kv_heads:
            raise ConfigError(f"model heads={self.heads} is not a multiple of kv_heads={self.n_kv_heads}; "
                              "pick kv_heads dividing heads")
        if self.dim_head % 2:
            raise ConfigError(f"model head_dim={self.dim_head} is odd; rotary embeddings need an even head size")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"model architecture={self.architecture!r}: must be one of {', '.join(ARCHITECTURES)}")

    @property
    def qk_norm(self) -> bool:
        """Qwen3's RMSNorm over the head width on each query and key head (q_norm, k_norm), before RoPE."""
        return self.architecture == QWEN3

    @property
    def fused(self) -> bool:
        """Phi-3's checkpoint layout: q, k and v rows in one ``qkv_proj``, gate then up rows in one ``gate_up_proj``
        (the model here keeps them apart: the same products, so tensor parallelism splits them as Llama's)."""
        return self.architecture == PHI3

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def context(self) -> int:
        """The most tokens one sequence may hold here: the declared positions, and no more than a sliding
        window (within it, full causal attention is the window's)."""
        return min(self.max_positions, self.sliding_window) if self.sliding_window else self.max_positions

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        return 256 * -(-(8 * self.hidden // 3) // 256)

    # ---- Hugging Face config.json --------------------------------------------------------------
    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> LlamaShape:
        """The shape of a Hugging Face ``config.json``; ``ConfigError`` naming the first field we cannot honour."""
        check_object(cfg, where)
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        archs = cfg.get("architectures") or ([by_type[cfg["model_type"]]] if cfg.get("model_type") in by_type else [])
        arch = archs[0] if len(archs) == 1 else None
        if arch not in ARCHITECTURES:
            raise ConfigError(f"{where}: architectures={archs!r} is not supported; supported: "
                              f"{', '.join(ARCHITECTURES)}")
        _refuse_unsupported(cfg, arch, where)
        theta, scaling = _rope(cfg, arch, where)
        def need(key: str) -> int:
            if key not in cfg:
                raise ConfigError(f"{where}: field {key} is missing; it is required for {arch}")
            return json_int(cfg[key], key, where)

        kv = cfg.get("num_key_value_heads", _DEFAULT_KV_HEADS.get(arch))
        vocab = need("vocab_size")
        biased = arch in ("LlamaForCausalLM", QWEN3) and json_bool(cfg, "attention_bias", False, where)
        return cls(
            vocab=vocab, hidden=need("hidden_size"), layers=need("num_hidden_layers"),
            heads=need("num_attention_heads"), kv_heads=0 if kv is None else json_int(kv, "num_key_value_heads", where),
            ffn_hidden=need("intermediate_size"), head_dim=_head_dim(cfg, arch, where),
            rope_theta=theta, rope_scaling=scaling,
            rms_eps=json_float(cfg.get("rms_norm_eps", _DEFAULT_EPS.get(arch, 1e-6)), "rms_norm_eps", where),
            tie_embeddings=json_bool(cfg, "tie_word_embeddings", False, where),
            qkv_bias=arch == "Qwen2ForCausalLM" or biased, o_bias=biased,
            mlp_bias=arch == "LlamaForCausalLM" and json_bool(cfg, "mlp_bias", False, where),
            max_positions=json_int(cfg.get("max_position_embeddings", _DEFAULT_POSITIONS[arch]), "max_position_embeddings",
                                   where),
            architecture=arch, sliding_window=_window(cfg, arch, where),
            **_token_ids(cfg, vocab, where, _DEFAULT_TOKEN_IDS.get(arch, {})),
        )

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` that transformers reads back into this shape."""
        model_type = ARCHITECTURES[self.architecture]
        out: dict[str, Any] = {
            "architectures": [self.architecture], "model_type": model_type, "vocab_size": self.vocab,
            "hidden_size": self.hidden, "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.n_kv_heads, "intermediate_size": self.ffn, "head_dim": self.dim_head,
            "hidden_act": "silu", "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings, "max_position_embeddings": self.max_positions,
            "torch_dtype": "float32", "use_cache": True,
        }
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_positions}
            out["rope_scaling"] = dict(rope)
        out["rope_parameters"] = rope
        if model_type in ("llama", "qwen3"):
            if self.qkv_bias != self.o_bias:  # attention_bias is all four projections' or none
                raise ConfigError(f"model qkv_bias={self.qkv_bias} with o_bias={self.o_bias}: {self.architecture} "
                                  "has biases on q, k, v and o together or on none; set both alike")
            out["attention_bias"] = self.o_bias
        if model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        elif self.architecture in _WINDOWED:
            out["sliding_window"] = self.sliding_window or None
        else:
            out.update(use_sliding_window=False, sliding_window=None)
        if self.fused:
            out.update({key: 0.0 for key in _DROPOUTS})
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self, key) is not None or self.architecture in _DEFAULT_TOKEN_IDS:  # null, not Phi3's default
                out[key] = getattr(self, key)
        return out

    # ---- the planner's view --------------------------------------------------------------------
    def model_spec(self, name: str, seq: int) -> Any:
        """The planner's ``ModelSpec`` of this shape (SwiGLU, no dropout; the biases and q/k norms it has)."""
        from pipeoffload.planner.model import ModelSpec

        return ModelSpec(name=name, layers=self.layers, hidden=self.hidden, heads=self.heads,
                         kv_heads=self.n_kv_heads, head_size=self.head_dim or None, ffn=self.ffn, seq=seq,
                         vocab=self.vocab, gated_mlp=True, dropout=False, bias=False, qkv_bias=self.qkv_bias,
                         o_bias=self.o_bias, mlp_bias=self.mlp_bias, qk_norm=self.qk_norm,
                         tied_embeddings=self.tie_embeddings, rotary_positions=self.max_positions,
                         attention_window=self.sliding_window)


def _head_dim(cfg: dict[str, Any], arch: str, where: str) -> int:
    if arch in (QWEN3, PHI3):  # Qwen3Config's head_dim is 128 where absent, whatever hidden // heads is; Phi3's
        # attention reads an absent one as hidden // heads and a null one as none (and fails)
        explicit = cfg.get("head_dim", _QWEN3_HEAD_DIM if arch == QWEN3 else None)
        if explicit is None and "head_dim" in cfg:
            raise ConfigError(f"{where}: head_dim=None: {arch} needs its per-head width (transformers reads null as "
                              "none and fails); write it, e.g. hidden_size / num_attention_heads")
    else:
        explicit = cfg.get("head_dim")
    if explicit or explicit == 0:
        if json_int(explicit, "head_dim", where) < 1:
            raise ConfigError(f"{where}: head_dim={explicit!r}: must be an integer >= 1 (the per-head width)")
    return set_apart_head_dim(explicit, int(cfg["num_attention_heads"]), int(cfg["hidden_size"])) or 0


def _token_ids(cfg: dict[str, Any], vocab: int, where: str, defaults: dict[str, int]) -> dict[str, Any]:
    """``bos_token_id``, ``eos_token_id`` (one id or a list) and ``pad_token_id`` of config.json, each a JSON
    integer or null (``defaults``: the config class's where config.json leaves one out). The end-of-sequence id
    ends every document of the data and the padding id is the embedding's ``padding_idx`` (as in transformers,
    from -vocab as ``nn.Embedding`` takes it), so both must be token ids of the vocabulary; the
    beginning-of-sequence id is only carried to an export."""
    absent = [key for key in defaults if key not in cfg]
    if absent:  # a refusal says the id is a default, so the fix is to write it
        cfg, where = {**defaults, **cfg}, f"{where} (leaves out {', '.join(absent)}: the config class's default)"
    bos, eos, pad = (cfg.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id"))
    if bos is not None:
        json_int(bos, "bos_token_id", where)
    for value in (eos if isinstance(eos, list) else [] if eos is None else [eos]):
        if not 0 <= json_int(value, "eos_token_id", where) < vocab:
            held = f" holds {value}, which" if isinstance(eos, list) else ""
            raise ConfigError(f"{where}: eos_token_id={eos!r}{held} is not a token id of vocab_size={vocab} (0 "
                              f"to {vocab - 1}); it ends every document of the data: fix config.json")
    if pad is not None and not -vocab <= json_int(pad, "pad_token_id", where) < vocab:
        raise ConfigError(f"{where}: pad_token_id={pad!r} is not a token id of vocab_size={vocab}; it is the "
                          "embedding row transformers leaves untrained: fix config.json or set it to null")
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (a list, a string, a number, ...)."""
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def check_object(value: Any, where: str) -> None:
    """``value`` (a parsed config.json) is a JSON object, else one line saying what it is."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: holds a JSON {json_kind(value)}, not an object of fields (vocab_size, "
                          "hidden_size, ...); give the model's config.json")


def json_int(value: Any, key: str, where: str) -> int:
    """An integer field of config.json as written (a JSON integer: not 4.7, "64", true or null, which
    ``int()`` would truncate or convert), else one line naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key}={value!r} is not an integer; write a whole number (no fraction, "
                          "no quotes)")
    return value


def json_float(value: Any, key: str, where: str) -> float:
    """A number field of config.json (an integer or a fraction), else one line naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {key}={value!r} is not a number; write a number (no quotes)")
    return float(value)


def json_bool(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    """A true/false field of config.json (``default`` where absent or null), else one line: text such as
    ``"false"`` is true to ``bool()`` and would silently read the opposite of what it says."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key}={value!r} is not true or false; write true or false (no quotes)")
    return value


def set_apart_head_dim(explicit: Any, heads: int, hidden: int) -> int | None:
    """config.json's ``head_dim`` where it sets the attention width apart from the hidden size
    (Mistral-Nemo), else None: the default, hidden // heads."""
    if not explicit or int(explicit) * heads == hidden:
        return None
    return int(explicit)


def moe_field(cfg: dict[str, Any]) -> str | None:
    """The first key saying ``cfg`` is a mixture of experts (a set expert count or ``moe_*`` field), or None."""
    keys = [*_MOE_FIELDS, *(k for k in cfg if k.startswith("moe_"))]
    return next((k for k in keys if cfg.get(k)), None)


def _refuse_unsupported(cfg: dict[str, Any], arch: str, where: str) -> None:
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers' "swish" is the same function as "silu"
        raise ConfigError(f"{where}: hidden_act={act!r} is not supported; the Llama MLP is SwiGLU ('silu')")
    key = moe_field(cfg)
    if key is not None:
        raise ConfigError(f"{where}: {key}={cfg[key]!r}: mixtures of experts are not supported")
    window = cfg.get("sliding_window")
    uses_window = json_bool(cfg, "use_sliding_window", arch in _WINDOWED, where)
    if window is not None and uses_window and arch not in _WINDOWED and not _no_layer_slides(cfg, where):
        raise ConfigError(f"{where}: sliding_window={window!r} with use_sliding_window=true is not supported for "
                          f"{arch} (attention here is full causal, so max_window_layers must be >= num_hidden_layers);"
                          " set use_sliding_window to false if the model was trained without one")
    if "sliding_attention" in (cfg.get("layer_types") or ()):
        raise ConfigError(f"{where}: layer_types has 'sliding_attention': sliding windows are not supported for "
                          f"{arch} (attention here is full causal); mark every layer 'full_attention' if the model "
                          "was trained without one")
    if arch != "LlamaForCausalLM" and json_bool(cfg, "mlp_bias", False, where):
        raise ConfigError(f"{where}: mlp_bias=true is not supported for {arch} (transformers builds its MLP without "
                          "biases); remove the field or set it to false")
    # a dropout the config asks for (transformers' Phi3 applies resid_pdrop in training; embd_pdrop it ignores, so a
    # non-zero one says the checkpoint was meant to train with it)
    for key in (_DROPOUTS if arch == PHI3 else _DROPOUTS[:1]):
        if cfg.get(key):
            raise ConfigError(f"{where}: {key}={cfg[key]!r} is not supported (this model trains without dropout); "
                              "set it to 0")


def _no_layer_slides(cfg: dict[str, Any], where: str) -> bool:
    """Qwen2 and Qwen3 slide their window only in the layers ``layer_types`` marks 'sliding_attention' (where
    config.json leaves it out: those from ``max_window_layers`` on, 28 by default): with none marked, or that
    first layer at or past the layer count, every layer is full causal attention, whatever
    ``use_sliding_window`` says."""
    types = cfg.get("layer_types")
    if types:
        return "sliding_attention" not in types
    first = cfg.get("max_window_layers", _MAX_WINDOW_LAYERS)
    layers = cfg.get("num_hidden_layers")
    if first is None or layers is None:
        return False
    return json_int(first, "max_window_layers", where) >= json_int(layers, "num_hidden_layers", where)


def _window(cfg: dict[str, Any], arch: str, where: str) -> int:
    """Mistral's or Phi-3's sliding window in tokens (0: none), as transformers' config classes read it:
    MistralConfig 4096 where config.json leaves it out, Phi3Config none, both none where null;
    ``use_sliding_window`` is Qwen2's and changes nothing there (their models slide in every layer whatever it
    says). Other architectures' windows were refused before."""
    if arch not in _WINDOWED:
        return 0
    window = cfg.get("sliding_window", _WINDOWED[arch])
    if window is None:
        return 0
    size = json_int(window, "sliding_window", where)
    if size < 1:
        raise ConfigError(f"{where}: sliding_window={window!r}: must be a number of tokens >= 1, or null for none")
    return size


def _rope(cfg: dict[str, Any], arch: str, where: str) -> tuple[float, Llama3Scaling | None]:
    """(theta, scaling) from ``rope_scaling``/``rope_theta`` or ``rope_parameters`` (transformers >= 5), as
    transformers reads them: ``rope_scaling`` where both are set (``convert_rope_params_to_dict``)."""
    key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"  # transformers reads the first if set
    params = cfg.get(key) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: {key}={params!r} is not an object of rope fields (rope_type, rope_theta, ...)")
    theta = json_float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)), "rope_theta", where)
    if not 0 < theta < math.inf:  # the frequencies are theta ** -(i / d): 0 or below makes every logit NaN
        raise ConfigError(f"{where}: rope_theta={theta!r}: must be a finite number > 0 (RoPE's base frequency, "
                          "e.g. 10000); the model was not trained with this value: fix the file")
    kind = params.get("rope_type", params.get("type", "default"))
    if arch == PHI3:
        _phi3_rope(params, cfg, kind, key, where)
    if kind == "default":  # transformers' Llama, Qwen2 and Mistral rotate the whole head here, whatever a
        return theta, None  # partial_rotary_factor says (their default rope ignores it): the logits agree
    if kind != "llama3":
        raise ConfigError(f"{where}: rope_type={kind!r} is not supported; supported: 'default', 'llama3'")
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if partial is not None and json_float(partial, "partial_rotary_factor", where) != 1.0:
        # transformers' llama3 rope makes frequencies for that share of the head only (and its Llama attention
        # then fails on the shapes): there is no model of it to equal
        raise ConfigError(f"{where}: partial_rotary_factor={partial!r} is not supported with rope_type 'llama3': "
                          "this Llama-family implementation rotates the whole head")
    for field in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if field not in params:
            raise ConfigError(f"{where}: rope field {field} is missing for rope_type 'llama3'")
    return theta, Llama3Scaling(json_float(params["factor"], "factor", where),
                                json_float(params["low_freq_factor"], "low_freq_factor", where),
                                json_float(params["high_freq_factor"], "high_freq_factor", where),
                                json_int(params["original_max_position_embeddings"],
                                         "original_max_position_embeddings", where))


def _phi3_rope(params: dict[str, Any], cfg: dict[str, Any], kind: Any, key: str, where: str) -> None:
    """Phi-3's rope as transformers' Phi3 reads it: its default rope rotates only ``partial_rotary_factor`` of each
    head (the rest passes through; Phi-4-mini's 0.75), and its only other type is LongRoPE ('longrope', older
    'su' and 'yarn': the 128k-context models' per-frequency short and long factors); neither is modelled here."""
    if kind != "default":
        raise ConfigError(f"{where}: {key} has rope_type={kind!r}, which is not supported for {PHI3} (its default "
                          "rope only; LongRoPE, 'longrope', 'su' or 'yarn', is the 128k-context models'): use a "
                          f"checkpoint whose {key} is null (Phi-3-mini-4k, Phi-3-medium-4k, Phi-4)")
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if partial is not None and json_float(partial, "partial_rotary_factor", where) != 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor={partial!r} is not supported for {PHI3} (it rotates "
                          "only that share of each head, as Phi-4-mini does; this model rotates the whole head): use "
                          "a checkpoint with 1.0 or none")


def _planner_seq(shape: LlamaShape) -> int:
    """The sequence length a preset is planned at unless ``--seq`` says otherwise: its context (the declared
    positions, and no more than a sliding window, within which full causal attention, which the planner's
    formulas model, is the window's: Phi-3-mini-4k's 2047), at most 8192."""
    return min(shape.context, 8192)


# Well-known Llama-family models, from their published config.json files: the planner's presets
# (``planner.presets``) are built from this table, so their shapes are those the model trains with.
PRESETS: dict[str, LlamaShape] = {
    "llama2-7b": LlamaShape(vocab=32000, hidden=4096, layers=32, heads=32, ffn_hidden=11008, max_positions=4096,
                            bos_token_id=1, eos_token_id=2),
    "llama3-8b": LlamaShape(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, ffn_hidden=14336,
                            rope_theta=500000.0, max_positions=8192, bos_token_id=128000, eos_token_id=128001),
    "llama3-70b": LlamaShape(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8, ffn_hidden=28672,
                             rope_theta=500000.0, max_positions=8192, bos_token_id=128000, eos_token_id=128001),
    "llama3-405b": LlamaShape(vocab=128256, hidden=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248,
                              rope_theta=500000.0, rope_scaling=Llama3Scaling(), max_positions=131072,
                              bos_token_id=128000, eos_token_id=128001),
    "qwen2.5-0.5b": LlamaShape(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, ffn_hidden=4864,
                               rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=True, qkv_bias=True,
                               max_positions=32768, architecture="Qwen2ForCausalLM", eos_token_id=151643),
    "qwen2.5-7b": LlamaShape(vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4, ffn_hidden=18944,
                             rope_theta=1000000.0, rms_eps=1e-6, qkv_bias=True, max_positions=32768,
                             architecture="Qwen2ForCausalLM", eos_token_id=151643),
    # Qwen3: q/k norms, head_dim 128 set apart from hidden / heads (0.6B: 16 x 128 = 2048 != 1024)
    "qwen3-0.6b": LlamaShape(vocab=151936, hidden=1024, layers=28, heads=16, kv_heads=8, ffn_hidden=3072,
                             head_dim=128, rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=True,
                             max_positions=40960, architecture=QWEN3, bos_token_id=151643, eos_token_id=151645),
    "qwen3-8b": LlamaShape(vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8, ffn_hidden=12288,
                           rope_theta=1000000.0, rms_eps=1e-6, max_positions=40960, architecture=QWEN3,
                           bos_token_id=151643, eos_token_id=151645),
    "mistral-7b": LlamaShape(vocab=32768, hidden=4096, layers=32, heads=32, kv_heads=8, ffn_hidden=14336,
                             rope_theta=1000000.0, max_positions=32768, architecture="MistralForCausalLM",
                             bos_token_id=1, eos_token_id=2),
    # microsoft/Phi-3-mini-4k-instruct: fused qkv/gate_up in its checkpoint (the same products), every layer
    # slides a 2047-token window, so it is planned at 2047 tokens and a longer --seq is refused
    "phi3-mini": LlamaShape(vocab=32064, hidden=3072, layers=32, heads=32, kv_heads=32, ffn_hidden=8192,
                            max_positions=4096, architecture=PHI3, bos_token_id=1, eos_token_id=32000,
                            pad_token_id=32000, sliding_window=2047),
}


def preset_specs() -> dict[str, Any]:
    """The planner's ``ModelSpec`` of every preset in ``PRESETS``, planned at ``min(context, 8192)`` (the
    positions, or a sliding window below them)."""
    return {name: shape.model_spec(name, _planner_seq(shape)) for name, shape in PRESETS.items()}
