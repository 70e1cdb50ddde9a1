"""The probes a fleet of trained models runs on each of its models (experiments.compare's compare.probes): attention
diagnostics, the induction probe, passkey retrieval and the use of the text past L, each on one checkpoint, at each
probe length; a length the model cannot run (a learned table's end) is recorded as an error, not raised.

    PROBES[name](model, checkpoint, ids, trained, settings, separator) -> the probe's rows

`settings`: probe_lengths, probe_tokens, passkey_trials, use_windows (window length -> windows), use_distances,
methods, use_priming.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from data.tokenizer import load_tokenizer
from errors import ConfigError, PositionRangeError
from eval.attention_diagnostics import attention_statistics, summarise
from eval.extrapolation import resolve_length
from eval.induction import FLEET_TRIALS, fleet_block, induction_probe, ordinary_token_ids
from eval.passkey import FLEET_DEPTHS, evaluate_passkey
from eval.use import fleet_probe


def per_length(settings: dict, trained: int, measure_at: Callable[[int], Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for item in settings["probe_lengths"]:
        try:
            rows[item] = measure_at(resolve_length(item, trained))
        except (ConfigError, PositionRangeError) as error:
            rows[item] = {"error": str(error)}
    return rows


def attention(model, checkpoint: Path, ids: np.ndarray, trained: int, settings: dict, separator: int) -> dict:
    return per_length(settings, trained, lambda length: summarise(
        attention_statistics(model, ids, length, settings["probe_tokens"]), trained))


def induction(model, checkpoint: Path, ids: np.ndarray, trained: int, settings: dict, separator: int) -> dict:
    """At each probe length, the second copy ends the sequence: distance = length - block."""
    ordinary, block = ordinary_token_ids(load_tokenizer(checkpoint), model.config.vocab_size), fleet_block(trained)
    return per_length(settings, trained, lambda length: induction_probe(model, ordinary, [length - block], block,
                                                                        FLEET_TRIALS, seed=0)[0])


def passkey(model, checkpoint: Path, ids: np.ndarray, trained: int, settings: dict, separator: int) -> dict:
    return per_length(settings, trained, lambda length: evaluate_passkey(
        model, load_tokenizer(checkpoint), [length], FLEET_DEPTHS, settings["passkey_trials"], seed=0))


def use(model, checkpoint: Path, ids: np.ndarray, trained: int, settings: dict, separator: int) -> dict:
    windows = {int(n): w for n, w in settings["use_windows"].items()}
    return fleet_probe(model, ids, trained, max(windows), settings["use_distances"], windows, settings["methods"],
                       settings["use_priming"], separator)


PROBES = {"attention": attention, "induction": induction, "passkey": passkey, "use": use}
