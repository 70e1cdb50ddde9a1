"""Inference-time attention methods: how a trained model's queries see keys, changed without retraining.

A model's config lists the methods in use, `model.attention_methods = [{method = "rerope", window = 64}, ...]`;
each is registered here by name with its parameters. Three kinds, composable in one way (`compose`):

    query scale   logn, temperature: each query is multiplied by a factor of its own position, so the logits
                  q.k are scaled, and so is a bias computed from q (Shaw's q.a, CoPE's q.e), not one that is not
    positions     rerope, leaky_rerope, selfextend, string, dca, sinks: the positions a (query, key) pair is encoded at, as
                  passes (query positions, key positions, which pairs use them) whose scores are merged; keys are
                  cached raw and encoded at score time, so a cached step equals the method's own full forward
    visibility    window, sinks: which keys a query sees (sliding window; attention sinks + window)

At most one method sets positions and at most one sets visibility; query scales multiply. A parameter given as 0
takes its default from L = the length the model's positions were trained for (config.original_length).

    logn          q_i *= max(1, log(i + 1) / log(L))                      (Su 2021, kexue.fm/archives/8823; Qwen)
    temperature   q_i *= 1 + beta * log(floor((i + 1) / floor_scale) + 1)  in NoPE layers only, as Llama 4's
                  attn_temperature_tuning; so it applies to models with NoPE layers (none, iRoPE-style hybrids)
    rerope        distance i - j kept below `window`, clamped to `window` beyond (Su 2023, kexue.fm/archives/9708);
                  bojone/rerope always adds log-n: that is `rerope` + `logn` here
    leaky_rerope  ... beyond `window` it grows as window + (i - j - window) / k
    selfextend    exact within `neighbors`; beyond, query at i // G + neighbors - neighbors // G and key at j // G
                  (Jin et al., ICML 2024, datamllab/LongLM)
    dca           chunks of chunk - local tokens; keys at their place in a chunk, queries at theirs for their own
                  chunk, shifted by a chunk for the one before, at min(2 (chunk - local) - 1, chunk) for all earlier
                  ones (Dual Chunk Attention, An et al. 2024, HKUNLP/ChunkLlama; Qwen3's long-context method)
    string        exact below `shift`; from it, distance d read as d - shift + local (STRING, An et al. 2024); shift
                  defaults to L / 3 and local to min(128, L / 8), and an evaluation past L sets shift so that the
                  shifted distances stay below L
    sinks         keys j < `sinks` and the last `window` keys (default L - sinks); a sink is seen from position
                  min(i, sinks + window - 1), the query's place in a cache of sinks + window slots (StreamingLLM,
                  Xiao et al. 2023); the recent keys keep their relative distances, which is the same thing for
                  shift-invariant encodings (FIRE, whose normaliser uses the query's position, is refused)
    window        keys within the last `window` positions, and the first `first` (0) tokens (the baseline the others
                  are compared against; with first = 1, the window control of the retrieval tasks, eval/retrieval.py)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from errors import ConfigError
from model.encodings import POSITION_ENCODINGS
from model.rope import ROPE_SCALINGS, normalize_rope_scaling

if TYPE_CHECKING:
    from model.config import ModelConfig


@dataclass
class Pass:
    """Positions at which queries (batch|1, q_time) and keys (batch|1, k_time) are encoded in one scoring pass, and
    which (query, key) pairs take their scores from it: select(i, j) on true positions (None: every pair, the
    first pass)."""

    queries: torch.Tensor
    keys: torch.Tensor
    select: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


class AttentionMethod:
    """Base: changes nothing. Subclasses set the flags of their kind and override the matching hook."""

    name = ""
    encodings: tuple[str, ...] | None = None  # the encodings it applies to (None: all); NoPE layers may be mixed in
    defaults: dict[str, float] = {}  # parameter -> default (0: derived, below)
    # parameter -> its value when given as 0, from L (the trained length) and the other parameters
    derived: dict[str, Callable[[int, dict], float]] = {}
    sets_positions = False
    sets_visibility = False
    scales_queries = False
    only_layers_without_positions = False  # a query scale that acts on NoPE layers only (Llama 4's temperature)
    window = 0  # > 0: a query sees at most this many keys before it, plus sinks (lets attention skip the rest)

    def __init__(self, params: dict[str, float], trained: int) -> None:
        self.params = params
        self.trained = trained

    @classmethod
    def check_params(cls, params: dict) -> None:
        """Raise ConfigError for parameters that do not fit together (each one is checked already)."""

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """The parameters an evaluation at `length` of a model trained at `trained` uses (model/inference_methods.py); {}: the
        defaults, which derive from the trained length."""
        return {}

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor:
        """Factor (batch|1, q_time) for each query."""
        raise NotImplementedError

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        raise NotImplementedError

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """True where the query, token i of the sequence, may see the key, token j (already causal): counted in
        tokens, whatever position ids the encoding is given (randomized positions spread them apart)."""
        raise NotImplementedError


ATTENTION_METHODS: dict[str, type[AttentionMethod]] = {}


def register_method(cls: type[AttentionMethod]) -> type[AttentionMethod]:
    ATTENTION_METHODS[cls.name] = cls
    return cls


@register_method
class LogN(AttentionMethod):
    """log-n scaling: q_i times max(1, log(i + 1) / log(L))."""

    name = "logn"
    defaults = {"base_length": 0}
    derived = {"base_length": lambda trained, params: trained}
    scales_queries = True

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor:
        base = self.params["base_length"]
        return torch.clamp(torch.log(positions.to(torch.float32) + 1) / math.log(base), min=1.0)


@register_method
class Temperature(AttentionMethod):
    """Llama 4 temperature: q_i times 1 + beta log(floor((i + 1) / floor_scale) + 1), in NoPE layers only."""

    name = "temperature"
    defaults = {"beta": 0.1, "floor_scale": 0}
    derived = {"floor_scale": lambda trained, params: trained}
    scales_queries = True
    only_layers_without_positions = True  # transformers' Llama4TextAttention: attn_temperature_tuning and not use_rope

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor:
        steps = torch.floor((positions.to(torch.float32) + 1) / self.params["floor_scale"])
        return 1 + self.params["beta"] * torch.log(steps + 1)


class TwoPass(AttentionMethod):
    """Exact positions for distances below `limit()`; beyond it, queries and keys at the positions `far` gives."""

    encodings = ("rope", "xpos")
    sets_positions = True

    def limit(self) -> int:
        return int(self.params["window"])

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        limit = self.limit()
        return [Pass(queries, keys), Pass(*self.far(queries, keys), lambda i, j: i - j >= limit)]


@register_method
class ReRoPE(TwoPass):
    """ReRoPE: distances past the window clamped to it."""

    name = "rerope"
    defaults = {"window": 0}
    derived = {"window": lambda trained, params: trained // 2}

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(queries, self.limit()), torch.zeros_like(keys)


@register_method
class LeakyReRoPE(TwoPass):
    """leaky ReRoPE: distances past the window grow with slope 1 / k."""

    name = "leaky_rerope"
    defaults = {"window": 0, "k": 16.0}
    derived = {"window": lambda trained, params: trained // 2}

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window, k = self.params["window"], self.params["k"]
        # (i / k + window (1 - 1 / k)) - j / k = window + (i - j - window) / k
        return queries.to(torch.float32) / k + window * (1 - 1 / k), keys.to(torch.float32) / k

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Window L / 2 and the k that maps the longest distance below L."""
        half = max(1, trained // 2)
        return {"window": half, "k": max(1.0, (length - half) / max(1, trained - half))}


@register_method
class SelfExtend(TwoPass):
    """SelfExtend: exact neighbours, grouped positions beyond."""

    name = "selfextend"
    defaults = {"neighbors": 0, "group": 4}
    derived = {"neighbors": lambda trained, params: trained // 2}

    def limit(self) -> int:
        return int(self.params["neighbors"])

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        neighbors, group = self.limit(), int(self.params["group"])
        return (torch.div(queries, group, rounding_mode="floor") + neighbors - neighbors // group,
                torch.div(keys, group, rounding_mode="floor"))

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Neighbours L / 2 and the smallest group whose largest distance, (length - 1) // G + W - W // G, stays
        below L."""
        neighbors, group = max(1, trained // 2), 1
        while (length - 1) // group + neighbors - neighbors // group > trained - 1:
            group += 1
        return {"neighbors": neighbors, "group": group}


@register_method
class String(TwoPass):
    """STRING: distances from `shift` on read as distance - shift + local (An et al. 2024)."""

    # An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?" (arXiv 2410.18745): the large,
    # rarely trained distances are dropped and the well-trained small ones shifted over them; `local` restores
    # distinct positions for the nearest of the shifted keys. A pair at distance d >= shift takes the query at
    # i - shift + local (the key stays at j); nearer pairs are exact. The reference code (HKUNLP/STRING,
    # string_for_llama.py) gives the pair at d = shift to both passes; here each pair has one.
    name = "string"
    defaults = {"local": 0, "shift": 0}
    derived = {"local": lambda trained, params: min(128, max(1, trained // 8)),  # the paper's 128 at L = 128k
               "shift": lambda trained, params: trained // 3}  # its shifted_offset = 0.33 L

    def limit(self) -> int:
        return int(self.params["shift"])

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return queries - self.limit() + int(self.params["local"]), keys

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Past L: the smallest shift that keeps every shifted distance below L (length - L + local), at least the
        paper's L / 3; when no shift can keep both parts below L (length > 2L - local), the one that balances them."""
        local = cls.derived["local"](trained, {})
        shift = max(trained // 3, length - trained + local)
        if shift > trained:
            shift = (length + local) // 2
        return {"local": local, "shift": shift}


@register_method
class DualChunk(AttentionMethod):
    """dual chunk attention (DCA): keys at their place in a chunk, queries at one of three places (An et al. 2024)."""

    # An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models" (arXiv 2402.17463), as
    # HKUNLP/ChunkLlama's chunkllama_attn_replace.py computes it: chunks of c = chunk - local tokens; every key at
    # j mod c; a query at i mod c for the keys of its own chunk (intra), at min(i mod c + c, chunk) for the keys of
    # the chunk before (successive), and at min(2c - 1, chunk) for all earlier keys (inter). Every distance stays
    # at most `chunk`. Defaults as replace_with_chunkllama: chunk 3L/4, local L/8.
    name = "dca"
    encodings = ("rope", "xpos")
    defaults = {"chunk": 0, "local": 0}
    derived = {"chunk": lambda trained, params: trained * 3 // 4, "local": lambda trained, params: trained // 8}
    sets_positions = True

    @classmethod
    def check_params(cls, params: dict) -> None:
        if params["local"] >= params["chunk"]:
            raise ConfigError(f"attention method 'dca': local = {params['local']} must be below chunk = "
                              f"{params['chunk']} (chunks hold chunk - local tokens)")

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        chunk = int(self.params["chunk"])
        span = chunk - int(self.params["local"])
        inside = torch.remainder(queries, span)
        successive = torch.clamp(inside + span, max=chunk)
        inter = torch.full_like(queries, min(2 * span - 1, chunk))
        key_places = torch.remainder(keys, span)

        def chunk_of(position: torch.Tensor) -> torch.Tensor:
            return torch.div(position, span, rounding_mode="floor")

        return [Pass(inside, key_places),
                Pass(successive, key_places, lambda i, j: chunk_of(j) == chunk_of(i) - 1),
                Pass(inter, key_places, lambda i, j: chunk_of(j) < chunk_of(i) - 1)]


@register_method
class Sinks(AttentionMethod):
    """attention sinks (StreamingLLM): the first tokens and a recent window, positions as in the cache."""

    name = "sinks"
    defaults = {"sinks": 4, "window": 0}
    derived = {"window": lambda trained, params: trained - int(params["sinks"])}  # a cache of L slots
    sets_positions = True
    sets_visibility = True

    def __init__(self, params: dict[str, float], trained: int) -> None:
        super().__init__(params, trained)
        self.window = int(params["window"])

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        sinks = int(self.params["sinks"])
        last_slot = sinks + self.window - 1  # the query's place in a cache of sinks + window slots
        seen_from_cache = Pass(torch.clamp(queries, max=last_slot), keys, lambda i, j: j < sinks)
        return [Pass(queries, keys), seen_from_cache]

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (j < self.params["sinks"]) | (i - j < self.window)


@register_method
class Window(AttentionMethod):
    """sliding window: the most recent keys only (and the first `first` tokens, kept visible as they are)."""

    name = "window"
    defaults = {"window": 0, "first": 0}
    derived = {"window": lambda trained, params: trained}
    sets_visibility = True

    def __init__(self, params: dict[str, float], trained: int) -> None:
        super().__init__(params, trained)
        self.span, self.first = int(params["window"]), int(params["first"])
        self.window = 0 if self.first else self.span  # with first tokens kept, no key range can be skipped

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (i - j < self.span) | (j < self.first)


def normalize_methods(methods: list, trained: int) -> list[dict]:
    """Check `model.attention_methods` and fill in defaults; raise ConfigError naming the problem."""
    normalized = []
    for entry in methods:
        if not isinstance(entry, dict) or entry.get("method") not in ATTENTION_METHODS:
            raise ConfigError(f"model.attention_methods: each entry is a table {{method = NAME, ...}} with NAME in "
                              f"{sorted(ATTENTION_METHODS)}; got {entry!r}")
        cls = ATTENTION_METHODS[entry["method"]]
        unknown = sorted(set(entry) - {"method"} - set(cls.defaults))
        if unknown:
            raise ConfigError(f"attention method {cls.name!r}: unknown parameter(s) {unknown}; "
                              f"valid: {sorted(cls.defaults)}")
        params = {**cls.defaults, **{key: value for key, value in entry.items() if key != "method"}}
        for key, value in params.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"attention method {cls.name!r}: {key} must be a number >= 0, got {value!r}")
            if value == 0 and key in cls.derived:
                params[key] = cls.derived[key](trained, params)
        for key in ("window", "neighbors", "group", "base_length", "floor_scale", "k", "shift", "chunk"):
            if key in params and params[key] < (2 if key == "base_length" else 1):
                raise ConfigError(f"attention method {cls.name!r}: {key} = {params[key]} is too small")
        cls.check_params(params)
        normalized.append({"method": cls.name, **params})
    compose([ATTENTION_METHODS[entry["method"]] for entry in normalized])
    return normalized


def compose(classes: list[type[AttentionMethod]]) -> None:
    """The combination rules, in one place: one method sets positions, one sets visibility, scales multiply."""
    names = [cls.name for cls in classes]
    if len(set(names)) != len(names):
        raise ConfigError(f"model.attention_methods lists a method twice: {names}")
    for flag, what in (("sets_positions", "sets positions"), ("sets_visibility", "sets visibility")):
        chosen = [cls.name for cls in classes if getattr(cls, flag)]
        if len(chosen) > 1:
            raise ConfigError(f"attention methods {chosen} each {what}; combine at most one of them with any of "
                              f"the query scales ({sorted(n for n, c in ATTENTION_METHODS.items() if c.scales_queries)})")


def refusal(cls: type[AttentionMethod], used: list[str], scaling: str | None = None) -> str | None:
    """Why `cls` cannot run on a model whose layers use the encodings `used` (and this scaling), or None."""
    own = [name for name in used if POSITION_ENCODINGS[name].own_weights]
    if own and (cls.scales_queries or cls.sets_positions):  # hiding keys (a window) applies to any weights
        return (f"attention method {cls.name!r} is defined on softmax attention; {own} compute their attention "
                "weights otherwise")
    if cls.encodings is not None:
        outside = [name for name in used if name not in cls.encodings and name != "none"]
        if outside or not set(used) & set(cls.encodings):
            return f"attention method {cls.name!r} applies to {list(cls.encodings)} (with NoPE layers mixed in); " \
                   f"this model uses {used}"
    if cls.only_layers_without_positions and all(POSITION_ENCODINGS[name].encodes_positions for name in used):
        return (f"attention method {cls.name!r} acts on layers without position encoding (NoPE, as Llama 4's "
                f"temperature tuning); this model uses {used}")
    if cls.sets_positions:
        explicit = [name for name in used if POSITION_ENCODINGS[name].has_value_term
                    or POSITION_ENCODINGS[name].bias_needs_scores or not POSITION_ENCODINGS[name].per_layer
                    or not POSITION_ENCODINGS[name].relative_only or POSITION_ENCODINGS[name].own_scores]
        if explicit:
            return (f"attention method {cls.name!r} re-encodes relative positions in passes, which {explicit} "
                    "cannot take (relative values, score-dependent, absolute or query-normalised positions, scores "
                    "of their own)")
        if scaling in ROPE_SCALINGS and ROPE_SCALINGS[scaling].length_dependent:
            return (f"attention method {cls.name!r} cannot be combined with the {scaling!r} scaling, whose "
                    "frequencies depend on the largest position; use a static scaling")
    return None


def applicable_encodings(cls: type[AttentionMethod]) -> tuple[str, ...] | None:
    """The single encodings `cls` applies to (None: all)."""
    names = [name for name in POSITION_ENCODINGS if refusal(cls, [name]) is None]
    return None if len(names) == len(POSITION_ENCODINGS) else tuple(names)


def check_applies(cls: type[AttentionMethod], config: ModelConfig) -> None:
    """Refuse, naming why, a method that does not apply to this model's encodings or scaling."""
    reason = refusal(cls, sorted(set(config.layer_encodings())), (config.rope_scaling or {}).get("rope_type"))
    if reason is not None:
        raise ConfigError(reason)


def check_config(config: ModelConfig) -> None:
    """Check (and complete, in place) the inference-time settings of `config`: its RoPE scaling and its attention
    methods; raise ConfigError naming the key. Run by ModelConfig once, when it is built, if it sets either."""
    if config.rope_scaling is not None:
        if "rope_scaling" not in POSITION_ENCODINGS[config.position].model_settings:
            readers = " or ".join(repr(name) for name, cls in POSITION_ENCODINGS.items()
                                  if "rope_scaling" in cls.model_settings)
            raise ConfigError(f"model.rope_scaling applies to position = {readers}, not {config.position!r}")
        try:
            config.rope_scaling = normalize_rope_scaling(config.rope_scaling, config.max_seq_len)
        except ConfigError as error:
            raise ConfigError(f"model.rope_scaling: {error}") from error
    config.attention_methods = normalize_methods(config.attention_methods, config.original_length)
    for entry in config.attention_methods:
        check_applies(ATTENTION_METHODS[entry["method"]], config)


@dataclass
class MethodContext:
    """What the attention needs from the methods for one forward."""

    query_scale: torch.Tensor | None  # (batch|1, 1, q_time, 1): for every layer
    unpositioned_scale: torch.Tensor | None  # (batch|1, 1, q_time, 1): also, for layers without positions (NoPE)
    passes: list[Pass] | None
    visible: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    window: int
    q_positions: torch.Tensor
    k_positions: torch.Tensor
    # what a backend derives from the methods once per forward for every layer (the merged path's chunk plan)
    memo: dict = field(default_factory=dict, repr=False)

    def scale_for(self, encodes_positions: bool) -> torch.Tensor | None:
        """The query factor for a layer whose encoding does (or, NoPE, does not) encode positions."""
        extra = None if encodes_positions else self.unpositioned_scale
        if self.query_scale is None or extra is None:
            return self.query_scale if extra is None else extra
        return self.query_scale * extra


def build_methods(config: ModelConfig) -> list[AttentionMethod]:
    return [ATTENTION_METHODS[entry["method"]](entry, config.original_length) for entry in config.attention_methods]


def method_context(methods: list[AttentionMethod], q_positions: torch.Tensor,
                   k_positions: torch.Tensor) -> MethodContext | None:
    if not methods:
        return None
    scales: dict[bool, torch.Tensor | None] = {False: None, True: None}
    for method in methods:
        if method.scales_queries:
            factor = method.query_scale(q_positions)
            kind = method.only_layers_without_positions
            scales[kind] = factor if scales[kind] is None else scales[kind] * factor
    positions = next((m for m in methods if m.sets_positions), None)
    visibility = next((m for m in methods if m.sets_visibility), None)
    return MethodContext(
        query_scale=None if scales[False] is None else scales[False][:, None, :, None],
        unpositioned_scale=None if scales[True] is None else scales[True][:, None, :, None],
        passes=positions.passes(q_positions, k_positions) if positions is not None else None,
        visible=visibility.visible if visibility is not None else None,
        window=visibility.window if visibility is not None and not visibility.sets_positions else 0,
        q_positions=q_positions,
        k_positions=k_positions,
    )
