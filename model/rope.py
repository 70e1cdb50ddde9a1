"""Rotary position embedding: inverse frequencies, cos/sin from explicit positions, and the rotation itself.

The scaling variants live in a registry of records (Scaling: a pure function `-> (inv_freq, attention_factor)`,
with the signature of transformers' ROPE_INIT_FUNCTIONS, so a config means the same thing here and there, and what
else there is to know about it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from errors import ConfigError
from model.compiled import Compiled


def default_inv_freq(head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """inv_freq_i = 1 / theta^(2i/d) for i = 0 .. d/2 - 1, in float32 (the same arithmetic as transformers)
    or `dtype` (float64 for analysis)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (theta**exponents)


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


# The scalings, registered once each by @scaling below.
ROPE_SCALINGS: dict[str, Scaling] = {}


def scaling(name: str, keys: set[str], length_dependent: bool = False, defaults: dict | None = None,
            plain_at_factor_one: bool = True) -> Callable:
    """Register a scaling function under `name` (one Scaling record)."""

    def add(function: Callable[..., tuple[torch.Tensor, float]]) -> Callable[..., tuple[torch.Tensor, float]]:
        ROPE_SCALINGS[name] = Scaling(name, function, frozenset(keys), dict(defaults or {}),
                                      length_dependent, plain_at_factor_one)
        return function

    return add


def scaling_type(params: dict) -> str:
    """The scaling's name: transformers' `rope_type`, or the legacy `type` key, or "default" (no scaling)."""
    return params.get("rope_type", params.get("type", "default"))


@scaling("default", set())
def default_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    return default_inv_freq(head_dim, theta), 1.0


@scaling("linear", {"factor"})
def linear_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): positions divided by the factor, i.e. inv_freq / s."""
    return default_inv_freq(head_dim, theta) / params["factor"], 1.0


@scaling("ntk", {"factor"})
def ntk_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling: the base grows to theta * s^(d / (d - 2))."""
    factor = params["factor"]
    return default_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2))), 1.0


@scaling("dynamic", {"factor", ORIGINAL}, length_dependent=True)
def dynamic_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK: the NTK base is recomputed from the current length; unchanged up to the trained length L.

    base' = base * ((s * n / L) - (s - 1))^(d / (d - 2)) with n = max(seq_len, L), as in transformers.
    """
    factor = params["factor"]
    original = params["original_max_position_embeddings"]
    length = max(seq_len or original, original)
    base = theta * ((factor * length / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
    return default_inv_freq(head_dim, base), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(params: dict) -> float:
    """Explicit attention_factor, else mscale/mscale_all_dim when both are set, else 0.1 ln(s) + 1."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = params["factor"]
    if params.get("mscale") and params.get("mscale_all_dim"):
        return yarn_mscale(factor, params["mscale"]) / yarn_mscale(factor, params["mscale_all_dim"])
    return yarn_mscale(factor)


def yarn_correction_range(head_dim: int, theta: float, params: dict) -> tuple[float, float]:
    """The (low, high) pair indices between which YaRN blends interpolation and extrapolation.

    A pair whose wavelength fits more than beta_fast times in the original length keeps its frequency;
    one that fits fewer than beta_slow times is interpolated (divided by the factor).
    """
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = correction_dim(params.get("beta_fast") or 32)
    high = correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def yarn_ramp(head_dim: int, theta: float, params: dict) -> torch.Tensor:
    """0 for pairs that keep their frequency, 1 for pairs that are fully interpolated, linear in between."""
    low, high = yarn_correction_range(head_dim, theta, params)
    if low == high:
        high += 0.001
    return ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


