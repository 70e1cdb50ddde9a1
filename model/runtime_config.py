"""RuntimeConfig: the `[runtime]` section of a run config, plain data (no torch), so that reading a config stays
cheap; model/runtime.py puts it in effect."""
from __future__ import annotations

from dataclasses import dataclass

from errors import ConfigError


@dataclass
class RuntimeConfig:
    """How, not what, this process computes: the `[runtime]` section of a run config (train/config.py), saved in
    run_config.toml and in a comparison's results.json. Each switch picks between paths that compute the same
    numbers (within float rounding, tested); turning one off is for an A/B measurement or a machine where
    compiling is unwanted."""

    compiled_rope: bool = True  # long no-grad CPU rotations run compiled (model/rope.py)
    keep_freed_memory: bool = True  # glibc keeps freed blocks for reuse (keep_freed_memory below)
    compiled_pointwise: bool = True  # long no-grad CPU norms and scored log-sum-exps run compiled (model/compiled.py)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, bool):
                raise ConfigError(f"runtime.{name} must be true or false, got {value!r}")


# The settings of a model built without any (Transformer(config), load_model(folder)): the defaults, fixed.
DEFAULTS = RuntimeConfig()

# Switches runs saved before the attention backend became the model's setting (model.attention_backend): they chose
# FlexAttention's use, which the backend's rules now decide; a saved run's [runtime] drops them on loading.
RETIRED = {"flex_attention": "model.attention_backend (\"explicit\" keeps a model off FlexAttention)",
           "flex_cuda": "model.attention_backend = \"flex\" (FlexAttention on CUDA too)"}
