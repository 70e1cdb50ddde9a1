"""A preallocated key/value cache with a length counter (as in gpt-fast's KVCache)."""
from __future__ import annotations

import torch


class KVCache:
    """Holds keys and values for every layer, preallocated for `max_len` positions.

    Keys are stored after the position encoding's `rotate_keys` hook, or raw when the encoding rotates all keys
    at every step (dynamic NTK). The buffers are created on the first
    update, in the dtype and on the device of the keys (so autocast decoding caches bf16).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int) -> None:
        self.shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.length = 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None  # (batch, max_len) position of every cached key

    @classmethod
    def for_model(cls, config, batch_size: int, max_len: int) -> "KVCache":
        return cls(config.n_layers, batch_size, config.n_kv_heads, config.head_dim, max_len)

    def add_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Record the positions (batch|1, time) of the tokens being added; return those of all cached keys."""
        end = self.length + positions.shape[1]
        if end > self.max_len:
            raise ValueError(
                f"KV cache holds {self.max_len} positions but {end} are needed; create it with a larger max_len"
            )
        if self.positions is None:
            self.positions = torch.zeros(self.shape[1], self.max_len, dtype=torch.long, device=positions.device)
        self.positions[:, self.length : end] = positions
        return self.positions[:, :end]

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new (batch, kv_heads, time, head_dim) keys/values after the cached ones; return all of them."""
        end = self.length + keys.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache holds {self.max_len} positions but {end} are needed; create it with a larger max_len"
            )
        if self.keys is None:
            self.keys = torch.zeros(self.shape, dtype=keys.dtype, device=keys.device)
            self.values = torch.zeros(self.shape, dtype=values.dtype, device=values.device)
        self.keys[layer, :, :, self.length : end] = keys
        self.values[layer, :, :, self.length : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps
