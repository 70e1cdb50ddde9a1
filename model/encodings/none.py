"""none (NoPE): no position encoding; only the causal mask tells tokens apart by order."""
from __future__ import annotations

from model.encodings import PositionEncoding, register_encoding


@register_encoding("none")
class NoPE(PositionEncoding):
    """No position encoding (NoPE): only the causal mask tells tokens apart by order."""

    encodes_positions = False
    reads_positions = False
