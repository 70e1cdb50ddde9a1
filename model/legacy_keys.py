"""The flat [model] keys of the configs written before model.position_args, and where each went.

Checkpoints and runs of then spelled an encoding's settings as flat ModelConfig keys (`t5_max_distance = 16`); today
they are `model.position_args.t5.max_distance`. A saved config (a checkpoint's config.json, a run's saved settings)
is read in today's form (`migrate_saved`); user input spelled the old way is refused with the new name
(`refuse_legacy_keys`). The table is history and closed: an encoding added since has its settings in position_args
alone. It is kept here, apart from the encodings' registry, so that reading it loads neither the registry nor torch:
ModelConfig reads it, and so does train/args.py, which checks a command line's keys before torch loads.
"""
from __future__ import annotations

from typing import Any

from errors import ConfigError

# Old key -> (encoding, its setting) for each encoding that read it (xpos is RoPE with a decay: it read RoPE's too).
LEGACY_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "t5_num_buckets": (("t5", "num_buckets"),),
    "t5_max_distance": (("t5", "max_distance"),),
    "shaw_max_distance": (("shaw", "max_distance"),),
    "sinusoidal_embedding": (("sinusoidal", "embedding"),),
    "learned_max_positions": (("learned", "max_positions"),),
    "learned_clamp": (("learned", "clamp"),),
    "fire_mlp_width": (("fire", "mlp_width"),),
    "fire_threshold": (("fire", "threshold"),),
    "cope_positions": (("cope", "positions"),),
    "rope_fraction": (("rope", "fraction"), ("xpos", "fraction")),
    "rope_p": (("rope", "p"), ("xpos", "p")),
    "xpos_scale_base": (("xpos", "scale_base"),),
}


def refuse_legacy_keys(values: dict[str, Any]) -> None:
    """User input (a TOML file, an override) that spells an encoding's setting the old way: name the new key."""
    for old, owners in LEGACY_KEYS.items():
        if old in values:
            spelled = " or ".join(f"model.position_args.{name}.{new}" for name, new in owners)
            raise ConfigError(f"model.{old} is now {spelled} (on the command line: "
                              f"--model.position_args.{owners[0][0]}.{owners[0][1]}=...)")


def migrate_saved(values: dict[str, Any]) -> dict[str, Any]:
    """A saved model config (a checkpoint's config.json, a run's saved config) written before model.position_args,
    in today's form: each flat encoding key moves into position_args for the encodings the model uses that read it,
    and is dropped for the others (it had no effect on them). A config without such keys is returned unchanged."""
    if not any(old in values for old in LEGACY_KEYS):
        return values
    values = dict(values)
    pattern = values.get("position_layers") or [values.get("position", "rope")]
    used = set(pattern) | {values.get("position", "rope")}
    args = {name: dict(settings) for name, settings in (values.get("position_args") or {}).items()}
    for old, targets in LEGACY_KEYS.items():
        if old not in values:
            continue
        value = values.pop(old)
        for name, new in targets:
            if name in used:
                args.setdefault(name, {})[new] = value
    values["position_args"] = args
    return values
