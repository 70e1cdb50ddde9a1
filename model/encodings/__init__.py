"""The position encodings: the interface (the base class, its hooks, an encoding's own settings), the registry,
its check of a model's config, and one file per encoding:

    none        NoPE: the causal mask only                       none.py
    alibi       ALiBi's fixed linear distance bias               alibi.py
    t5          T5's learned bias per distance bucket            t5.py
    shaw        Shaw et al.'s learned relative key and value     shaw.py
    sinusoidal  fixed absolute sinusoids added to the input      sinusoidal.py
    learned     a learned absolute table added to the input      learned.py
    kerple      KERPLE's learned log-distance kernel             kerple.py
    fire        FIRE's MLP over normalised distance              fire.py
    cope        CoPE's contextual (gated) positions              cope.py
    rope, xpos  rotary, with partial rotary, p-RoPE; xPos decay  rotary.py
    ssmax       Scalable-Softmax: queries times s log n, no RoPE  ssmax.py
    fox         Forgetting Attention: a forget gate's cumulative  fox.py
                log bias, from the content
    stickbreaking  stick-breaking weights instead of softmax      stickbreaking.py
    dape        an MLP rewrites ALiBi's or KERPLE's bias from the  dape.py
                logits of all heads
    path        PaTH: keys carried to each query through           path.py
                Householder-like transforms from the content
    asentmax    alpha-entmax weights, each query's logits scaled   asentmax.py
                by a learned temperature that grows with log n
    pope        polar positions: softplus magnitudes from the      pope.py
                content, phases from the position alone
    fope        Fourier series over RoPE's frequencies, those      fope.py
                below 2 pi / L clipped
    decoupled   DeepSeek's decoupled RoPE (MLA's position part):   decoupled.py
                rotary q and one shared rotary key beside
                position-free q, k


Hooks (each has a do-nothing default):
  embed(x, positions)                       absolute encodings add to the token embeddings
  prepare(q_positions, k_positions, all_keys)
                                            per-forward state shared by all layers that use this encoding
                                            (e.g. RoPE's cos/sin)
  for_layer(x, state, layer, kv_cache)     the state one layer's attention uses, given that layer's input x
                                            (batch, time, dim): where an encoding's per-layer parameters or
                                            data-dependent quantities (a gate computed from x) join the state;
                                            what it needs of earlier tokens it keeps in the KV cache
                                            (kv_cache.update_extra); the forward's state by default
  encode_queries(q, state), encode_keys(k, state)
                                            what an encoding does to the queries and keys themselves (RoPE and
                                            xPos rotate them, SSMax scales the queries); keys are encoded before
                                            caching, or, when `caches_encoded_keys` is False (dynamic NTK), all
                                            cached raw keys are encoded again at every step
  attention_scores(q, k, state, layer, rows, keys)
                                            when `own_scores` (PaTH): the logits (batch, heads, len(rows),
                                            len(keys)) of the query rows `rows` (q holds those rows) against the
                                            key columns `keys` of all keys k, instead of q.k / sqrt(d): for
                                            designs whose logit of (i, j) is not q_i.k_j plus a bias, such as a
                                            transform accumulated between j and i (PaTH; its forget-gate variant
                                            PaTH-FoX would add FoX's bias through score_bias), or keys transformed
                                            per query in any other way. Called for the chunks of rows in order, so
                                            the state may carry what one chunk computed to the next; what the
                                            encoding keeps of earlier tokens it may write back into the KV cache
                                            (kv_cache.rewrite_keys)
  score_bias(q, state, layer, rows, keys, scores)
                                            additive logit bias (batch|1, heads, len(rows), len(keys)) for the
                                            query rows `rows` of this forward and the key columns `keys` of all
                                            keys attended to; `scores` (the scaled q.k logits, -inf where a key is
                                            hidden) is given when `bias_needs_scores` (CoPE), else None
  attention_weights(scores, state, layer, visible)
                                            the attention weights from the chunk's scores (softmax by default;
                                            an encoding with `own_weights` replaces it: stick-breaking)
  value_term(probs, state, layer, rows, keys)
                                            a term added to the attention output (Shaw's relative values)
  separable_terms(state)                    when `separable_bias` (FoX): the bias as a term of each query less a
                                            term of each key, for FlexAttention (model/attention/flex.py)
  clipped_tables(q, state, layer)           when `clipped_distance` = c > 0 (Shaw): the bias as a function of the
                                            query and min(i - j, c), (batch, heads, time, c + 1), and the value
                                            term's vector per min(i - j, c), (c + 1, head_dim); lets a long
                                            evaluation forward take FlexAttention (model/attention/flex.py)
  reset_parameters()                        re-initialises parameters the reference initialises differently
  constrain_()                              projects the encoding's parameters back onto their domain; the
                                            training loop calls it after every optimizer step (KERPLE's r1, r2 > 0)

The choice of attention backend (model/attention/registry.py) reads two names derived from the capabilities an
encoding declares (`has_score_bias`, `bias_needs_scores`, `bias_from_content`, `separable_bias`, `has_value_term`,
`own_weights`, `own_scores`, `relative_only`, `clipped_distance`): `attention`, what its attention needs (FUSED:
nothing beyond its queries and keys, so the fused kernel; BIAS: an additive score bias, which SDPA takes as a mask;
EXPLICIT: the explicit steps, whose reason the encoding gives as `why_explicit`), and `flex_kind`, the
FlexAttention kernel that serves its long evaluation forwards ("distance", "clipped", "separable" or None:
model/attention/flex.py). `caches_encoded_keys` is read by the attention itself, `reads_positions` by
model.random_positions' check.
`per_layer` is False for encodings that act on the whole model (absolute ones, through `embed`): those cannot be
mixed with others layer by layer.

Settings: an encoding with settings of its own declares them as a dataclass `Settings` (subclass of
EncodingSettings); a model gives them as `model.position_args.NAME` (e.g. `--model.position_args.t5.max_distance=64`),
ModelFields has them checked and completed by the class (check_config below), and the encoding reads them as
`self.settings`. `check_config(config)` refuses model shapes the encoding cannot work with. New encodings live in a
file of their own under model/encodings/, register with `@register_encoding("name")` and add their line to
ENCODING_MODULES; nothing else in the model names them. ModelFields imports this package only when it checks
itself, after its own fields (a typo is refused before torch loads).
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import nn

from errors import ConfigError
from model.fields import check_field_types

if TYPE_CHECKING:
    from model.fields import ModelFields

ALL = slice(None)
# What an encoding's attention needs (PositionEncoding.attention), which names its path (model/attention/registry.py).
FUSED, BIAS, EXPLICIT = "fused", "bias", "explicit"


@dataclass
class Positions:
    """Query positions (batch|1, q_time) and the positions of all keys attended to (batch|1, k_time)."""

    queries: torch.Tensor
    keys: torch.Tensor

    def relative(self, rows: slice, keys: slice = ALL) -> torch.Tensor:
        """key position - query position, (batch|1, len(rows), len(keys))."""
        return self.keys[:, None, keys] - self.queries[:, rows, None]


@dataclass
class EncodingSettings:
    """Base of an encoding's own settings (model.position_args.NAME): typed fields with defaults. Subclasses
    refuse values they cannot take in `check`, and may fill in defaults that depend on the model (0 = derived from
    max_seq_len, say) in `complete`, so that a saved config holds numbers that a later change of the model (an
    extension) cannot move."""

    def check(self, config: ModelFields, where: str) -> None:
        """Raise ConfigError naming `where`.FIELD for a value this encoding cannot take."""

    def complete(self, config: ModelFields) -> None:
        """Replace derived defaults by their values for `config`."""


def settings_from(cls: type[EncodingSettings], values: Any, config: ModelFields, where: str) -> EncodingSettings:
    """`values` (a table of model.position_args) as `cls`, type-checked, checked and completed."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a table of settings, got {values!r}")
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {unknown}; valid settings are {valid}")
    settings = cls(**values)
    check_field_types(settings, where)
    settings.check(config, where)
    settings.complete(config)
    return settings


