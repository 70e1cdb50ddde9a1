"""A learned position table past its end: positions beyond it reuse its last row (learned encodings only)."""
from __future__ import annotations

from model.methods import Method, register


def _clamp(own: dict, length: int, trained: int) -> dict:
    args = own.get("position_args", {})
    return {"position_args": {**args, "learned": {**args.get("learned", {}), "clamp": True}}}


def _table_size(own: dict) -> int:
    return own.get("position_args", {}).get("learned", {}).get("max_positions") or own["max_seq_len"]


register(Method(("learned",), _clamp, summary="positions past the learned table reuse its last row", shift_probe=True,
                as_trained_at=lambda own, length, trained: length <= _table_size(own), name="clamp"))
