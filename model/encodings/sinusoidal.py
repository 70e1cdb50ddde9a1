"""sinusoidal: fixed absolute sinusoids added to the token embeddings (Vaswani et al., NeurIPS 2017)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from errors import ConfigError
from model.encodings import EncodingSettings, PositionEncoding, register_encoding
from model.fields import ModelFields


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...), in float32."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


# The `embedding` setting -> (scale the token embeddings by sqrt(dim)?, their initial std; None = model.init_std).
SINUSOIDAL_RECIPES: dict[str, tuple[bool, str | None]] = {
    "fairseq": (True, "dim^-0.5"),  # Vaswani et al. 2017 and fairseq's TransformerLM (ALiBi paper's baseline)
    "unscaled": (False, None),  # GPT-2 / transformers style: sum as they are
    "legacy": (True, None),  # sqrt(dim) scale with std init_std: the sinusoid carries ~80% of the input energy
}


@dataclass
class SinusoidalSettings(EncodingSettings):
    # How token embeddings meet the fixed sinusoid (SINUSOIDAL_RECIPES): "fairseq" scales them by sqrt(dim) with
    # std dim^-0.5; "unscaled" adds them as they are, std init_std; "legacy" scales them by sqrt(dim) with std
    # init_std, so the sinusoid dominates the input (docs/baselines.md).
    embedding: str = "fairseq"

    def check(self, config: ModelFields, where: str) -> None:
        if self.embedding not in SINUSOIDAL_RECIPES:
            raise ConfigError(f"{where}.embedding must be one of {sorted(SINUSOIDAL_RECIPES)}, "
                              f"got {self.embedding!r}")


@register_encoding("sinusoidal")
class Sinusoidal(PositionEncoding):
    """Fixed absolute sinusoids added to the token embeddings. The `embedding` setting picks how the token
    embeddings are scaled and initialised against them (default "fairseq": x sqrt(d), std d^-0.5)."""

    Settings = SinusoidalSettings
    per_layer = False

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        if config.dim % 2:
            raise ConfigError(f"sinusoidal needs an even model.dim, got {config.dim}")

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        scaled, _ = SINUSOIDAL_RECIPES[self.settings.embedding]
        if scaled:
            x = x * math.sqrt(self.config.dim)
        return x + sinusoid(positions, self.config.dim).to(x.dtype)

    def token_embedding_std(self) -> float | None:
        _, std = SINUSOIDAL_RECIPES[self.settings.embedding]
        return self.config.dim**-0.5 if std == "dim^-0.5" else None
