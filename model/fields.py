"""Typed dataclass fields from user input: the checks every config (ModelConfig, the run config, an encoding's own
settings, the comparison's) shares, how a command-line value gets its type, and ModelConfig's fields as the
plug-ins read them (ModelFields)."""
from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from typing import Any

from commands import nearest
from errors import ConfigError


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
            hint = ""
            if list in (annotation, typing.get_origin(annotation)) and not isinstance(value, (list, tuple, dict)):
                # a per-layer list given one value: "[value]" applies it to every layer, as the key's docs say
                hint = f"; give a list, e.g. [{json.dumps(value)}] (one value for every layer)"
            raise ConfigError(
                f"{where}.{field.name}: expected {_type_name(annotation)}, got {type(value).__name__} {value!r}{hint}"
            )
        if annotation is float and isinstance(value, int):
            setattr(obj, field.name, float(value))


def check_keys(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values`, once every key is a field of dataclass `cls`: an unknown key is refused with the nearest valid one
    (or, when none is close, the list of them). The caller builds `cls(**values)`."""
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        match = nearest(unknown[0], valid)
        hint = f"did you mean {where}.{match}?" if match else f"valid keys are {valid}"
        raise ConfigError(f"{where}: unknown key(s) {unknown}; {hint}")
    return values


def parse_override_value(text: str) -> Any:
    """A CLI value as TOML (so 3e-4, true, 12 and [1, 2] have their types); anything else is a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def set_dotted(values: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """values[section][key] = value for dotted = "section.key"; a longer name sets a key of a table
    ("model.position_args.t5.max_distance"), creating the tables on the way."""
    section, *names = dotted.split(".")
    if not names or not all([section, *names]):
        raise ConfigError(f"{where}: {dotted!r} must look like section.key")
    table, path = values, ""
    for name in [section, *names[:-1]]:
        path = f"{path}.{name}" if path else name
        table = table.setdefault(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{path}] must be a table of keys, got {table!r}; cannot set {dotted}")
    table[names[-1]] = value


def toml_value(value: Any) -> str:
    """`value` written as TOML (what parse_override_value reads back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def original_length_of(rope_scaling: dict | None, max_seq_len: int) -> int:
    """The context length a model's RoPE frequencies were set for: its scaling's original_max_position_embeddings,
    else max_seq_len (ModelConfig.original_length; the methods read it from a saved config's dict)."""
    return int((rope_scaling or {}).get("original_max_position_embeddings", max_seq_len))


class ModelFields:
    """A model config's fields (ModelConfig, model/config.py, where each is described, is this class's dataclass) and
    what they say layer by layer: a per-layer list repeats over the layers, [] meaning the default in every layer.
    The plug-ins (encodings, methods, the attention layer) name the config they read by this type, so that none
    imports model/config.py, which runs their checks; and reading it from their checks calls nothing in
    model/config.py."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    norm_eps: float
    norm_offset: float
    sandwich_norms: bool
    ffn_activation: str
    embedding_scale: float
    head_width: int
    attention_scale_dim: int
    init_std: float
    tie_word_embeddings: bool
    dropout: float
    position: str
    position_args: dict
    rope_theta: float
    rope_layout: str
    rope_scaling: dict | None
    rope_theta_layers: list
    rope_scaling_layers: list
    position_layers: list
    attention_window: list
    attention_chunk: list
    qk_norm: list
    attention_gate: list
    sink_logits: list
    attention_methods: list
    attention_methods_layers: list
    attention_backend: str
    random_positions: int
    random_positions_draw: int

    # What the fields say layer by layer, and two sizes read from them: plain attributes, computed from the fields on
    # first read and again after a field they depend on changes, so that reading one calls nothing.
    layer_encodings: list[str]  # model.position_layers repeated over the layers, or model.position
    layer_qk_norms: list[bool]  # whether each layer normalises its queries and keys (QK-norm)
    layer_gates: list[bool]  # whether each layer gates its attention output (gated attention)
    layer_rope_thetas: list[float]  # each layer's RoPE theta (model.rope_theta where rope_theta_layers is [])
    layer_rope_scaled: list[bool]  # whether model.rope_scaling applies (every layer where rope_scaling_layers is [])
    layer_methods: list[bool]  # whether model.attention_methods apply (every layer where attention_methods_layers is [])
    layer_sinks: list[bool]  # whether each layer has learned sink logits (gpt-oss)
    layer_windows: list[int]  # the sliding window of every layer (0 = global attention)
    layer_chunks: list[int]  # the attention chunk of every layer (0 = none)
    head_dim: int
    # The context length the RoPE frequencies were set for: a scaling's original_max_position_embeddings (for an
    # extended checkpoint, the length before extension), else max_seq_len. The one accessor for it.
    original_length: int

    def derived(self) -> dict[str, Any]:
        """The values above, from the fields as they stand."""
        def per_layer(values: list, default: Any) -> list:
            pattern = values or [default]
            return [pattern[index % len(pattern)] for index in range(self.n_layers)]

        return {"layer_encodings": per_layer(self.position_layers, self.position),
                "layer_qk_norms": per_layer(self.qk_norm, False),
                "layer_gates": per_layer(self.attention_gate, False),
                "layer_rope_thetas": per_layer(self.rope_theta_layers, self.rope_theta),
                "layer_rope_scaled": per_layer(self.rope_scaling_layers, True),
                "layer_methods": per_layer(self.attention_methods_layers, True),
                "layer_sinks": per_layer(self.sink_logits, False),
                "layer_windows": per_layer(self.attention_window, 0),
                "layer_chunks": per_layer(self.attention_chunk, 0),
                "head_dim": self.head_width or self.dim // self.n_heads,
                "original_length": original_length_of(self.rope_scaling, self.max_seq_len)}

    def __getattr__(self, name: str) -> Any:
        # reached only when `name` is not set: a derived value not computed yet (or dropped by a change below)
        if name not in DERIVED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.__dict__.update(self.derived())
        return self.__dict__[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DERIVED:
            raise AttributeError(f"{name} is derived from the model's fields: set those instead")
        changed = name in DERIVED_FROM and self.__dict__.get(name, value) != value
        object.__setattr__(self, name, value)
        if changed:
            for derived in DERIVED:
                self.__dict__.pop(derived, None)


DERIVED = ("layer_encodings", "layer_qk_norms", "layer_gates", "layer_rope_thetas", "layer_rope_scaled",
           "layer_methods", "layer_sinks",
           "layer_windows", "layer_chunks", "head_dim", "original_length")
DERIVED_FROM = {"n_layers", "position", "position_layers", "qk_norm", "attention_gate", "rope_theta",
                "rope_theta_layers", "rope_scaling_layers", "sink_logits", "attention_window", "attention_chunk", "dim",
                "n_heads", "rope_scaling", "max_seq_len", "head_width", "attention_methods_layers"}
