"""fox: Forgetting Attention (Lin et al., ICLR 2025, "Forgetting Transformer: Softmax Attention with a Forget
Gate"), without other position information, as the paper's default FoX.

Each layer has a forget gate per head, f_t = sigmoid(w_h . x_t + b_h), computed from the layer's input x_t; the
logit of query i and key j <= i gets the bias D_ij = sum_{l = j+1..i} log f_l = c_i - c_j with c_t the running sum
of log f up to t. Nearer keys lose less; how fast a head forgets depends on the content. As the reference
(zhixuan-lin/forgetting-transformer, ForgettingAttentionLayer with fgate_type "full"): the gate is a linear map
of the layer input with a bias, weights normal(0, init_std) and bias zero; log f is taken in float32. The gates of
cached tokens are kept in the KV cache (as the reference's cache keeps log f), so a cached step sees the same sums
as a full forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.encodings import ALL, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


@dataclass
class ForgetSums(Positions):
    """One layer's state: the running sums c of log f of the queries (batch, heads, q_time) and of every key
    attended (batch, heads, k_time), float32."""

    queries_sum: torch.Tensor | None = None
    keys_sum: torch.Tensor | None = None


@register_encoding("fox")
class ForgettingAttention(PositionEncoding):
    """A data-dependent forget gate per layer and head, its cumulative log added to the logits."""

    has_score_bias = True
    bias_from_content = True
    reads_positions = False
    separable_bias = True  # c_i - c_j: a long no-grad forward takes FlexAttention (model/attention/flex.py)
    # The model's learning rate and no weight decay. The reference decays the gate's weight as any matrix and not
    # its bias; one group holds both here, and without decay the bias, which sets how fast a head forgets, stays
    # free. Measured: 10x the learning rate and decay 0.1 are within seed noise of this (docs/baselines.md).
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        # One gate per layer that uses FoX, keyed by layer index (a hybrid's other layers get none).
        self.gates = nn.ModuleDict({str(index): nn.Linear(config.dim, config.n_heads, bias=True)
                                    for index in self.layers_using()})

    def reset_parameters(self) -> None:
        for gate in self.gates.values():  # the weight is a matrix, initialised with the model's
            nn.init.zeros_(gate.bias)

    def for_layer(self, x: torch.Tensor, state: Positions, layer: int, kv_cache: Any = None) -> ForgetSums:
        with torch.autocast(device_type=x.device.type, enabled=False):
            gate = self.gates[str(layer)]
            log_f = F.logsigmoid(F.linear(x.float(), gate.weight.float(), gate.bias.float())).transpose(1, 2)
        queries = slice(None)
        if kv_cache is not None:  # every cached token's log f, and where the new ones are among them
            log_f, queries = kv_cache.update_extra(layer, "fox_log_f", log_f)
        sums = log_f.cumsum(-1)  # (batch, heads, keys): c_t
        return ForgetSums(state.queries, state.keys, sums[:, :, queries], sums)

    def separable_terms(self, state: ForgetSums) -> tuple[torch.Tensor, torch.Tensor]:
        return state.queries_sum, state.keys_sum

    def score_bias(self, q: torch.Tensor, state: ForgetSums, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        return state.queries_sum[:, :, rows, None] - state.keys_sum[:, :, None, keys]  # c_i - c_j
