"""Inference-time methods: what a trained checkpoint may be given at evaluation to reach past its context, one
file each, registered by name in one table (METHODS), with their rules and checks: the front file.

Each method is one record (Method): what it applies to, its length rule (how it sets the model up for an
evaluation length: the settings it changes), whether it is scored token by token, and, by kind, what it computes:
    a RoPE scaling  the frequencies, a pure function (head_dim, theta, params, seq_len) -> (inv_freq,
                    attention_factor) with the signature of transformers' ROPE_INIT_FUNCTIONS (Scaling), set as
                    model.rope_scaling; static ones with factor = length / L, dynamic NTK with its own factor
    an attention    an AttentionMethod class that changes how queries see keys, set in model.attention_methods
    method          (query scales, positions in passes, visibility; rules below)
    a table's clamp a learned table whose positions past its end reuse its last row
"none" is the checkpoint as it is. "a+b" composes methods (method_spec), where the rules allow.

    name          file              what
    linear        linear.py         position interpolation (Chen et al. 2023)
    ntk           ntk.py            static NTK-aware base
    yarn          yarn.py           YaRN (Peng et al. 2023): NTK-by-parts and the attention temperature
    resonance     resonance.py      YaRN's frequencies with whole-token wavelengths (not plain RoPE at factor 1)
    llama3        llama3.py         Llama 3.1's smoothed interpolation
    dynamic       dynamic.py        dynamic NTK: each token under the base of its own prefix (incremental)
    clamp         clamp.py          a learned table: positions past it reuse its last row
    logn          logn.py           queries scaled by log-n past L
    temperature   temperature.py    Llama 4's query temperature, in NoPE layers
    rerope        rerope.py         ReRoPE: distances past the window clamped to it
    leaky_rerope  leaky_rerope.py   leaky ReRoPE
    selfextend    selfextend.py     SelfExtend: exact neighbours, grouped positions beyond
    string        string.py         STRING: large distances replaced by shifted small ones
    dca           dca.py            dual chunk attention
    sinks         sinks.py          attention sinks + a recent window (StreamingLLM)
    window        window.py         a sliding window (and the first tokens)
    lm_infinite   lm_infinite.py    LM-Infinite: global tokens, a local window, distances capped at L

A new method is a file here that registers it (@register_scaling on its frequency function, @register_attention on
its AttentionMethod class, or register(Method(...))), plus its line in METHOD_MODULES. ROPE_SCALINGS and
ATTENTION_METHODS are views of METHODS by kind (and plain RoPE's frequencies, "default"), not registries.

Attention methods in a config: `model.attention_methods = [{method = "rerope", window = 64}, ...]`. Three kinds,
composable in one way (`compose`):

    query scale   logn, temperature: each query is multiplied by a factor of its own position, so the logits
                  q.k are scaled, and so is a bias computed from q (Shaw's q.a, CoPE's q.e), not one that is not
    positions     rerope, leaky_rerope, selfextend, string, dca, sinks, lm_infinite: the positions a (query, key)
                  pair is encoded at, as passes (query positions, key positions, which pairs use them) whose scores
                  are merged; keys are cached raw and encoded at score time, so a cached step equals the method's
                  own full forward
    visibility    window, sinks, lm_infinite: which keys a query sees

At most one method sets positions and at most one sets visibility; query scales multiply. A parameter given as 0
takes its default from L = the length the model's positions were trained for (config.original_length). Each
method's file gives its formula and source.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from errors import ConfigError
from model.fields import original_length_of
from model.rope import default_inv_freq

if TYPE_CHECKING:
    from model.fields import ModelFields

NONE = "none"

ORIGINAL = "original_max_position_embeddings"


@dataclass(frozen=True)
class Scaling:
    """One RoPE scaling, everything about it in one record: its function (head_dim, theta, params, seq_len) ->
    (inv_freq, attention_factor), with the signature of transformers' ROPE_INIT_FUNCTIONS; the keys its params may
    hold (transformers' rope_parameters names) and the defaults filled in when a config leaves them out; whether it
    depends on the current length (dynamic NTK: keys are encoded again at each step); and whether it equals plain
    RoPE at factor 1 (Resonance rounds every wavelength, so an evaluation never reuses the plain cell for it)."""

    name: str
    function: Callable[..., tuple[torch.Tensor, float]]
    keys: frozenset[str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    length_dependent: bool = False
    plain_at_factor_one: bool = True

    @property
    def needs_original_length(self) -> bool:
        """It reads `original_max_position_embeddings`, which defaults to the trained context length."""
        return ORIGINAL in self.keys

    @property
    def summary(self) -> str:
        """The first phrase of its docstring (e.g. "Position interpolation")."""
        return (self.function.__doc__ or self.name).split(":")[0].split("(")[0].strip()

    def __call__(self, head_dim: int, theta: float, params: dict, seq_len: int | None = None
                 ) -> tuple[torch.Tensor, float]:
        return self.function(head_dim, theta, params, seq_len)


def scaling_type(params: dict) -> str:
    """The scaling's name: transformers' `rope_type`, or the legacy `type` key, or "default" (no scaling)."""
    return params.get("rope_type", params.get("type", "default"))



def plain_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Plain RoPE (no scaling: transformers' "default")."""
    return default_inv_freq(head_dim, theta), 1.0


PLAIN = Scaling("default", plain_rope, frozenset())


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
        """The parameters an evaluation at `length` of a model trained at `trained` uses (model/methods/); {}: the
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


# (the checkpoint's own config, length, trained length) -> the inference-time settings a method changes.
Changes = Callable[[dict, int, int], dict]


def _never(own: dict, length: int, trained: int) -> bool:
    return False


@dataclass(frozen=True)
class Method:
    """One inference-time method: what it applies to (`encodings`), its length rule (`changes`), how it is scored,
    and what it computes (a Scaling, an AttentionMethod class, or neither: a setting of the encoding)."""

    # the encodings it applies to (None: every encoding), or a function giving them (an attention method's, read
    # from its refusal when first asked, once the encodings are loaded)
    applies_to: tuple[str, ...] | None | Callable[[], tuple[str, ...] | None]
    changes: Changes
    incremental: bool = False
    summary: str = ""
    shift_probe: bool = False  # also run the position-shift probe under this method (length-independent methods)
    # (the checkpoint's own config, length, trained length) -> True where the method scores windows of that length
    # exactly as the checkpoint as trained does (a RoPE scaling with factor 1, a learned table never past its end):
    # the evaluation then reuses that cell instead of scoring it again (tests/test_eval_reuse.py checks each claim).
    as_trained_at: Callable[[dict, int, int], bool] = _never
    name: str = ""
    scaling: Scaling | None = None
    attention: type[AttentionMethod] | None = None
    _encodings: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def encodings(self) -> tuple[str, ...] | None:
        if not callable(self.applies_to):
            return self.applies_to
        if "value" not in self._encodings:
            self._encodings["value"] = self.applies_to()
        return self._encodings["value"]



def _original(own: dict) -> int:
    return original_length_of(own.get("rope_scaling"), own["max_seq_len"])  # the checkpoint's own, not the current setting


def _plain_rope_within(bound: Callable[[dict, int], int]) -> Callable[[dict, int, int], bool]:
    """A RoPE scaling on a checkpoint without a scaling of its own, at lengths up to bound(own, trained): its
    factor is then 1, and linear, NTK, YaRN and Llama 3 with factor 1 are plain RoPE (the same frequencies, attention
    factor 1), as is dynamic NTK within the trained length."""
    def as_trained(own: dict, length: int, trained: int) -> bool:
        scaling = own.get("rope_scaling") or {}
        return scaling.get("rope_type", "default") == "default" and length <= bound(own, trained)

    return as_trained


def _rope_scaling(name: str) -> Changes:
    def changes(own: dict, length: int, trained: int) -> dict:
        original = _original(own)
        scaling = {"rope_type": name, "factor": max(1.0, length / original)}
        if ROPE_SCALINGS[name].needs_original_length:
            scaling["original_max_position_embeddings"] = original
        return {"rope_scaling": scaling}

    return changes


def _dynamic(name: str) -> Changes:
    def changes(own: dict, length: int, trained: int) -> dict:
        return {"rope_scaling": {"rope_type": name, "factor": 1.0, "original_max_position_embeddings": trained}}

    return changes


def _attention(name: str) -> Changes:
    """An attention method with its parameters set for the evaluation length (module docstring)."""

    def changes(own: dict, length: int, trained: int) -> dict:
        params = ATTENTION_METHODS[name].for_length(length, _original(own))
        return {"attention_methods": [*own.get("attention_methods", []), {"method": name, **params}]}

    return changes


# The methods by name, each registered once by its file (METHOD_MODULES, loaded at the end of this file).
METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    if not method.name or method.name in METHODS:
        raise ValueError(f"inference-time method {method.name!r} is registered twice (or has no name)")
    METHODS[method.name] = method
    return method


def register_scaling(name: str, keys: set[str], length_dependent: bool = False, defaults: dict | None = None,
                     plain_at_factor_one: bool = True) -> Callable:
    """Register a RoPE scaling's frequency function as the method `name`: static ones with factor = length / L,
    a length-dependent one (dynamic NTK) with its own factor, scored incrementally."""

    def add(function: Callable[..., tuple[torch.Tensor, float]]) -> Callable[..., tuple[torch.Tensor, float]]:
        record = Scaling(name, function, frozenset(keys), dict(defaults or {}), length_dependent, plain_at_factor_one)
        if length_dependent:
            register(Method(("rope",), _dynamic(name), incremental=True, name=name, scaling=record,
                            summary=f"{record.summary}, factor 1, each token under the base of its own prefix",
                            as_trained_at=_plain_rope_within(lambda own, trained: trained)))
        else:
            register(Method(("rope",), _rope_scaling(name), name=name, scaling=record,
                            summary=f"{record.summary}, factor = length / L",
                            as_trained_at=_plain_rope_within(lambda own, trained: _original(own))
                            if plain_at_factor_one else _never))
        return function

    return add


def register_attention(cls: type[AttentionMethod]) -> type[AttentionMethod]:
    """Register an attention method's class as the method `cls.name`, its parameters set for the evaluation length
    by `cls.for_length`."""
    register(Method(lambda: applicable_encodings(cls), _attention(cls.name), name=cls.name, attention=cls,
                    summary=(cls.__doc__ or cls.name).strip().split("\n")[0].rstrip(".")))
    return cls


register(Method(None, lambda own, length, trained: {}, summary="the checkpoint as trained", shift_probe=True,
                name=NONE))


def normalize_rope_scaling(scaling: dict | None, trained_length: int) -> dict | None:
    """Check a rope_scaling dict (transformers' rope_parameters keys) and fill in its defaults.

    Accepts the legacy "type" key. `original_max_position_embeddings` defaults to `trained_length`, the context
    the checkpoint was trained at. Raises ConfigError naming the key and the valid choices.
    """
    if scaling is None:
        return None
    name = scaling_type(scaling)
    params = {key: value for key, value in scaling.items() if key != "type"}
    params.pop("rope_theta", None)  # lives in ModelConfig.rope_theta
    if name not in ROPE_SCALINGS:
        raise ConfigError(f"unknown rope scaling {name!r}; valid names are {sorted(ROPE_SCALINGS)}")
    if name == "default":  # transformers' name for plain RoPE: in pelab that is no scaling (None; "none" on the CLI)
        return None
    record = ROPE_SCALINGS[name]
    params["rope_type"] = name
    unknown = sorted(set(params) - record.keys - {"rope_type"})
    if unknown:
        raise ConfigError(f"rope scaling {name!r}: unknown key(s) {unknown}; valid keys are {sorted(record.keys)}")
    factor = params.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1:
        raise ConfigError(f"rope scaling {name!r} needs a numeric factor >= 1, got {factor!r}")
    params["factor"] = float(factor)
    for key, value in record.defaults.items():
        params.setdefault(key, value)
    if record.needs_original_length:  # the trained context length when it is absent
        params.setdefault("original_max_position_embeddings", trained_length)
        if params["original_max_position_embeddings"] <= 0:
            raise ConfigError("rope scaling: original_max_position_embeddings must be positive")
    return params


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
    from model.encodings import POSITION_ENCODINGS  # (the encodings' files import this package)

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
    from model.encodings import POSITION_ENCODINGS

    names = [name for name in POSITION_ENCODINGS if refusal(cls, [name]) is None]
    return None if len(names) == len(POSITION_ENCODINGS) else tuple(names)


def check_applies(cls: type[AttentionMethod], config: ModelFields) -> None:
    """Refuse, naming why, a method that does not apply to this model's encodings or scaling."""
    reason = refusal(cls, sorted(set(config.layer_encodings)), (config.rope_scaling or {}).get("rope_type"))
    if reason is not None:
        raise ConfigError(reason)


def check_scaling(config: ModelFields) -> dict | None:
    """`config`'s RoPE scaling checked and completed (None: none); raise ConfigError naming the key. ModelConfig
    runs it once, when it is built, and sets model.rope_scaling to the result before check_attention_methods."""
    from model.encodings import POSITION_ENCODINGS

    if config.rope_scaling is None:
        return None
    if "rope_scaling" not in POSITION_ENCODINGS[config.position].model_settings:
        readers = " or ".join(repr(name) for name, cls in POSITION_ENCODINGS.items()
                              if "rope_scaling" in cls.model_settings)
        raise ConfigError(f"model.rope_scaling applies to position = {readers}, not {config.position!r}")
    try:
        return normalize_rope_scaling(config.rope_scaling, config.max_seq_len)
    except ConfigError as error:
        raise ConfigError(f"model.rope_scaling: {error}") from error


def check_attention_methods(config: ModelFields, original_length: int) -> list[dict]:
    """`config`'s attention methods checked against the model and completed with their parameters, derived from
    `original_length` (the config's, once its scaling is complete); raise ConfigError naming the entry."""
    methods = normalize_methods(config.attention_methods, original_length)
    for entry in methods:
        check_applies(ATTENTION_METHODS[entry["method"]], config)
    return methods


# A method's name with this suffix sets it on every layer of a hybrid (model.rope_scaling_layers and
# model.attention_methods_layers emptied), where the model's own choice (Gemma 3's import: its global layers) is kept
# without it; on a model without such a choice the two are the same.
EVERY_LAYER = "@all"


# A method's name with ":2x" (a multiple of L) or ":65536" (tokens) sets it for that length whatever the length of
# the windows it reads: a config that fixes its scaling for the longest input it may meet, then reads shorter ones
# (a YaRN set for 2L reading 1.5L). Without it a method is set for each window's own length.
SET_FOR = ":"


def set_for_length(name: str, trained: int) -> int:
    """The length the method `name` ("yarn:2x", "yarn:65536") is set for, on a checkpoint trained at `trained`."""
    text = name.rpartition(SET_FOR)[2]
    try:
        value = float(text[:-1]) * trained if text.endswith("x") else int(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise ConfigError(f"method {name!r}: after {SET_FOR!r} give the length it is set for, a multiple of the "
                          "trained length (2x) or a token count (65536)")
    return max(1, round(value))


def method_spec(name: str) -> Method:
    """The method `name`, or the composition "a+b" of registered methods (their changes together; attention methods
    appended in order; the model's config then checks that they combine); "NAME@all": on every layer; "NAME:2x": set
    for twice the trained length (or ":TOKENS") whatever the windows' length."""
    if name.endswith(EVERY_LAYER):
        base = method_spec(name.removesuffix(EVERY_LAYER))

        def everywhere(own: dict, length: int, trained: int) -> dict:
            return {**base.changes(own, length, trained), "rope_scaling_layers": [], "attention_methods_layers": []}

        return Method(base.applies_to, everywhere, name=name, incremental=base.incremental,
                      summary=f"{base.summary}, on every layer", as_trained_at=base.as_trained_at)
    if SET_FOR in name:
        base = method_spec(name.rpartition(SET_FOR)[0])
        if base.incremental or base.name == NONE:
            raise ConfigError(f"method {name!r}: {base.name} sets itself from each prefix or changes nothing; "
                              f"{SET_FOR!r} sets a static method for a length")
        set_for_length(name, 1)  # the suffix is checked when named, not first when a window is scored

        def fixed(own: dict, length: int, trained: int) -> dict:
            return base.changes(own, set_for_length(name, trained), trained)

        def as_trained(own: dict, length: int, trained: int) -> bool:  # the windows read and the setting both as trained
            return base.as_trained_at(own, length, trained) and base.as_trained_at(own, set_for_length(name, trained),
                                                                                   trained)

        return Method(base.applies_to, fixed, name=name, summary=f"{base.summary}, set for {name.rpartition(SET_FOR)[2]}",
                      as_trained_at=as_trained)
    if name in METHODS:
        return METHODS[name]
    parts = [METHODS[part] for part in name.split("+")]
    allowed = [set(part.encodings) for part in parts if part.encodings is not None]

    def changes(own: dict, length: int, trained: int) -> dict:
        own_methods = list(own.get("attention_methods", []))
        merged: dict = {}
        added: list = []
        for part in parts:
            for key, value in part.changes(own, length, trained).items():
                if key == "attention_methods":
                    added += value[len(own_methods):]
                else:
                    merged[key] = value
        if added:
            merged["attention_methods"] = own_methods + added
        return merged

    return Method(tuple(sorted(set.intersection(*allowed))) if allowed else None, changes, name=name,
                           incremental=any(part.incremental for part in parts),
                           summary=" + ".join(part.summary for part in parts),
                           as_trained_at=lambda own, length, trained: all(part.as_trained_at(own, length, trained)
                                                                          for part in parts))


def base_name(name: str) -> str:
    """`name` without its suffixes: on every layer (@all) and the length it is set for (:2x)."""
    return name.removesuffix(EVERY_LAYER).partition(SET_FOR)[0].removesuffix(EVERY_LAYER)


def check_methods(names: list[str]) -> list[str]:
    bases = [base_name(name) for name in names]
    unknown = [name for name, base in zip(names, bases) if (base != NONE or name != base)
               and any(part not in METHODS or part == NONE for part in base.split("+"))]
    if unknown:
        raise ConfigError(f"unknown inference-time method(s) {unknown}; valid names are {sorted(METHODS)}, "
                          f"compositions such as yarn+logn, and either with {EVERY_LAYER} (on every layer of a "
                          f"hybrid) or {SET_FOR}2x (set for twice the trained length)")
    for name, base in zip(names, bases):
        if "+" in base:
            check_composition(base)
        if SET_FOR in name:
            method_spec(name)  # the length it is set for, and a static method to set
    return names


COMPOSITION_CHECK_LENGTH = 256


def check_composition(name: str) -> None:
    """Refuse a composition no model could take: two scalings, a part twice, parts with no common encoding, or
    attention methods that do not combine (with each other or with the scaling)."""
    parts = name.split("+")
    scalings = [part for part in parts if part in ROPE_SCALINGS]
    if len(scalings) > 1 or len(set(parts)) != len(parts):
        raise ConfigError(f"method {name!r}: give each part once, with at most one RoPE scaling")
    if method_spec(name).encodings == ():
        raise ConfigError(f"method {name!r}: its parts apply to no common encoding")
    attention = [part for part in parts if part in ATTENTION_METHODS]
    try:  # as on a RoPE model (any trained length: the parts' derived parameters must fit together)
        normalize_methods([{"method": part} for part in attention], COMPOSITION_CHECK_LENGTH)
        for part in attention:
            reason = refusal(ATTENTION_METHODS[part], ["rope"], scalings[0] if scalings else None)
            if reason is not None:
                raise ConfigError(reason)
    except ConfigError as error:
        raise ConfigError(f"method {name!r}: {error}") from error


def applies(name: str, encoding: str, layers: list[str] | None = None) -> bool:
    """Whether method `name` applies to a model whose model.position is `encoding` (and whose layers use the
    encodings `layers`, for a hybrid: an attention method is checked against them all)."""
    if layers is not None:
        parts = base_name(name).split("+")
        scalings = [part for part in parts if part not in ATTENTION_METHODS]
        if any(refusal(ATTENTION_METHODS[part], sorted(set(layers))) for part in parts if part in ATTENTION_METHODS):
            return False
        return all(applies(part, encoding) for part in scalings)
    encodings = method_spec(name).encodings
    return encodings is None or encoding in encodings


def label(name: str, method: str) -> str:
    """How a (checkpoint, method) row is named in tables: "rope", "rope+yarn", "learned+clamp"."""
    return name if method == NONE else f"{name}+{method}"


@dataclass
class MethodContext:
    """What the attention needs from the methods for one forward."""

    # the query factor (batch|1, 1, q_time, 1) of a layer whose encoding encodes positions (True) or does not
    # (False, NoPE: the scales of every layer times those of layers without positions); None: 1
    scales: dict[bool, torch.Tensor | None]
    passes: list[Pass] | None
    visible: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    window: int
    q_positions: torch.Tensor
    k_positions: torch.Tensor
    # what a backend derives from the methods once per forward for every layer (the merged path's chunk plan)
    memo: dict = field(default_factory=dict, repr=False)


def build_methods(config: ModelFields) -> list[AttentionMethod]:
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
    every, unpositioned = (None if scale is None else scale[:, None, :, None] for scale in (scales[False], scales[True]))
    return MethodContext(
        scales={True: every, False: every if unpositioned is None else unpositioned if every is None
                else every * unpositioned},
        passes=positions.passes(q_positions, k_positions) if positions is not None else None,
        visible=visibility.visible if visibility is not None else None,
        window=visibility.window if visibility is not None and not visibility.sets_positions else 0,
        q_positions=q_positions,
        k_positions=k_positions,
    )

# The files of model/methods/ that register methods, in the order of the registry (and of its listings).
METHOD_MODULES = ("linear", "ntk", "yarn", "resonance", "llama3", "dynamic", "clamp", "logn", "temperature", "rerope",
                  "leaky_rerope", "selfextend", "string", "dca", "sinks", "window", "lm_infinite")
for _module in METHOD_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

# The methods by kind: views of METHODS (with plain RoPE's frequencies), read by the encodings and the attention.
ROPE_SCALINGS: dict[str, Scaling] = {"default": PLAIN, **{name: method.scaling for name, method in METHODS.items()
                                                          if method.scaling is not None}}
ATTENTION_METHODS: dict[str, type[AttentionMethod]] = {name: method.attention for name, method in METHODS.items()
                                                       if method.attention is not None}