YARN_KEYS = {"factor", ORIGINAL, "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}


@scaling("yarn", YARN_KEYS)
def yarn_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): NTK-by-parts interpolation plus the attention temperature."""
    factor = params["factor"]
    wavelengths = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation = 1.0 / wavelengths
    interpolation = 1.0 / (factor * wavelengths)
    interpolated = yarn_ramp(head_dim, theta, params)
    inv_freq = interpolation * interpolated + extrapolation * (1 - interpolated)
    return inv_freq, yarn_attention_factor(params)


@scaling("resonance", YARN_KEYS, plain_at_factor_one=False)
def resonance_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Resonance YaRN (Wang et al. 2024): YaRN's frequencies for the factor, each wavelength 2 pi / inv_freq then
    rounded to a whole number of tokens, so every pair repeats exactly; at factor 1 (YaRN is plain RoPE there),
    Resonance RoPE. As the authors' LlamaYaRNScaledResonanceRotaryEmbedding, with YaRN's attention factor."""
    inv_freq, attention_factor = yarn_rope(head_dim, theta, params, seq_len)
    wavelengths = torch.round(2 * math.pi / inv_freq).clamp(min=1)
    return 2 * math.pi / wavelengths, attention_factor


# the smoothing bounds are written out, so configs read the same here and in transformers (which requires them)
@scaling("llama3", {"factor", ORIGINAL, "low_freq_factor", "high_freq_factor"},
         defaults={"low_freq_factor": 1.0, "high_freq_factor": 4.0})
def llama3_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Llama 3.1: long wavelengths divided by the factor, short ones kept, a smooth blend in between."""
    factor = params["factor"]
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    original = params["original_max_position_embeddings"]
    inv_freq = default_inv_freq(head_dim, theta)
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original / low_freq_factor
    high_freq_wavelength = original / high_freq_factor
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled), 1.0


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


def rope_cos_sin(
    inv_freq: torch.Tensor,
    positions: torch.Tensor,
    layout: str,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for integer `positions` of shape (..., time), computed in float32 (or `dtype`, e.g. float64
    for analysis) whatever the autocast state.

    Returns two tensors of shape (..., time, head_dim) laid out for `layout` ("half" or "interleaved").
    """
    with torch.autocast(device_type=positions.device.type, enabled=False):
        angles = positions.to(dtype)[..., None] * inv_freq.to(positions.device, dtype)
        if layout == "half":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        return angles.cos() * attention_factor, angles.sin() * attention_factor


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    c1, c2 = cos.chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c0, c1 = cos[..., 0::2], cos[..., 1::2]
    s0, s1 = sin[..., 0::2], sin[..., 1::2]
    return torch.stack((x0 * c0 - x1 * s0, x1 * c1 + x0 * s1), dim=-1).flatten(-2)


# x * cos + rotate(x) * sin, where rotate is (x1, x2) -> (-x2, x1) on the two halves of the last dimension
# (transformers' rotate_half) or on each pair (2i, 2i + 1) (Meta's complex-number form). Written per half (or
# pair), no rotated copy of x is built: the same products and sums, so bitwise the same result as the textbook
# form (a + (-b) == a - b in IEEE arithmetic; tests/test_rope.py).
_ROTATE = {"half": _rotate_halves, "interleaved": _rotate_pairs}

# Long rotations without gradients (evaluation; above all dynamic NTK's decoding step, which rotates every cached
# key at every token) run compiled: one pass over x instead of several. Whether they may is the caller's choice
# (`compiled`): an encoding's is runtime.compiled_rope, taken when its model is built (PositionEncoding.compiled_rope).
COMPILED_MIN_ELEMENTS = 2**20
_COMPILED = {layout: Compiled(rotate, "RoPE's rotation", "rotations run eagerly (model/rope.py)", dynamic=True)
             for layout, rotate in _ROTATE.items()}


def _compiles(x: torch.Tensor, compiled: bool) -> bool:
    return (compiled and x.device.type == "cpu" and x.numel() >= COMPILED_MIN_ELEMENTS
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling())


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               compiled: bool = True) -> torch.Tensor:
    """x * cos + rotate(x) * sin, computed in at least float32 (float64 stays float64), returned in x's dtype.

    x: (batch, heads, time, head_dim); cos, sin: broadcastable to it. compiled=False keeps a long rotation without
    gradients eager (runtime.compiled_rope = false); the two agree within float rounding (tests/test_compiled_rope.py).
    """
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    rotated = _COMPILED[layout](wide, cos, sin) if _compiles(wide, compiled) else None
    if rotated is None:
        rotated = _ROTATE[layout](wide, cos, sin)
    return rotated.to(x.dtype)
