"""ModelConfig: everything that defines a model's shape, validated on creation and saved as config.json."""
from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from errors import ConfigError
from model.attention_methods import ATTENTION_METHODS, check_applies, normalize_methods
from model.position import POSITION_ENCODINGS, SINUSOIDAL_RECIPES
from model.position_rotary import RoPE
from model.rope import normalize_rope_scaling


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation))


def _value_matches(value: Any, annotation: Any) -> bool:
    """True when `value` is acceptable for a field annotated with `annotation` (int is accepted for float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_value_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, annotation)


def check_field_types(obj: Any, where: str) -> None:
    """Raise ConfigError naming the field when a dataclass field holds a value of the wrong type.

    Ints given for float fields are converted to float so that saved configs are stable.
    """
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        annotation = hints[field.name]
        if not _value_matches(value, annotation):
            raise ConfigError(
                f"{where}.{field.name}: expected {_type_name(annotation)}, got {type(value).__name__} {value!r}"
            )
        if annotation is float and isinstance(value, int):
            setattr(obj, field.name, float(value))


def build_dataclass(cls: type, values: dict[str, Any], where: str) -> Any:
    """Create dataclass `cls` from a dict, rejecting unknown keys with the list of valid ones."""
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys are {valid}")
    return cls(**values)


def parse_override_value(text: str) -> Any:
    """A CLI value as TOML (so 3e-4, true, 12 and [1, 2] have their types); anything else is a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    # 0 picks the Llama rule: 2/3 of 4*dim, rounded up to a multiple of 64 (256 -> 704).
    ffn_dim: int = 0
    # The context length the model is trained at. RoPE, ALiBi etc. can be evaluated beyond it.
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    init_std: float = 0.02
    tie_word_embeddings: bool = True
    dropout: float = 0.0
    # Position encoding, by name: see model.position.POSITION_ENCODINGS.
    position: str = "rope"
    rope_theta: float = 10000.0
    # "half": rotate_half pairs (i, i + d/2) as in transformers; "interleaved": pairs (2i, 2i+1) as in Meta's code.
    rope_layout: str = "half"
    # RoPE scaling with transformers' rope_parameters keys, e.g. {rope_type = "yarn", factor = 4.0}; see model/rope.py.
    # original_max_position_embeddings defaults to max_seq_len, the context the model is trained at.
    rope_scaling: dict | None = None
    # t5: log-spaced relative-distance buckets, shared across layers.
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    # shaw: relative distances are clipped to [-k, k].
    shaw_max_distance: int = 16
    # learned: table size (0 = max_seq_len); positions past it are an error unless learned_clamp reuses the last row.
    learned_max_positions: int = 0
    learned_clamp: bool = False
    # sinusoidal: how token embeddings meet the fixed sinusoid (model.position.SINUSOIDAL_RECIPES).
    #   "fairseq": token embeddings initialised with std dim^-0.5 and scaled by sqrt(dim) (Vaswani et al., fairseq);
    #   "unscaled": added as they are, std init_std (GPT-2 / transformers style);
    #   "legacy": scaled by sqrt(dim) with std init_std (pelab before 0.2: the sinusoid dominates the input).
    sinusoidal_embedding: str = "fairseq"
    # Rotary variants (rope, xpos). rope_fraction < 1: partial rotary, only the first fraction of each head rotates
    # (GPT-NeoX rotary_pct); rope_p < 1: p-RoPE, the lowest-frequency fraction 1 - p carries no position.
    rope_fraction: float = 1.0
    rope_p: float = 1.0
    # xpos: the decay's scale base gamma (torchscale's scale_base).
    xpos_scale_base: float = 512.0
    # fire: the MLP's hidden width, and the threshold T's initial value (0 = max_seq_len; the public code uses 512).
    fire_mlp_width: int = 32
    fire_threshold: int = 0
    # cope: the number of position embeddings (0 = max_seq_len + 1, the reference's default).
    cope_positions: int = 0
    # Per-layer choices, each a list repeated over the layers (its length must divide n_layers; [] = uniform):
    #   position_layers: the encoding of each layer (e.g. ["rope", "rope", "rope", "none"], iRoPE); it must name
    #     model.position, whose parameters keep their names; absolute encodings (sinusoidal, learned) act on the
    #     whole model and cannot be mixed in;
    #   attention_window: each layer's sliding window in tokens (a query sees itself and the window - 1 keys
    #     before it; 0 = global), e.g. [64, 64, 64, 0] with the list above for RNoPE-SWA.
    position_layers: list = dataclasses.field(default_factory=list)
    attention_window: list = dataclasses.field(default_factory=list)
    # Inference-time attention methods (model/attention_methods.py), e.g. [{method = "logn"}, {method = "rerope",
    # window = 64}]; a parameter given as 0 is derived from the trained length. [] = attention as trained.
    attention_methods: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check_field_types(self, "model")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads ({self.n_heads}) must be a multiple of model.n_kv_heads ({self.n_kv_heads})"
            )
        if self.ffn_dim < 0:
            raise ConfigError(f"model.ffn_dim must be >= 0 (0 = automatic), got {self.ffn_dim}")
        if self.ffn_dim == 0:
            hidden = int(2 * 4 * self.dim / 3)
            self.ffn_dim = 64 * ((hidden + 63) // 64)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ConfigError("model.norm_eps, model.init_std and model.rope_theta must be positive")
        if self.rope_layout not in ("half", "interleaved"):
            raise ConfigError(f"model.rope_layout must be 'half' or 'interleaved', got {self.rope_layout!r}")
        if self.rope_scaling is not None:
            if self.position != "rope":
                raise ConfigError(f"model.rope_scaling applies to position = 'rope', not {self.position!r}")
            try:
                self.rope_scaling = normalize_rope_scaling(self.rope_scaling, self.max_seq_len)
            except ConfigError as error:
                raise ConfigError(f"model.rope_scaling: {error}") from error
        if self.learned_max_positions < 0:
            raise ConfigError(f"model.learned_max_positions must be >= 0 (0 = max_seq_len), got {self.learned_max_positions}")

        if self.sinusoidal_embedding not in SINUSOIDAL_RECIPES:
            raise ConfigError(f"model.sinusoidal_embedding must be one of {sorted(SINUSOIDAL_RECIPES)}, "
                              f"got {self.sinusoidal_embedding!r}")
        if self.position not in POSITION_ENCODINGS:
            raise ConfigError(
                f"model.position: unknown encoding {self.position!r}; valid names are {sorted(POSITION_ENCODINGS)}"
            )
        self.check_layer_lists()
        used = set(self.layer_positions())
        # Defaults that depend on L become numbers, so a later change of max_seq_len (an extension) cannot move them.
        if "fire" in used and self.fire_threshold == 0:
            self.fire_threshold = self.max_seq_len
        if "cope" in used and self.cope_positions == 0:
            self.cope_positions = self.max_seq_len + 1
        for name in dict.fromkeys([self.position, *self.position_layers]):
            POSITION_ENCODINGS[name].validate(self)
        rotary = any(issubclass(POSITION_ENCODINGS[name], RoPE) for name in self.layer_positions())
        if not 0 < self.rope_fraction <= 1 or not 0 <= self.rope_p <= 1:
            raise ConfigError(f"model.rope_fraction must be in (0, 1] and model.rope_p in [0, 1], "
                              f"got {self.rope_fraction} and {self.rope_p}")
        if (self.rope_fraction, self.rope_p) != (1.0, 1.0) and not rotary:
            raise ConfigError("model.rope_fraction and model.rope_p apply to rotary encodings (rope, xpos); "
                              f"this model uses {sorted(set(self.layer_positions()))}")
        self.attention_methods = normalize_methods(self.attention_methods, self.original_length)
        for entry in self.attention_methods:
            check_applies(ATTENTION_METHODS[entry["method"]], self)

    def check_layer_lists(self) -> None:
        for name in ("position_layers", "attention_window"):
            values = getattr(self, name)
            if values and self.n_layers % len(values):
                raise ConfigError(f"model.{name} has {len(values)} entries, which does not divide model.n_layers "
                                  f"({self.n_layers}); give one entry per layer or a pattern that repeats evenly")
        if any(not isinstance(name, str) for name in self.position_layers):
            raise ConfigError(f"model.position_layers must hold encoding names, got {self.position_layers}")
        unknown = [name for name in self.position_layers if name not in POSITION_ENCODINGS]
        if unknown:
            raise ConfigError(f"model.position_layers: unknown encoding(s) {unknown}; "
                              f"valid names are {sorted(POSITION_ENCODINGS)}")
        if self.position_layers:
            if self.position not in self.position_layers:
                raise ConfigError(f"model.position_layers {self.position_layers} must include model.position "
                                  f"({self.position!r}), the encoding whose parameters keep their names")
            whole_model = sorted({name for name in self.position_layers if not POSITION_ENCODINGS[name].per_layer})
            if whole_model:
                raise ConfigError(f"model.position_layers: {whole_model} act on the token embeddings of the whole "
                                  "model and cannot be chosen per layer; use relative or rotary encodings")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in self.attention_window):
            raise ConfigError(f"model.attention_window must hold integers >= 0 (0 = global), "
                              f"got {self.attention_window}")

    def layer_positions(self) -> list[str]:
        """The encoding of every layer: model.position_layers repeated over the layers, or model.position."""
        pattern = self.position_layers or [self.position]
        return [pattern[index % len(pattern)] for index in range(self.n_layers)]

    def layer_windows(self) -> list[int]:
        """The sliding window of every layer (0 = global attention)."""
        pattern = self.attention_window or [0]
        return [pattern[index % len(pattern)] for index in range(self.n_layers)]

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def original_length(self) -> int:
        """The context length the RoPE frequencies were set for: a scaling's original_max_position_embeddings
        (for an extended checkpoint, the length before extension), else max_seq_len. The one accessor for it."""
        scaling = self.rope_scaling or {}
        return int(scaling.get("original_max_position_embeddings", self.max_seq_len))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        return build_dataclass(cls, values, "model")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        try:
            values = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not valid JSON ({error}); re-save the checkpoint") from error
        return cls.from_dict(values)
