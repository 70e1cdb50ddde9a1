"""stickbreaking: stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study"): no softmax and no position encoding; nearer keys claim attention first.

For query i, each earlier key j gets beta_ij = sigmoid(q_i . k_j / sqrt(d)) of what the keys between them left:
A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik). What no key claims, prod_{k < i} (1 - beta_ik), goes to the query's
own value, so every row's weights sum to 1. As the reference (shawntan/stickbreaking-attention, stickbreaking_attention/sb_ref.py
and its test's ref_fwd, attend_current=False): in log space, log A_ij = log sigmoid(z_ij) + sum_{j < k < i} log
sigmoid(-z_ik), in float32. With `attend_current` the query's own key takes part as the nearest one (the
reference's option), and what is left still goes to its value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from errors import ConfigError
from model.encodings import EncodingSettings, PositionEncoding, register_encoding


@dataclass
class StickBreakingSettings(EncodingSettings):
    attend_current: bool = False  # the query's own key breaks the stick first (False: only earlier keys do)


def own_key(visible: torch.Tensor) -> torch.Tensor:
    """One-hot of each row's own key: its last visible one (causal attention sees keys up to its own)."""
    return visible & (visible.long().cumsum(-1) == visible.sum(-1, keepdim=True))


def stick_breaking(scores: torch.Tensor, visible: torch.Tensor, attend_current: bool) -> torch.Tensor:
    """Weights (..., rows, keys) from scores z (float32; the values at hidden keys are not read)."""
    own = own_key(visible)
    breaking = visible if attend_current else visible & ~own
    log_beta = F.logsigmoid(scores).masked_fill(~breaking, float("-inf"))
    log_rest = F.logsigmoid(-scores).masked_fill(~breaking, 0.0)  # log(1 - beta)
    # sum over the keys after j (nearer the query) of log(1 - beta): the reverse cumulative sum, exclusive of j
    after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest
    weights = torch.exp(log_beta + after)
    remainder = torch.exp(log_rest.sum(-1, keepdim=True))  # what no key claimed: prod (1 - beta)
    return weights + own * remainder


@register_encoding("stickbreaking")
class StickBreaking(PositionEncoding):
    """Stick-breaking attention weights instead of softmax; no position information besides them."""

    Settings = StickBreakingSettings
    own_weights = True
    why_explicit = "weights of its own instead of softmax"
    reads_positions = False

    def attention_weights(self, scores: torch.Tensor, state: Any, layer: int,
                          visible: torch.Tensor | None) -> torch.Tensor:
        if visible is None:
            raise ConfigError("stickbreaking attention is causal: it needs each query's own key")
        with torch.autocast(device_type=scores.device.type, enabled=False):  # float32, or float64 for a reference
            exact = scores.to(torch.promote_types(scores.dtype, torch.float32))
            return stick_breaking(exact, visible, self.settings.attend_current)
