"""What ModelConfig asks of the plug-ins: the one interface between the config and the registries.

model/config.py checks the model's shape and the fields it owns; what belongs to a plug-in (an encoding's own
settings and its demands on the model, the RoPE scaling, the inference-time attention methods) is checked here by
the plug-in's own code, found through its registry (model/encodings/, model/rope.py, model/attention_methods.py).
check_plugins runs where a config comes in and where a model is built: train/config.build_run_config (a run's
config, before anything is written), model/checkpoint.load_config (a checkpoint's config.json) and
Transformer.__init__ (every model and view); it is idempotent. ModelConfig never imports this module: building or
reading a config loads no registry and not torch; importing this module loads none either (check_plugins imports
the registries when it runs). No plug-in imports config.py either, not even for a type hint; they
name what they read of a config as ModelShape (model/shape.py, a Protocol that ModelConfig satisfies). So a new
encoding never edits the config.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar

from errors import ConfigError
from model.shape import ModelShape

S = TypeVar("S", bound=ModelShape)


def check_plugins(config: S) -> S:
    """Check (and complete, in place) what of `config` belongs to the plug-ins; raise ConfigError naming the key.
    Returns `config`."""
    # The registries load here, not at the top: importing this module (train/config.py does) loads no plug-in and
    # not torch, so a command line is checked before torch loads (train/args.py).
    from model.attention_methods import ATTENTION_METHODS, check_applies, normalize_methods
    from model.encodings import POSITION_ENCODINGS
    from model.encodings.base import settings_from
    from model.rope import normalize_rope_scaling

    valid = sorted(POSITION_ENCODINGS)
    if config.position not in POSITION_ENCODINGS:
        raise ConfigError(f"model.position: unknown encoding {config.position!r}; valid names are {valid}")
    unknown = [name for name in config.position_layers if name not in POSITION_ENCODINGS]
    if unknown:
        raise ConfigError(f"model.position_layers: unknown encoding(s) {unknown}; valid names are {valid}")
    whole_model = sorted({name for name in config.position_layers if not POSITION_ENCODINGS[name].per_layer})
    if whole_model:
        raise ConfigError(f"model.position_layers: {whole_model} act on the token embeddings of the whole model and "
                          "cannot be chosen per layer; use relative or rotary encodings")
    used = list(dict.fromkeys(config.layer_encodings()))
    given = config.position_args
    if not isinstance(given, dict) or any(not isinstance(values, dict) for values in given.values()):
        raise ConfigError(f"model.position_args holds a table of settings per encoding, e.g. "
                          f"{{t5 = {{max_distance = 64}}}}; got {given!r}")
    stray = [name for name in given if name not in used]
    if stray:
        raise ConfigError(f"model.position_args: settings for {stray}, which this model does not use (it uses "
                          f"{used}); remove them or set model.position")
    if config.random_positions and not any(POSITION_ENCODINGS[name].reads_positions for name in used):
        raise ConfigError(f"model.random_positions: {used} read no position ids (their attention depends on the "
                          "content alone), so randomized positions would change nothing; use it with an encoding "
                          "that reads positions, such as rope, sinusoidal, learned or alibi")
    own = sorted({name for name, sinks in zip(config.layer_encodings(), config.layer_sinks())
                  if sinks and POSITION_ENCODINGS[name].own_weights})
    if own:
        raise ConfigError(f"model.sink_logits: {own} compute weights of their own instead of a softmax, which a sink "
                          "logit joins; give the sinks to layers with a softmax encoding")
    for name in used:  # the model's shape first, then the encodings' own settings
        POSITION_ENCODINGS[name].check_config(config)
    completed = {}
    for name in used:
        cls = POSITION_ENCODINGS[name]
        if cls.Settings is None:
            if given.get(name):
                raise ConfigError(f"model.position_args.{name}: {name} has no settings of its own")
            continue
        settings = settings_from(cls.Settings, given.get(name, {}), config, f"model.position_args.{name}")
        completed[name] = dataclasses.asdict(settings)
    config.position_args = completed
    if config.rope_theta_layers or config.rope_scaling_layers:
        readers = [name for name in used if "rope_theta" in POSITION_ENCODINGS[name].model_settings]
        unable = [name for name in readers if not POSITION_ENCODINGS[name].per_layer_rope]
        if not readers or unable:
            raise ConfigError(f"model.rope_theta_layers and model.rope_scaling_layers set RoPE per layer for rope and "
                              f"xpos; this model's RoPE-like encodings are {readers or 'none'}")
    if config.rope_scaling is not None:
        if "rope_scaling" not in POSITION_ENCODINGS[config.position].model_settings:
            readers = " or ".join(repr(name) for name, cls in POSITION_ENCODINGS.items()
                                  if "rope_scaling" in cls.model_settings)
            raise ConfigError(f"model.rope_scaling applies to position = {readers}, not {config.position!r}")
        try:
            config.rope_scaling = normalize_rope_scaling(config.rope_scaling, config.max_seq_len)
        except ConfigError as error:
            raise ConfigError(f"model.rope_scaling: {error}") from error
    if config.attention_methods:  # a model that sets none never enters model/attention_methods.py
        config.attention_methods = normalize_methods(config.attention_methods, config.original_length)
    for entry in config.attention_methods:
        check_applies(ATTENTION_METHODS[entry["method"]], config)
    return config

