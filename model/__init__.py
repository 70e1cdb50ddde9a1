"""The model: a small Llama-style decoder with pluggable position encodings."""
from errors import ConfigError
from model.config import ModelConfig
from model.kv_cache import KVCache, StaticKVCache
from model.plugins import check_plugins
from model.transformer import IGNORE_INDEX, Transformer

__all__ = ["ConfigError", "ModelConfig", "check_plugins", "KVCache", "StaticKVCache", "Transformer", "IGNORE_INDEX"]
