"""The position encodings, one file each, registered by name: the registry.

    none        NoPE: the causal mask only                       none.py
    alibi       ALiBi's fixed linear distance bias               alibi.py
    t5          T5's learned bias per distance bucket            t5.py
    shaw        Shaw et al.'s learned relative key and value     shaw.py
    sinusoidal  fixed absolute sinusoids added to the input      sinusoidal.py
    learned     a learned absolute table added to the input      learned.py
    kerple      KERPLE's learned log-distance kernel             kerple.py
    fire        FIRE's MLP over normalised distance              fire.py
    cope        CoPE's contextual (gated) positions              cope.py
    rope, xpos  rotary, with partial rotary, p-RoPE; xPos decay  rotary.py
    ssmax       Scalable-Softmax: queries times s log n, no RoPE  ssmax.py
    fox         Forgetting Attention: a forget gate's cumulative  fox.py
                log bias, from the content
    stickbreaking  stick-breaking weights instead of softmax      stickbreaking.py
    dape        an MLP rewrites ALiBi's or KERPLE's bias from the  dape.py
                logits of all heads
    path        PaTH: keys carried to each query through           path.py
                Householder-like transforms from the content
    asentmax    alpha-entmax weights, each query's logits scaled   asentmax.py
                by a learned temperature that grows with log n
    pope        polar positions: softplus magnitudes from the      pope.py
                content, phases from the position alone
    fope        Fourier series over RoPE's frequencies, those      fope.py
                below 2 pi / L clipped
    decoupled   DeepSeek's decoupled RoPE (MLA's position part):   decoupled.py
                rotary q and one shared rotary key beside
                position-free q, k

The interface and its hooks: base.py. A new encoding is a file here that registers its class with
`@register_encoding("name")`, plus its line in ENCODING_MODULES; nothing else in the model names it. Importing this package
imports those files. model/config.py never imports it: it asks model/plugins.py, which imports the registry when a
config is first checked.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from model.shape import ModelShape

if TYPE_CHECKING:
    from model.encodings.base import PositionEncoding

# The files of model/encodings/ that register encodings, in the order of the registry (and of its listings).
ENCODING_MODULES = ("none", "alibi", "t5", "shaw", "sinusoidal", "learned", "kerple", "fire", "cope", "rotary",
                    "ssmax", "fox", "stickbreaking", "dape", "path", "asentmax", "pope", "fope",
                    "decoupled")

POSITION_ENCODINGS: dict[str, type["PositionEncoding"]] = {}


def register_encoding(name: str) -> Callable[[type["PositionEncoding"]], type["PositionEncoding"]]:
    def decorator(cls: type["PositionEncoding"]) -> type["PositionEncoding"]:
        if name in POSITION_ENCODINGS and POSITION_ENCODINGS[name] is not cls:
            raise ValueError(f"position encoding {name!r} is registered twice")
        cls.name = name
        POSITION_ENCODINGS[name] = cls
        return cls

    return decorator


def build_position_encoding(config: ModelShape, name: str | None = None) -> "PositionEncoding":
    """The encoding `name` (default model.position) for `config`."""
    return POSITION_ENCODINGS[name or config.position](config)


for _module in ENCODING_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
