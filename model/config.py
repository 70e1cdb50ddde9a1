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
from model.position import POSITION_ENCODINGS, SINUSOIDAL_RECIPES
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
        POSITION_ENCODINGS[self.position].validate(self)

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
