"""Attention: the layer (layer.py) and the backends that compute it, one file each (sdpa.py, sdpa_mask.py, explicit.py,
merged.py, flex.py), collected and chosen in registry.py behind the interface of backend.py."""
from model.attention.chunks import at_least_float32, key_range, token_slots, visible_keys
from model.attention.layer import Attention

__all__ = ["Attention", "at_least_float32", "key_range", "token_slots", "visible_keys"]