class PositionEncoding(nn.Module):
    """Base class: no position information at all."""

    name: ClassVar[str] = ""  # the registered name (model/encodings/__init__.py sets it)
    Settings: ClassVar[type[EncodingSettings] | None] = None  # this encoding's own settings, if it has any
    # ModelFields fields beyond the shape that this encoding reads (RoPE: rope_theta, rope_layout, rope_scaling);
    # model.rope_scaling is refused for a model whose model.position does not read it.
    model_settings: ClassVar[tuple[str, ...]] = ()
    per_layer_rope: ClassVar[bool] = False  # it reads model.rope_theta_layers and rope_scaling_layers (rope, xpos)

    why_explicit: ClassVar[str] = ""  # for EXPLICIT: what needs the explicit steps, as the path's reason says it
    has_score_bias = False
    bias_needs_scores = False
    has_value_term = False
    caches_encoded_keys = True
    per_layer = True
    encodes_positions = True  # False: NoPE (Llama 4's temperature tuning acts on such layers only)
    reads_positions = True  # False: nothing of the encoding depends on the position ids (NoPE, FoX, stick-breaking,
    # CoPE), so model.random_positions is refused for a model of such encodings only
    relative_only = True  # False: scores also depend on a query's absolute position (FIRE past its threshold)
    clipped_distance = 0  # c > 0: bias and value term depend on the query and min(i - j, c) only (clipped_tables)
    bias_from_content = False  # True: the bias depends on the tokens (a gate of the layer input), not on positions
    separable_bias = False  # True: the bias is a query's term minus a key's term (separable_terms), FlexAttention's
    own_weights = False  # True: attention_weights replaces softmax (the explicit steps then compute the weights)
    own_scores = False  # True: attention_scores replaces q.k / sqrt(d) (the explicit steps then compute the logits)
    exact_buffers: tuple[str, ...] = ()  # buffers kept in float32 when the model is cast (frequencies, slopes)
    # Whether this encoding's long rotations without gradients may run compiled (model/rope.py's apply_rope):
    # runtime.compiled_rope, set by the model that builds the encoding (Transformer), not read during a forward.
    compiled_rope = True
    # AdamW settings for this encoding's own parameters, if it has any (train/loop.py: position_group_settings):
    # "lr_scale" multiplies train.lr, "weight_decay" replaces train.weight_decay. Chosen by measurement (docs/baselines.md)
    # where docs/baselines.md says so, else the reference implementation's.
    optimizer_defaults: dict[str, float] = {}

    # What its attention needs (which names its backend) and the FlexAttention kernel of its long evaluations
    # (model/attention/flex.py), derived from the capabilities above when the class is defined (__init_subclass__).
    attention: ClassVar[str] = FUSED
    flex_kind: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive `attention`: EXPLICIT for a bias that reads the scores, a value term, or weights or scores of its
        own; BIAS for any other score bias; FUSED without one. And `flex_kind`: a separable bias; none for a bias
        that depends on more than the distance (an absolute position, the content, weights or scores of its own);
        a clipped one (with its value term); a bias of the distance alone."""
        super().__init_subclass__(**kwargs)
        explicit = cls.has_value_term or cls.bias_needs_scores or cls.own_weights or cls.own_scores
        cls.attention = EXPLICIT if explicit else BIAS if cls.has_score_bias else FUSED
        if cls.separable_bias and not explicit:
            cls.flex_kind = "separable"
        elif not cls.relative_only or cls.bias_from_content or cls.own_weights or cls.own_scores:
            cls.flex_kind = None
        elif cls.clipped_distance:
            cls.flex_kind = "clipped"
        else:
            cls.flex_kind = "distance" if cls.has_score_bias and not explicit else None

    def __init__(self, config: ModelFields) -> None:
        super().__init__()
        self.config = config
        # ModelFields has checked and completed those of the encodings it uses: building them again only gives
        # them their type. An encoding built for a config that does not list it (an analysis) takes its defaults.
        self.settings: Any = None
        if self.Settings is not None:
            values = config.position_args.get(self.name)
            self.settings = self.Settings(**values) if values is not None else \
                settings_from(self.Settings, {}, config, f"model.position_args.{self.name}")

    def layers_using(self) -> list[int]:
        """The indices of the layers that use this encoding (all layers, unless model.position_layers mixes)."""
        return [index for index, name in enumerate(self.config.layer_encodings) if name == self.name]

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (torch's signature)
        """Moving or casting the model moves these buffers but keeps them float32: a bf16 inv_freq is a phase error
        that grows with position."""
        kept = {name: getattr(self, name) for name in self.exact_buffers}
        module = super()._apply(fn, recurse)
        for name, value in kept.items():
            setattr(self, name, value.to(device=getattr(self, name).device, dtype=torch.float32))
        return module

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        """Raise ConfigError for a model (shape, model-level settings) this encoding cannot work with; its own
        settings, checked already, are config.position_args[cls.name]."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def token_embedding_std(self) -> float | None:
        """The initial std of the token embeddings this encoding expects (None: model.init_std)."""
        return None

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> Any:
        """State for queries at q_positions and keys at k_positions; all_keys: keys will be encoded at score time,
        all of them (an attention method's pass), not before caching."""
        return Positions(q_positions, k_positions)

    def for_layer(self, x: torch.Tensor, state: Any, layer: int, kv_cache: Any = None) -> Any:
        """The state layer `layer` uses, given its attention input x (batch, time, dim) and the KV cache of this
        forward (None without one): the hooks below receive it as `state`. The forward's state by default."""
        return state

    def encode_queries(self, q: torch.Tensor, state: Any) -> torch.Tensor:
        return q

    def encode_keys(self, k: torch.Tensor, state: Any) -> torch.Tensor:
        return k

    def key_tables(self, state: Any) -> tuple[torch.Tensor, ...] | None:
        """The tensors besides the keys that encode_keys reads, key time at dim -2, such that keys with equal
        tables encode equally (a backend may then keep encoded keys between forwards); None: not in parts."""
        return None

    def keys_from(self, state: Any, start: int) -> Any:
        """The state that encodes the keys from `start` on (for an encoding with key_tables)."""
        raise NotImplementedError(f"{type(self).__name__} does not encode keys in parts")

    def attention_scores(self, q: torch.Tensor, k: torch.Tensor, state: Any, layer: int, rows: slice,
                         keys: slice) -> torch.Tensor:
        """For `own_scores`: the logits (batch, heads, len(rows), len(keys)), at least float32, of the query rows
        `rows` (q: those rows, (batch, heads, len(rows), head_dim)) against the columns `keys` of all keys k
        (batch, heads, keys, head_dim); called for the chunks of rows in order."""
        raise NotImplementedError(f"{type(self).__name__} has no scores of its own")

    def score_bias(self, q: torch.Tensor, state: Any, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor | None:
        return None

    def attention_weights(self, scores: torch.Tensor, state: Any, layer: int,
                          visible: torch.Tensor | None) -> torch.Tensor:
        """The attention weights of a chunk (batch, heads, rows, keys) from its scores, -inf where a key is hidden
        (`visible`: the boolean mask, or None when every key is seen): softmax over the keys."""
        return torch.softmax(scores, dim=-1)

    def value_term(self, probs: torch.Tensor, state: Any, layer: int, rows: slice,
                   keys: slice = ALL) -> torch.Tensor | None:
        return None

    def separable_terms(self, state: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """For `separable_bias`: (the queries' terms (batch, heads, q_time), the keys' terms (batch, heads, k_time)),
        float32, whose difference is the bias of every (query, key) pair."""
        raise NotImplementedError(f"{type(self).__name__} has no separable bias")

    def clipped_tables(self, q: torch.Tensor, state: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For `clipped_distance` = c > 0: (bias (batch, heads, time, c + 1) float32, the bias of query i at
        distance d = min(i - j, c); values (c + 1, head_dim), the value term's vector at d)."""
        raise NotImplementedError(f"{type(self).__name__} sets no clipped_distance")

    def reset_parameters(self) -> None:
        """Initialise this encoding's own parameters where it differs from the model's (called after the model's
        normal(0, init_std) initialisation of every matrix); nothing by default."""

    @torch.no_grad()
    def constrain_(self) -> None:
        """Project parameters onto their domain (after an optimizer step); nothing to do by default."""


# The files of model/encodings/ that register encodings, in the order of the registry (and of its listings).
ENCODING_MODULES = ("none", "alibi", "t5", "shaw", "sinusoidal", "learned", "kerple", "fire", "cope", "rotary",
                    "ssmax", "fox", "stickbreaking", "dape", "path", "asentmax", "pope", "fope",
                    "decoupled")

POSITION_ENCODINGS: dict[str, type[PositionEncoding]] = {}


def register_encoding(name: str) -> Callable[[type[PositionEncoding]], type[PositionEncoding]]:
    def decorator(cls: type[PositionEncoding]) -> type[PositionEncoding]:
        if name in POSITION_ENCODINGS and POSITION_ENCODINGS[name] is not cls:
            raise ValueError(f"position encoding {name!r} is registered twice")
        cls.name = name
        POSITION_ENCODINGS[name] = cls
        return cls

    return decorator


def check_config(config: "ModelFields") -> dict[str, dict]:
    """Check what of `config` belongs to the encodings (the names, the layer pattern, each encoding's demands on the
    model and its own settings) and return model.position_args completed with every setting's default; raise
    ConfigError naming the key. Run by ModelConfig once, when it is built."""
    valid = sorted(POSITION_ENCODINGS)
    if config.position not in POSITION_ENCODINGS:
        raise ConfigError(f"model.position: unknown encoding {config.position!r}; valid names are {valid}")
    unknown = [name for name in config.position_layers if name not in POSITION_ENCODINGS]
    if unknown:
        raise ConfigError(f"model.position_layers: unknown encoding(s) {unknown}; valid names are {valid}")
    whole_model = sorted({name for name in config.position_layers if not POSITION_ENCODINGS[name].per_layer})
    if whole_model:
        raise ConfigError(f"model.position_layers: {whole_model} act on the token embeddings of the whole model and "
                          "cannot be chosen per layer; use relative or rotary encodings")
    used = list(dict.fromkeys(config.layer_encodings))
    given = config.position_args
    if not isinstance(given, dict) or any(not isinstance(values, dict) for values in given.values()):
        raise ConfigError(f"model.position_args holds a table of settings per encoding, e.g. "
                          f"{{t5 = {{max_distance = 64}}}}; got {given!r}")
    stray = [name for name in given if name not in used]
    if stray:
        raise ConfigError(f"model.position_args: settings for {stray}, which this model does not use (it uses "
                          f"{used}); remove them or set model.position")
    if config.random_positions and not any(POSITION_ENCODINGS[name].reads_positions for name in used):
        raise ConfigError(f"model.random_positions: {used} read no position ids (their attention depends on the "
                          "content alone), so randomized positions would change nothing; use it with an encoding "
                          "that reads positions, such as rope, sinusoidal, learned or alibi")
    own = sorted({name for name, sinks in zip(config.layer_encodings, config.layer_sinks)
                  if sinks and POSITION_ENCODINGS[name].own_weights})
    if own:
        raise ConfigError(f"model.sink_logits: {own} compute weights of their own instead of a softmax, which a sink "
                          "logit joins; give the sinks to layers with a softmax encoding")
    for name in used:  # the model's shape first, then the encodings' own settings
        POSITION_ENCODINGS[name].check_config(config)
    completed = {}
    for name in used:
        cls = POSITION_ENCODINGS[name]
        if cls.Settings is None:
            if given.get(name):
                raise ConfigError(f"model.position_args.{name}: {name} has no settings of its own")
            continue
        settings = settings_from(cls.Settings, given.get(name, {}), config, f"model.position_args.{name}")
        completed[name] = dataclasses.asdict(settings)
    if config.rope_theta_layers or config.rope_scaling_layers:
        readers = [name for name in used if "rope_theta" in POSITION_ENCODINGS[name].model_settings]
        unable = [name for name in readers if not POSITION_ENCODINGS[name].per_layer_rope]
        if not readers or unable:
            raise ConfigError(f"model.rope_theta_layers and model.rope_scaling_layers set RoPE per layer for rope and "
                              f"xpos; this model's RoPE-like encodings are {readers or 'none'}")
    return completed


# The encodings register themselves when their files load (each imports this package, defined above by then).
for _module in ENCODING_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
