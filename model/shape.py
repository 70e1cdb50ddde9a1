"""ModelShape: what the plug-ins read of a model's config, as a typing.Protocol.

The plug-ins (the encodings of model/encodings/, the attention methods of model/attention_methods.py and their
checks in model/plugins.py) are given a model's config to build from and to check. They name its type as
ModelShape, the fields and accessors they read, rather than ModelConfig: model/config.py imports the plug-ins' checks
when a config is built (ModelConfig.__post_init__ -> model/plugins.py), so the plug-ins do not import it back, not even
for a type hint. ModelConfig has every member below (tests/test_config.py checks it); a new field that a plug-in reads
is added here too.

This module imports nothing of model/.
"""
from __future__ import annotations

from typing import Protocol


class ModelShape(Protocol):
    """The fields and accessors of ModelConfig (model/config.py) that the plug-ins read; their meaning is there.
    Plug-ins' checks may complete position_args, rope_scaling and attention_methods in place."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    max_seq_len: int
    position: str
    position_args: dict
    position_layers: list
    rope_theta: float
    rope_layout: str
    rope_scaling: dict | None
    rope_theta_layers: list
    rope_scaling_layers: list
    attention_methods: list
    random_positions: int

    @property
    def head_dim(self) -> int: ...

    @property
    def original_length(self) -> int: ...

    def layer_encodings(self) -> list[str]: ...

    def layer_rope_thetas(self) -> list[float]: ...

    def layer_rope_scaled(self) -> list[bool]: ...

    def layer_sinks(self) -> list[bool]: ...

    def layer_windows(self) -> list[int]: ...

    def layer_chunks(self) -> list[int]: ...
