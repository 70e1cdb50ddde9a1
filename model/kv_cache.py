"""Preallocated key/value caches with a length counter (as in gpt-fast's KVCache).

KVCache returns the filled part of its buffers, so attention sees exactly the keys written so far.
StaticKVCache always returns all `max_len` slots and lets a mask hide the unfilled ones; its write position
is a tensor, so every single-token step has the same shapes and a compiled step never recompiles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from errors import ConfigError


@dataclass
class Derived:
    """A backend's tensor derived from a layer's cached keys or values, (batch, heads, max_len, dim): its first
    `valid` slots hold, computed with `tables` (what the derivation read besides the cache, to be compared)."""

    buffer: torch.Tensor
    valid: int = 0
    tables: tuple = ()


class KVCache:
    """Holds keys and values for every layer, preallocated for `max_len` positions.

    Keys are stored after the position encoding's `encode_keys` hook, or raw when the encoding rotates all keys
    at every step (dynamic NTK), or as the encoding last rewrote them (`rewrite_keys`: PaTH keeps every key
    transformed up to the latest token). The buffers are created on the first
    update, in the dtype and on the device of the keys (so autocast decoding caches bf16).
    """

    static = False

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int) -> None:
        self.shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.max_len = max_len
        if not self.static:
            self.length = 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None  # (batch, max_len) position of every cached key
        # With model.random_positions: the positions (batch, max_len) drawn for every slot with the first tokens
        # (model/random_positions.py); each forward takes those of the slots it fills.
        self.position_plan: torch.Tensor | None = None
        # An encoding's own per-token tensors, (batch, channels, max_len) per (layer, name): what it computed from
        # each cached token's content (FoX's forget gates), kept beside its key.
        self.extras: dict[tuple[int, str], torch.Tensor] = {}
        # What an attention backend derives from a layer's cached keys and values and keeps between forwards (the
        # merged path's keys encoded per pass), layer -> name -> Derived; a write at a slot invalidates it from there.
        self.derived: dict[int, dict[Any, Derived]] = {}

    @classmethod
    def for_model(cls, config, batch_size: int, max_len: int) -> "KVCache":
        return cls(config.n_layers, batch_size, config.n_kv_heads, config.head_dim, max_len)

    def next_positions(self, time: int, device: torch.device) -> torch.Tensor:
        """Positions (1, time) of tokens that continue the cached ones."""
        return torch.arange(self.length, self.length + time, device=device)[None, :]

    def check_room(self, end: int) -> None:
        if end > self.max_len:
            raise ConfigError(
                f"KV cache holds {self.max_len} positions but {end} are needed; create it with a larger max_len"
            )

    def allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.keys is None:
            self.keys = torch.zeros(self.shape, dtype=keys.dtype, device=keys.device)
            self.values = torch.zeros(self.shape, dtype=values.dtype, device=values.device)

    def add_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Record the positions (batch|1, time) of the tokens being added; return those of all cached keys."""
        end = self.length + positions.shape[1]
        self.check_room(end)
        if self.positions is None:
            self.positions = torch.zeros(self.shape[1], self.max_len, dtype=torch.long, device=positions.device)
        self.positions[:, self.length : end] = positions
        return self.positions[:, :end]

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new (batch, kv_heads, time, head_dim) keys/values after the cached ones; return all of them."""
        end = self.length + keys.shape[2]
        self.check_room(end)
        self.invalidate(layer, self.length)
        self.allocate(keys, values)
        self.keys[layer, :, :, self.length : end] = keys
        self.values[layer, :, :, self.length : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def rewrite_keys(self, layer: int, keys: torch.Tensor) -> None:
        """Replace the keys of this forward's slots and all before them (batch, kv_heads, keys, head_dim): an
        encoding whose cached keys change with every new token (PaTH) writes them back."""
        self.invalidate(layer, 0)
        self.keys[layer, :, :, : keys.shape[2]] = keys

    def invalidate(self, layer: int, slot: int) -> None:
        """What was derived from this layer's slots from `slot` on no longer holds (they are being written)."""
        for derived in self.derived.get(layer, {}).values():
            derived.valid = min(derived.valid, slot)

    def update_extra(self, layer: int, name: str, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write an encoding's per-token tensor (batch, channels, time) of the new tokens after the cached ones;
        return all of them (batch, channels, keys) and the columns of the new tokens among them (time,)."""
        end = self.length + values.shape[2]
        self.check_room(end)
        buffer = self.extra_buffer(layer, name, values)
        buffer[:, :, self.length : end] = values
        return buffer[:, :, :end], torch.arange(self.length, end, device=values.device)

    def extra_buffer(self, layer: int, name: str, values: torch.Tensor) -> torch.Tensor:
        key = (layer, name)
        if key not in self.extras:
            self.extras[key] = values.new_zeros(values.shape[0], values.shape[1], self.max_len)
        return self.extras[key]

    def advance(self, steps: int) -> None:
        self.length += steps


class StaticKVCache(KVCache):
    """A KVCache whose reads always span all max_len slots (gpt-fast's static cache, for compiled decoding).

    Slots not yet written are hidden by `visible`; their keys are zeros and their positions 0, which the
    mask makes irrelevant to every encoding (bias, relative or rotary).
    """

    static = True

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int) -> None:
        super().__init__(n_layers, batch_size, n_kv_heads, head_dim, max_len)
        self.cursor: torch.Tensor | None = None  # () long: the number of filled slots, kept on the device

    @property
    def length(self) -> int:
        return 0 if self.cursor is None else int(self.cursor)

    def start(self, device: torch.device) -> torch.Tensor:
        if self.cursor is None:
            self.cursor = torch.zeros((), dtype=torch.long, device=device)
            self.slots = torch.arange(self.max_len, device=device)
        return self.cursor

    def next_positions(self, time: int, device: torch.device) -> torch.Tensor:
        return (self.start(device) + torch.arange(time, device=device))[None, :]

    def slot_index(self, time: int, device: torch.device) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # the bounds check reads the cursor: eager calls only
            self.check_room(self.length + time)
        return self.start(device) + torch.arange(time, device=device)

    def add_positions(self, positions: torch.Tensor) -> torch.Tensor:
        index = self.slot_index(positions.shape[1], positions.device)
        if self.positions is None:
            self.positions = torch.zeros(self.shape[1], self.max_len, dtype=torch.long, device=positions.device)
        self.positions.index_copy_(1, index, positions.expand(self.shape[1], -1))
        return self.positions

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.slot_index(keys.shape[2], keys.device)
        self.allocate(keys, values)
        self.keys[layer].index_copy_(2, index, keys)
        self.values[layer].index_copy_(2, index, values)
        return self.keys[layer], self.values[layer]

    def rewrite_keys(self, layer: int, keys: torch.Tensor) -> None:
        """Replace the keys of all max_len slots (batch, kv_heads, max_len, head_dim)."""
        self.keys[layer].copy_(keys)

    def update_extra(self, layer: int, name: str, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All max_len slots (unwritten ones zero, hidden by the mask) and the new tokens' slots."""
        index = self.slot_index(values.shape[2], values.device)
        buffer = self.extra_buffer(layer, name, values)
        buffer.index_copy_(2, index, values)
        return buffer, index

    def visible(self, q_len: int, device: torch.device) -> torch.Tensor:
        """(q_len, max_len) True where a new query may attend a slot: filled slots up to its own."""
        query_slots = self.start(device) + torch.arange(q_len, device=device)
        return self.slots[None, :] <= query_slots[:, None]

    def advance(self, steps: int) -> None:
        self.cursor.add_(steps)
