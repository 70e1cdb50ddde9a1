"""ModelConfig: everything that defines a model's shape, its own fields validated on creation, saved as config.json.

Plain data: importing this module loads no registry and not torch. Building a config checks its own fields first,
then what belongs to a plug-in (an encoding's settings, the RoPE scaling, the attention methods, the backend's
name), once, by the plug-ins' own checks in their kinds' front files (ModelConfig.check_plugins): a model, a view
or a checkpoint's config is never checked again. This module names no encoding, scaling or method.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from errors import ConfigError
from model.fields import ModelFields, check_field_types, check_keys
from model.legacy_keys import migrate_saved, refuse_legacy_keys

# The gated feed-forward part's activations (model/layers.py's ACTIVATIONS holds the functions): SwiGLU's, GeGLU's.
FFN_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass
class ModelConfig(ModelFields):
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
    # Gemma's conventions (each off by default, as in Llama; the Gemma 3 import sets them, infer/gemma.py):
    #   norm_offset: every RMSNorm scales by (norm_offset + weight), the product taken in float32 before the cast
    #     back (Gemma: 1.0, its gains stored as offsets from 1, zero at initialisation); 0.0: by weight (Llama);
    #   sandwich_norms: a block also normalises its attention's and its feed-forward part's outputs before each
    #     residual add (Gemma 2 and 3: post_attention_layernorm, post_feedforward_layernorm);
    #   ffn_activation: the gate's activation in the gated feed-forward part: "silu" (SwiGLU, Llama) or "gelu_tanh"
    #     (GeGLU with the tanh approximation, Gemma's gelu_pytorch_tanh);
    #   embedding_scale: the token embeddings are multiplied by it before the first block (Gemma: sqrt(dim)), the
    #     tied head using the unscaled table;
    #   head_width: the width of each attention head, transformers' head_dim (0 = dim / n_heads; Gemma 3 270M: 256
    #     with dim 640 and 4 heads); model.head_dim, derived, is the width in use;
    #   attention_scale_dim: the logits are q.k / sqrt(attention_scale_dim) (Gemma's query_pre_attn_scalar;
    #     0 = head_dim, the usual 1/sqrt(head_dim)).
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    ffn_activation: str = "silu"
    embedding_scale: float = 1.0
    head_width: int = 0
    attention_scale_dim: int = 0
    init_std: float = 0.02
    tie_word_embeddings: bool = True
    dropout: float = 0.0
    # Position encoding, by name: one of the registry's (model/encodings/).
    position: str = "rope"
    # Settings of the encodings this model uses, a table per encoding, each checked (and completed with its
    # defaults) by the encoding's own Settings (model/encodings/NAME.py), e.g. {t5 = {max_distance = 64}}, or
    # --model.position_args.t5.max_distance=64 on the command line. The saved config lists every setting.
    position_args: dict = dataclasses.field(default_factory=dict)
    # RoPE's model-level settings (transformers' names, shared with the Hugging Face mapping and the scalings):
    rope_theta: float = 10000.0
    # "half": rotate_half pairs (i, i + d/2) as in transformers; "interleaved": pairs (2i, 2i+1) as in Meta's code.
    rope_layout: str = "half"
    # RoPE scaling with transformers' rope_parameters keys, e.g. {rope_type = "yarn", factor = 4.0}; see model/rope.py.
    # original_max_position_embeddings defaults to max_seq_len, the context the model is trained at.
    rope_scaling: dict | None = None
    # Per-layer RoPE (Gemma 3: local layers at theta 10k, global ones at 1M, the scaling on the global ones only),
    # each a list repeated over the layers like position_layers: rope_theta_layers, each layer's theta ([] = rope_theta
    # everywhere); rope_scaling_layers, whether model.rope_scaling applies to each layer ([] = to every layer).
    rope_theta_layers: list = dataclasses.field(default_factory=list)
    rope_scaling_layers: list = dataclasses.field(default_factory=list)
    # Per-layer choices, each a list repeated over the layers (its length must divide n_layers; [] = uniform):
    #   position_layers: the encoding of each layer (e.g. ["rope", "rope", "rope", "none"], iRoPE); it must name
    #     model.position, whose parameters keep their names; absolute encodings (sinusoidal, learned) act on the
    #     whole model and cannot be mixed in;
    #   attention_window: each layer's sliding window in tokens (a query sees itself and the window - 1 keys
    #     before it; 0 = global), e.g. [64, 64, 64, 0] with the list above for RNoPE-SWA;
    #   qk_norm: whether each layer normalises its queries and keys, per head, with RMSNorm (a learned gain over
    #     head_dim) before the position encoding (QK-norm as in Gemma 3, Qwen 3 and OLMo 2), e.g. [true] for every
    #     layer; a list with no true is stored as [].
    position_layers: list = dataclasses.field(default_factory=list)
    attention_window: list = dataclasses.field(default_factory=list)
    #   attention_chunk: each layer's attention chunk in tokens (a query sees the keys of its own chunk of that many
    #     tokens, up to itself: Llama 4's chunked attention; 0 = global), e.g. [8192, 8192, 8192, 0] with
    #     position_layers ["rope", "rope", "rope", "none"] for iRoPE; a layer has a window or a chunk, not both.
    attention_chunk: list = dataclasses.field(default_factory=list)
    qk_norm: list = dataclasses.field(default_factory=list)
    # Gated attention (Qiu et al. 2025; Qwen3-Next), per layer like qk_norm: each head's attention output multiplied,
    # element by element, by sigmoid of a projection of the layer's input, before the output projection.
    attention_gate: list = dataclasses.field(default_factory=list)
    # Learned attention-sink logits (gpt-oss), per layer like qk_norm: one logit per head joins every query's softmax
    # as a key with no value, so a head can attend to nothing.
    sink_logits: list = dataclasses.field(default_factory=list)
    # Inference-time attention methods (model/methods/), e.g. [{method = "logn"}, {method = "rerope",
    # window = 64}]; a parameter given as 0 is derived from the trained length. [] = attention as trained.
    attention_methods: list = dataclasses.field(default_factory=list)
    # Whether model.attention_methods apply to each layer, a list repeated over the layers like rope_scaling_layers
    # ([] = every layer): a hybrid's global layers only (Gemma 3's import: its local layers never see a distance
    # past their window), or every layer.
    attention_methods_layers: list = dataclasses.field(default_factory=list)
    # How attention is computed, not what: "auto" (each layer's fastest backend by the measured rules) or a backend's
    # name (sdpa, sdpa_mask, explicit, merged, flex), taken wherever it can compute a layer's attention
    # (model/attention/registry.py). Checked where the model is built.
    attention_backend: str = "auto"
    # Randomized positions (Ruoss et al. 2023; model/random_positions.py): N > 0 makes each sequence's position ids a
    # sorted random subset of [0, N), in training and evaluation, so an encoding meets the position values of
    # sequences up to N tokens while training at max_seq_len. 0 = positions 0, 1, 2, ...
    random_positions: int = 0
    # Which draw an evaluation takes (with random_positions): each row's positions are a function of its tokens and
    # of this number, so another value scores the same model on another draw. Training draws are not affected.
    random_positions_draw: int = 0

    def __post_init__(self) -> None:
        check_field_types(self, "model")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.head_width < 0 or self.attention_scale_dim < 0:
            raise ConfigError(f"model.head_width ({self.head_width}) and model.attention_scale_dim "
                              f"({self.attention_scale_dim}) must be >= 0 (0 = dim / n_heads, and the head's width)")
        if not self.head_width and self.dim % self.n_heads:
            raise ConfigError(f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads}), or give "
                              "each head its width with model.head_width")
        if self.ffn_activation not in FFN_ACTIVATIONS:
            raise ConfigError(f"model.ffn_activation must be one of {list(FFN_ACTIVATIONS)}, got "
                              f"{self.ffn_activation!r}")
        if self.embedding_scale <= 0:
            raise ConfigError(f"model.embedding_scale must be positive, got {self.embedding_scale}")
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
        self.check_layer_lists()
        if self.random_positions_draw < 0:
            raise ConfigError(f"model.random_positions_draw is a draw's number >= 0, got {self.random_positions_draw}")
        if self.random_positions and self.random_positions < self.max_seq_len:
            raise ConfigError(f"model.random_positions ({self.random_positions}) draws each sequence's positions from "
                              f"[0, N) and must be at least model.max_seq_len ({self.max_seq_len}); 0 turns it off")
        self.check_plugins()

    def check_plugins(self) -> None:
        """The plug-ins' checks, each in its kind's front file, once, when the config is built: the encodings'
        (model/encodings/), the inference-time methods' (a RoPE scaling, attention methods: only where set) and the
        attention backend's name (model/attention/registry.py). Each returns its part of the config completed (each
        encoding's settings with their defaults, the methods' derived parameters), set here, so a saved config lists
        every setting and building it again changes nothing. Imported here, after the fields above: a typo is refused before torch
        loads."""
        from model.attention.registry import AUTO, check_name
        from model.encodings import check_config as check_encodings

        self.position_args = check_encodings(self)
        if self.rope_scaling is not None or self.attention_methods:
            from model.methods import check_attention_methods, check_scaling

            self.rope_scaling = check_scaling(self)
            self.attention_methods = check_attention_methods(self, self.original_length)
        if self.attention_backend != AUTO:  # "auto" is always valid
            check_name(self.attention_backend)

    # The per-layer lists: each repeats over the layers (its length must divide n_layers); [] means the default.
    LAYER_LISTS = ("position_layers", "attention_window", "attention_chunk", "qk_norm", "attention_gate", "sink_logits",
                   "rope_theta_layers", "rope_scaling_layers", "attention_methods_layers")

    def check_layer_lists(self) -> None:
        for name in self.LAYER_LISTS:
            values = getattr(self, name)
            if values and self.n_layers % len(values):
                raise ConfigError(f"model.{name} has {len(values)} entries, which does not divide model.n_layers "
                                  f"({self.n_layers}); give one entry per layer or a pattern that repeats evenly")
        if any(not isinstance(name, str) for name in self.position_layers):
            raise ConfigError(f"model.position_layers must hold encoding names, got {self.position_layers}")
        if self.position_layers and self.position not in self.position_layers:
            raise ConfigError(f"model.position_layers {self.position_layers} must include model.position "
                              f"({self.position!r}), the encoding whose parameters keep their names")
        for name in ("attention_window", "attention_chunk"):
            if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in getattr(self, name)):
                raise ConfigError(f"model.{name} must hold integers >= 0 (0 = global), got {getattr(self, name)}")
        both = [index for index, (window, chunk) in enumerate(zip(self.layer_windows, self.layer_chunks))
                if window and chunk]
        if both:
            raise ConfigError(f"model.attention_window and model.attention_chunk both limit layer(s) {both}; give each "
                              "layer a sliding window or a chunk, not both (0 in the other list)")
        for name, what in (("qk_norm", "e.g. [true] for every layer"), ("attention_gate", "e.g. [true] for every layer"),
                           ("sink_logits", "e.g. [true] for every layer"),
                           ("rope_scaling_layers", "where model.rope_scaling applies"),
                           ("attention_methods_layers", "where model.attention_methods apply")):
            if any(not isinstance(flag, bool) for flag in getattr(self, name)):
                raise ConfigError(f"model.{name} must hold true or false per layer ({what}), got {getattr(self, name)}")
        for name in ("qk_norm", "attention_gate", "sink_logits"):
            if not any(getattr(self, name)):
                setattr(self, name, [])  # off everywhere: one spelling
        if any(not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0
               for theta in self.rope_theta_layers):
            raise ConfigError(f"model.rope_theta_layers must hold positive numbers (each layer's RoPE theta), got "
                              f"{self.rope_theta_layers}")
        self.rope_theta_layers = [float(theta) for theta in self.rope_theta_layers]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        """From user input (a TOML table, overrides): an encoding setting spelled the old way is refused."""
        refuse_legacy_keys(values)
        return cls(**check_keys(cls, values, "model"))

    @classmethod
    def from_saved(cls, values: dict[str, Any]) -> "ModelConfig":
        """From a saved config (config.json, a run's saved settings), of today or of before model.position_args."""
        return cls.from_dict(migrate_saved(values))

    # Settings that config.json holds only where they differ from their default: a checkpoint that uses none of them
    # keeps the bytes it was written with before they existed, and with them its identity (a study's cells are keyed
    # on a checkpoint's bytes, experiments/use_grid.py's digest). A later setting of the kind joins this list.
    WRITTEN_WHEN_SET = ("norm_offset", "sandwich_norms", "ffn_activation", "embedding_scale", "head_width",
                        "attention_scale_dim", "attention_methods_layers")

    def save(self, path: str | Path) -> None:
        defaults = ModelConfig.__dataclass_fields__
        values = {key: value for key, value in self.to_dict().items()
                  if key not in self.WRITTEN_WHEN_SET or value != _default(defaults[key])}
        Path(path).write_text(json.dumps(values, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        try:
            values = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not valid JSON ({error}); re-save the checkpoint") from error
        return cls.from_saved(values)


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
