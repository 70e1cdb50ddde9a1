"""The model: a small Llama-style decoder with pluggable position encodings.

Importing the package imports nothing heavy: `from model import Transformer` (and the other names below) loads its
module on first use, so a command can check its arguments (model/fields.py, commands.py) before torch is imported.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"ConfigError": "errors", "ModelConfig": "model.config",
            "KVCache": "model.kv_cache", "StaticKVCache": "model.kv_cache", "Transformer": "model.transformer",
            "IGNORE_INDEX": "model.transformer"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
