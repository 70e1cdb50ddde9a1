"""The decoder: token embedding, pre-norm blocks (RMSNorm, GQA attention, SwiGLU), final norm, tied LM head; with
Gemma's variants as settings (model.norm_offset, sandwich_norms, ffn_activation, embedding_scale, head_width)."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from data.batches import IGNORE_INDEX
from errors import ConfigError
from model.attention import Attention
from model.attention.layer import mode_of
from model.attention.registry import Backend, Observer, describe, plan
from model.config import ModelConfig
from model.encodings import POSITION_ENCODINGS, PositionEncoding
from model.kv_cache import KVCache
from model.layers import GatedFFN, RMSNorm
from model.loss import linear_cross_entropy, token_cross_entropy
from model.methods import ROPE_SCALINGS, Method, MethodContext, build_methods, method_context, scaling_type
from model.random_positions import sample_positions
from model.runtime_config import DEFAULTS, RuntimeConfig


def share_parameters(target: nn.Module, source: nn.Module, device: torch.device) -> None:
    """Move `target` to `device` and make each of its parameters the very tensor of `source` at the same name (a
    view's encoding holds its model's learned position parameters, not copies); the shapes must agree."""
    target.to(device)
    own = dict(target.named_parameters())
    theirs = dict(source.named_parameters())
    if own.keys() != theirs.keys() or any(own[name].shape != theirs[name].shape for name in own):
        raise ConfigError(f"{type(source).__name__}: these settings change the shape of its parameters; that is a "
                          "different model, not an inference-time change")
    for name, parameter in theirs.items():
        owner, _, leaf = name.rpartition(".")
        target.get_submodule(owner).register_parameter(leaf, parameter)


def forward_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the attention's queries will have: autocast's where it is on for x's device, else x's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps, config.norm_offset)
        self.attention = Attention(config, layer_index)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, config.norm_offset)
        self.ffn = GatedFFN(config.dim, config.ffn_dim, config.ffn_activation)
        self.dropout = nn.Dropout(config.dropout)
        # Sandwich norms (model.sandwich_norms, Gemma 2 and 3): each part's output normalised before its residual add.
        if config.sandwich_norms:
            self.attention_out_norm = RMSNorm(config.dim, config.norm_eps, config.norm_offset)
            self.ffn_out_norm = RMSNorm(config.dim, config.norm_eps, config.norm_offset)
        else:
            self.attention_out_norm = self.ffn_out_norm = nn.Identity()

    def forward(
        self, x: torch.Tensor, encoding: PositionEncoding, encoding_state: Any, kv_cache: KVCache | None,
        methods: MethodContext | None = None, pass_states: list[Any] | None = None, keep: int = 0,
        backend: Backend | None = None,
    ) -> torch.Tensor:
        """keep > 0: only the last `keep` rows go on through the feed-forward part and are returned (the rows
        before them still serve as keys and values). backend: the attention's (the model's choice for this mode)."""
        x = x + self.dropout(self.attention_out_norm(self.attention(
            self.attention_norm(x), encoding, encoding_state, kv_cache, methods=methods, pass_states=pass_states,
            backend=backend)))
        if keep:
            x = x[:, -keep:]
        return x + self.dropout(self.ffn_out_norm(self.ffn(self.ffn_norm(x))))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, runtime: RuntimeConfig | None = None, trunk: "Transformer | None" = None,
                 observer: Observer | None = None) -> None:
        """`runtime`: how, not what, this model computes (whether long RoPE rotations, norms and scored log-sum-exps
        run compiled), given by the caller (a run's [runtime]); None: the defaults (a view: its trunk's). Chosen
        here, kept by the model and its views (a view shares its trunk's norms, and so their setting).

        `trunk`: build a view of that model (view()): its embeddings, layers, norm and head, the very modules, with
        position encodings (sharing the trunk's position parameters), attention methods and backends built here
        from `config`; None: a model of its own, initialised. `observer`: a diagnostic's view (with_observer)."""
        super().__init__()
        self.config = config  # checked, and completed, when it was built (ModelConfig.check_plugins)
        self.runtime = (trunk.runtime if trunk is not None else DEFAULTS) if runtime is None else runtime
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim) if trunk is None else trunk.tok_embeddings
        self.observer = observer  # with one, the attention is computed explicitly and the probabilities read
        self.build_view_parts(config)
        if trunk is not None:
            self.layers, self.norm, self.lm_head = trunk.layers, trunk.norm, trunk.lm_head
            device = trunk.tok_embeddings.weight.device
            for name in dict.fromkeys([config.position, *config.position_layers]):  # every encoding it uses
                share_parameters(self.encoding_of(name), trunk.encoding_of(name), device)
            self.train(trunk.training)
            return
        self.layers = nn.ModuleList(Block(config, index) for index in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, config.norm_offset)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        for module in self.modules():
            if isinstance(module, (RMSNorm, GatedFFN)):
                module.compiled = self.runtime.compiled_pointwise
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) for matrices; residual output projections scaled by 1/sqrt(2 * n_layers); token
        embeddings (and the tied head) with the std the position encoding asks for, if it asks."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, parameter in self.named_parameters():
            if parameter.dim() < 2:
                continue
            is_residual = name.endswith("o_proj.weight") or name.endswith("down_proj.weight")
            nn.init.normal_(parameter, mean=0.0, std=residual_std if is_residual else std)
        embedding_std = self.position.token_embedding_std()
        if embedding_std is not None:
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=embedding_std)
        for encoding in self.position_encodings():
            encoding.reset_parameters()

    def build_view_parts(self, config: ModelConfig) -> None:
        """What a model and each of its views build of their own from `config` (the layers and weights are shared):
        the position encodings, the inference-time attention methods and the table of chosen backends.

        `position`: the encoding named by model.position (its parameters keep the names `position.*`, so
        checkpoints of single-encoding models are unchanged); `layer_positions`: the other encodings of a
        per-layer pattern (model.position_layers), by name; absent when there are none."""
        self.position = POSITION_ENCODINGS[config.position](config)
        # inference-time methods (model/methods/), entered only by a model that sets one
        self.attention_methods = build_methods(config) if config.attention_methods else []
        # The attention backend of each layer, chosen once per mode, device, precision and compile state (plan()),
        # and the key of the latest forward's.
        self.backends: dict[tuple, list[Backend]] = {}
        self.latest_backends: tuple | None = None
        others = [name for name in dict.fromkeys(config.position_layers) if name != config.position]  # the pattern's
        if others:
            self.layer_positions = nn.ModuleDict({name: POSITION_ENCODINGS[name](config) for name in others})
        for encoding in self.position_encodings():
            for module in encoding.modules():  # with the encodings an encoding holds (SSMax's RoPE, DAPE's base)
                if isinstance(module, PositionEncoding):
                    module.compiled_rope = self.runtime.compiled_rope

    def position_encodings(self) -> list[PositionEncoding]:
        """Every distinct encoding the model uses, model.position's first."""
        others = getattr(self, "layer_positions", None)  # a per-layer pattern's other encodings, if any
        return [self.position, *(others.values() if others is not None else [])]

    def encoding_of(self, name: str) -> PositionEncoding:
        return self.position if name == self.config.position else self.layer_positions[name]

    def with_rope_scaling(self, scaling: dict | None) -> "Transformer":
        """A view of this RoPE model under another inference-time scaling (no retraining; None = plain RoPE).

        `original_max_position_embeddings` defaults to config.original_length: the length the frequencies were
        set for (for a checkpoint extended with a scaling, the length before extension, not the extended one).
        """
        if "rope_scaling" not in type(self.position).model_settings:
            raise ConfigError(
                f"rope scaling applies to RoPE checkpoints; this one uses position = {self.config.position!r}"
            )
        name = scaling_type(scaling) if scaling is not None else None
        if name in ROPE_SCALINGS and ROPE_SCALINGS[name].needs_original_length:
            scaling = {"original_max_position_embeddings": self.config.original_length, **scaling}
        return self.with_settings(rope_scaling=scaling)

    def under(self, method: Method, length: int, trained: int) -> "Transformer":
        """This model under an inference-time method (model/methods/) set for evaluating `length` tokens of a model
        trained at `trained`: a view sharing its weights (with_settings); this model itself when the method changes
        nothing."""
        return self.with_settings(**method.changes(self.config.to_dict(), length, trained))

    def with_settings(self, **changes: Any) -> "Transformer":
        """A view of this model under other inference-time settings (rope_scaling, position_args such as the
        learned table's clamp, attention_methods): the same layers and weights, with position encodings and
        attention methods of its own built from the changed config. This model is unchanged; the view is this
        model when nothing changes. Settings that would change a weight's shape are refused."""
        current = self.config.to_dict()
        if all(key in current and current[key] == value for key, value in changes.items()):
            return self
        return self.view(ModelConfig.from_dict({**current, **changes}))

    # Settings the shared layers hold, fixed when they were built: a view cannot change them (it would keep the
    # trunk's silently); a model with another value is another model, built from its config with the same weights.
    LAYER_SETTINGS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "attention_window",
                      "attention_chunk", "qk_norm", "attention_gate", "sink_logits", "norm_eps", "norm_offset",
                      "sandwich_norms", "ffn_activation", "head_width", "attention_scale_dim", "tie_word_embeddings")

    def view(self, config: ModelConfig, observer: Observer | None = None) -> "Transformer":
        """The same layers and weights under `config`'s inference-time settings, with position encodings, attention
        methods and attention backends of its own: a model built from `config` around this one's trunk."""
        held = [name for name in self.LAYER_SETTINGS if getattr(config, name) != getattr(self.config, name)]
        if held:
            raise ConfigError(f"model.{held[0]} is held by the layers a view shares and cannot change in a view "
                              f"({getattr(self.config, held[0])!r} -> {getattr(config, held[0])!r}); build a model "
                              "with it (Transformer(config)) and load these weights into it")
        return Transformer(config, trunk=self, observer=observer)

    def with_observer(self, observer: Observer) -> "Transformer":
        """A view of this model whose attention is computed explicitly, observer(layer, rows, keys, probs) seeing
        each chunk's probabilities (batch, heads, rows, keys): for diagnostics (eval/attention_diagnostics.py)."""
        return self.view(self.config, observer)

    def plan(self, mode: str, device: torch.device, dtype: torch.dtype) -> list[Backend]:
        """Each layer's attention backend in `mode` (train, evaluate, decode: model/attention/registry.py) on
        `device` in `dtype`: chosen at the first forward of that kind, then kept (model/attention/registry.py)."""
        compiling = torch.compiler.is_compiling()
        key = (mode, device.type, dtype, self.training, compiling)
        if key not in self.backends:
            preference = self.config.attention_backend
            names = self.config.layer_encodings
            applies = self.config.layer_methods
            workloads = [layer.attention.workload(mode, device, dtype, self.attention_methods if applies[index] else [],
                                                  self.observer is not None, preference)
                         for index, layer in enumerate(self.layers)]
            self.backends[key] = plan([self.encoding_of(name) for name in names], workloads, self.observer)
        self.latest_backends = key
        return self.backends[key]

    def attention_paths(self) -> dict[str, str]:
        """The attention backend each layer's latest forward took, and why (model/attention/registry.py), with equal
        neighbouring layers merged: {"layers 0-3": "sdpa: ..."}; {} before any forward."""
        if self.latest_backends is None:
            return {}
        return describe({index: backend.describe() for index, backend in enumerate(self.backends[self.latest_backends])})

    def default_positions(self, idx: torch.Tensor, kv_cache: KVCache | None) -> torch.Tensor:
        """The positions of idx's tokens when the caller gives none: 0, 1, 2, ... (after what kv_cache holds), or,
        with model.random_positions = N, a sorted random subset of [0, N) per row (model/random_positions.py); a
        KV cache draws its whole length's positions with its first tokens and hands them out in order."""
        time = idx.shape[1]
        limit = self.config.random_positions
        if not limit:
            return (kv_cache.next_positions(time, idx.device) if kv_cache is not None
                    else torch.arange(time, device=idx.device)[None, :])
        if kv_cache is None:
            return sample_positions(idx, time, limit, self.training, self.config.random_positions_draw)
        if kv_cache.position_plan is None:
            kv_cache.position_plan = sample_positions(idx, kv_cache.max_len, limit, self.training,
                                                      self.config.random_positions_draw)
        if not torch.compiler.is_compiling():  # the bounds check reads the cache's length
            kv_cache.check_room(kv_cache.length + time)
        return kv_cache.position_plan[:, kv_cache.next_positions(time, idx.device)[0]]  # the next slots' positions

    def num_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        loss_reduction: str = "mean",
        return_logits: bool = True,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx: (batch, time) token ids. Returns (logits (batch, time, vocab), loss or None).

        positions: (batch or 1, time) integer positions; default continues after what kv_cache holds.
        targets: (batch, time) ids, IGNORE_INDEX (-100) where no loss is wanted.
        loss_reduction: "mean" over scored tokens, "sum", or "none" for per-token loss (batch, time).
        return_logits=False (with targets, reduction "mean" or "sum", or "none" without gradients): the head and the
        loss run in chunks of rows and never hold the (batch, time, vocab) logits (model/loss.py); the logits
        returned are None.
        logits_to_keep > 0 (transformers' name): logits and loss for the last that many positions only (targets
        may be given for every position or for those); the last block's feed-forward part and the head skip the
        rows before them, whose values are the same either way (each row of those steps is computed alone).
        """
        batch, time = idx.shape
        if not 0 <= logits_to_keep <= time:
            raise ConfigError(f"logits_to_keep must be between 0 and the input length {time}, got {logits_to_keep}")
        keep = 0 if logits_to_keep == time else logits_to_keep
        if positions is None:
            positions = self.default_positions(idx, kv_cache)
        key_positions = kv_cache.add_positions(positions) if kv_cache is not None else positions
        x = self.tok_embeddings(idx)
        if self.config.embedding_scale != 1.0:  # Gemma: sqrt(dim), in the embedding's dtype as transformers has it
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)
        x = self.position.embed(x, positions)
        methods = method_context(self.attention_methods, positions, key_positions) if self.attention_methods else None
        passes = methods.passes if methods is not None else None
        backends = self.plan(mode_of(kv_cache), x.device, forward_dtype(x))
        states: dict[str, Any] = {}  # each encoding prepares once per forward, for all its layers
        last = len(self.layers) - 1
        for index, (layer, name) in enumerate(zip(self.layers, self.config.layer_encodings)):
            encoding = self.encoding_of(name)
            if name not in states:
                states[name] = (encoding.prepare(positions, key_positions), None if passes is None else
                                [encoding.prepare(p.queries, p.keys, all_keys=True) for p in passes])
            applies = self.config.layer_methods[index]  # model.attention_methods_layers
            x = layer(x, encoding, states[name][0], kv_cache, methods if applies else None,
                      states[name][1] if applies else None, keep=keep if index == last else 0,
                      backend=backends[index])
        if kv_cache is not None:
            kv_cache.advance(time)
        if keep:
            batch, time = x.shape[:2]
            if targets is not None and targets.shape[1] != time:
                targets = targets[:, -keep:]
        if not return_logits and targets is not None and loss_reduction in ("mean", "sum"):
            return None, linear_cross_entropy(self.norm(x), self.lm_head.weight, targets, loss_reduction)
        if not return_logits and targets is not None and loss_reduction == "none" and not torch.is_grad_enabled():
            return None, token_cross_entropy(self.norm(x), self.lm_head.weight, targets,
                                             compiled=self.runtime.compiled_pointwise)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(
            logits.float().view(batch * time, -1),
            targets.reshape(batch * time),
            ignore_index=IGNORE_INDEX,
            reduction=loss_reduction,
        )
        if loss_reduction == "none":
            loss = loss.view(batch, time)
        return logits, loss
