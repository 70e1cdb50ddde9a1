"""Use on the same weights: how far back does a model read its text? No training; any checkpoint, any method.

    python -m eval.use --checkpoint runs/demo --lengths 1x,16x --distances 0.5x,2x,4x,8x,max --out runs/use
    python -m eval.use --checkpoint runs/smollm2 --data book.txt --lengths 1x,2x \\
        --distances 0.25x,0.75x,1.25x,1.75x --methods none,yarn,selfextend,sinks --out runs/use_smollm2

The probe (after the forgetting-curve probes of arXiv 2410.04727): a window of T (--lengths) tokens of held-out text
in which K (--per-distance) passages of S (--span) tokens, taken from elsewhere in the same text, are each written
twice, the second copy d tokens after the first, for every distance d of --distances. The control is the identical
window with each first copy replaced by another passage of the same text: the same positions, the same second
copies, the same method, every other token the same. A model that reads the first copy from its second predicts
the second copy better in the probe than in the control:

    use(d) = NLL(control) - NLL(probe)   on tokens 2..S of each second copy (token 1 has nothing that predicts it)

in nats, averaged over the K passages of a window; the interval is Student's t 95% over windows, and a cell with
fewer than 3 windows has none (the passages of one window share its text and its two forwards: they are not
independent draws). One probe and one control forward measure every distance at once: the second copies are packed
at the end of the window, distances interleaved, so each distance is scored at about the same positions (the longest
distance's first copy then lies just after the window's lead in every window: that column also measures the
layout, so a "max" column is shown and not counted in the reach; experiments.use_grid draws each window's places
instead, eval.use.jittered). Verdicts (calibrate, eval/verdicts.py use_verdicts): the
rows past the positive control are one family against the margin, a tenth of the positive control's use (at least
--margin, its standard error carried); "uses" where a one-sided t test, Holm-corrected over the family, shows use
above the margin; "negligible" where it shows use above 0 and the 95% interval lies below the margin; "none" where
the 95% interval lies within +-margin; else "cannot tell". Each row's reach: the largest distance at which it and
every nearer one read "uses".

On a text of many documents (separated by <|endoftext|>) a first copy can lie in an earlier document than its
second: each row counts those passages (`across_documents`), and the table shows the count. Their use measures
reading across a document boundary, which a model trained on packed documents does less (docs/evaluation.md).

Self-checks beside every table: the positive control (in windows of at most L tokens, where the model meets only
positions it trained at, a distance within L must read "uses" for a model that reads its context: a model that does
not copy within L cannot show use past it) and the negative control (a method whose
attention cannot reach a distance, sinks or a sliding window, must read "none" there).

--priming adds a third forward, the priming control: each first copy holds its passage's tokens shuffled (the same
tokens in context, not in order). presence = NLL(control) - NLL(shuffled) and order = NLL(shuffled) - NLL(probe) =
use - presence, each with its interval over windows: a use that is presence is priming, not reading.

The second view, from the same forwards: the control's loss on natural tokens by how far back the n-gram before them
(--ngram tokens) last occurred, beside tokens whose n-gram never occurred earlier in the window.

Distances and lengths are multiples of the trained length L ("2x") or token counts; "max" is the longest distance
the longest window holds; each length measures the distances that fit in it. Writes OUT/results.json, OUT/report.md and OUT/use.png.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commands import (
    add_checkpoint,
    add_device,
    add_out,
    comma_list,
    command_parser,
    parse,
    portable_command,
    require,
    results_json,
)
from data.tokenizer import ENDOFTEXT, load_tokenizer
from errors import ConfigError, DataError, PositionRangeError, cli_command
from eval import figures
from eval.extrapolation import parse_lengths, resolve_length
from eval.heldout import checkpoint_eval_tokens
from eval.scoring import score_incremental, score_windows
from eval.segments import choose_segments
from eval.stats import (
    MIN_DRAWS,
    Estimate,
    Spread,
    bounded_t_interval,
    draws_interval,
    spread,
    spread_interval,
    t_interval,
    t_quantile_975,
)
from eval.verdicts import (
    MARGIN_FLOOR,
    USE_RULE,
    Margin,
    impossible_use,
    positive_control,
    reach_of,
    separated_by_windows,
    use_margin,
    use_verdicts,
    verdict,
)
from model.checkpoint import load_model, trained_length, training_data_dir
from model.methods import ATTENTION_METHODS, NONE, applies, check_methods, label, method_spec, normalize_methods
from model.runtime import autocast_dtype, configure_runtime, resolve_device
from model.transformer import Transformer

LEAD = 16  # the window's first tokens stay natural text (attention sinks see them); 1/16 of a shorter window
GAP = 2  # natural tokens kept between any two written passages
DEFAULT_MARGIN = 0.05  # nats: a use smaller than this is too small to matter


@dataclass(frozen=True)
class Placement:
    """One repeated passage: its first copy starts at token `first` of the window, its second at `second`."""

    distance: int
    first: int
    second: int

    def scored(self, span: int) -> np.ndarray:
        """The loss columns of tokens 2..S of the second copy (column p is the loss of token p + 1)."""
        return np.arange(self.second, self.second + span - 1)


def place(length: int, span: int, distances: list[int], per_distance: int) -> list[Placement]:
    """Where each of `per_distance` passages per distance goes in a window of length + 1 tokens: second copies packed
    from the window's end backwards, distances interleaved (largest first in each round), first copies `distance`
    before them; no two passages within GAP tokens of each other, none in the first lead_tokens(length). Raises ConfigError
    when they do not fit."""
    if span < 2:
        raise ConfigError(f"--span must be at least 2 tokens (token 1 of a copy is never scored), got {span}")
    short = [d for d in distances if d < span + GAP]
    if short:
        raise ConfigError(f"distances {short} are shorter than a passage (--span {span}) plus {GAP}: the copies would "
                          "overlap; use longer distances or a shorter --span")
    lead = lead_tokens(length)
    used = np.zeros(length + 1 + GAP, dtype=bool)
    used[:lead] = True

    def free(start: int) -> bool:
        return start >= lead and start + span <= length + 1 and not used[max(0, start - GAP) : start + span + GAP].any()

    placements = []
    order = [d for _ in range(per_distance) for d in sorted(distances, reverse=True)]
    for distance in order:
        second = length + 1 - span
        while second - distance >= lead and not (free(second) and free(second - distance)):
            second -= 1
        if second - distance < lead:
            raise ConfigError(f"{per_distance} passages of {span} tokens at distances {sorted(distances)} do not fit "
                              f"in a window of {length:,} tokens (distance {distance} found no room); use fewer "
                              "--per-distance, a shorter --span, shorter distances or a longer --length")
        for start in (second, second - distance):
            used[start : start + span] = True
        placements.append(Placement(distance, second - distance, second))
    return sorted(placements, key=lambda p: (p.distance, p.second))


def jittered(length: int, span: int, distances: list[int], per_distance: int, rng: np.random.Generator,
             second_from: int = 0, attempts: int = 50) -> list[Placement]:
    """As place, but each second copy starts at a random free token of [max(second_from, lead + d), length + 1 -
    span] (its first copy d before it): a window's own draw, so that no distance is measured at one fixed place in
    every window (`place` puts the longest distance's first copy just after the lead in each). second_from: the
    earliest start of a second copy (L: every scored copy lies past the trained length). A draw that leaves a
    passage no room is drawn again (up to `attempts` times); then ConfigError."""
    if span < 2 or min(distances) < span + GAP:
        place(length, span, distances, 1)  # raises its error
    lead = lead_tokens(length)
    order = [d for _ in range(per_distance) for d in sorted(distances, reverse=True)]
    for _ in range(attempts):
        used = np.zeros(length + 1 + GAP, dtype=bool)
        used[:lead] = True
        placements = []
        for distance in order:
            low, high = max(second_from, lead + distance), length + 1 - span
            for second in (rng.permutation(np.arange(low, high + 1)) if low <= high else []):
                first = second - distance
                if not (used[max(0, second - GAP) : second + span + GAP].any()
                        or used[max(0, first - GAP) : first + span + GAP].any()):
                    break
            else:
                break  # no room for this passage: draw the window again
            for start in (second, first):
                used[start : start + span] = True
            placements.append(Placement(distance, int(first), int(second)))
        if len(placements) == len(order):
            return sorted(placements, key=lambda p: (p.distance, p.second))
    raise ConfigError(f"{per_distance} passages of {span} tokens at distances {sorted(distances)} found no room in "
                      f"{attempts} draws in a window of {length:,} tokens with second copies from {second_from:,}; use "
                      "fewer passages, a shorter span, shorter distances or a longer window")


def shuffled_first_copies(control: np.ndarray, probe: np.ndarray, placements: list[Placement], span: int,
                          rng: np.random.Generator) -> np.ndarray:
    """The priming control: `control` with each first copy holding the probe's passage with its tokens shuffled
    (the same tokens in context, not in order; never the order itself). NLL(shuffled) - NLL(probe) is what reading
    the copy in order adds to merely having its tokens in context."""
    shuffled = control.copy()
    for row in range(len(probe)):
        for p in placements:
            passage = probe[row, p.first : p.first + span]
            order = rng.permutation(span)
            if (passage[order] == passage).all():  # the identity (or a passage of one repeated token): roll it
                order = np.roll(np.arange(span), 1)
            shuffled[row, p.first : p.first + span] = passage[order]
    return shuffled


def lead_tokens(length: int) -> int:
    """Natural tokens kept at a window's start: LEAD, or 1/16 of a short window (at least 4, the sinks)."""
    return min(LEAD, max(4, length // 16))


def fitting_count(length: int, span: int, distances: list[int], per_distance: int) -> int:
    """The most passages per distance, up to per_distance, that fit in a window of `length` (0: none)."""
    for count in range(per_distance, 0, -1):
        try:
            place(length, span, distances, count)
            return count
        except ConfigError:
            continue
    return 0


def longest_distance(length: int, span: int, distances: list[int], per_distance: int) -> int:
    """The longest distance for which `per_distance` more passages fit beside those of `distances`."""
    for distance in range(length + 1 - span - lead_tokens(length), span + GAP - 1, -1):
        try:
            place(length, span, [*distances, distance], per_distance)
            return distance
        except ConfigError:
            continue
    raise ConfigError(f"no distance fits in a window of {length:,} tokens beside {distances}")


def draw_passages(ids: np.ndarray, avoid: tuple[int, int], count: int, span: int,
                  rng: np.random.Generator) -> np.ndarray:
    """`count` distinct passages of `span` consecutive tokens of `ids`, none overlapping ids[avoid[0]:avoid[1]] nor
    each other."""
    taken = [avoid]
    passages = []
    for _ in range(count):
        for _ in range(1000):
            start = int(rng.integers(0, len(ids) - span + 1))
            if all(start + span <= low or start >= high for low, high in taken):
                break
        else:
            raise ConfigError(f"the text ({len(ids):,} tokens) is too short to draw {count} passages of {span} "
                              "tokens outside the window; use a longer text or fewer/shorter passages")
        taken.append((start, start + span))
        passages.append(ids[start : start + span])
    return np.stack(passages)


def build_windows(ids: np.ndarray, length: int, placements: list[Placement], span: int, windows: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(probe, control), each (windows, length + 1): `windows` windows of the text spread evenly; in the probe each
    placement's passage at its first and second copy, in the control another passage at the first copy."""
    starts = choose_segments(len(ids), length + 1, windows * (length + 1), 0).starts
    if len(starts) < windows:
        raise ConfigError(f"the text ({len(ids):,} tokens) holds {len(starts)} windows of {length + 1:,} tokens, "
                          f"fewer than --windows {windows}")
    pairs = [write_copies(ids, int(start), length, placements, span, np.random.default_rng([seed, row]))
             for row, start in enumerate(starts[:windows])]
    return np.stack([probe for probe, _ in pairs]), np.stack([control for _, control in pairs])


def write_copies(ids: np.ndarray, start: int, length: int, placements: list[Placement], span: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(probe, control) of the window ids[start : start + length + 1] (int64): in the probe each placement's
    passage (drawn from the text outside the window) at its first and second copy, in the control another passage
    at the first copy."""
    probe = np.asarray(ids[start : start + length + 1], dtype=np.int64).copy()
    control = probe.copy()
    drawn = draw_passages(ids, (start, start + length + 1), 2 * len(placements), span, rng)
    for k, placement in enumerate(placements):
        passage, other = drawn[2 * k], drawn[2 * k + 1]
        probe[placement.first : placement.first + span] = passage
        probe[placement.second : placement.second + span] = passage
        control[placement.first : placement.first + span] = other
        control[placement.second : placement.second + span] = passage
    return probe, control


def across_documents(windows: np.ndarray, placements: list[Placement], span: int, distances: list[int],
                     separator: int) -> np.ndarray:
    """(windows, distances, passages), in per_passage_losses' order: whether a `separator` token (a document's end)
    lies between a passage's first copy and its second."""
    return np.stack([np.stack([(windows[:, p.first + span : p.second] == separator).any(axis=1)
                               for p in placements if p.distance == d], axis=1) for d in distances], axis=1)


def per_passage_losses(losses: np.ndarray, placements: list[Placement], span: int,
                       distances: list[int]) -> np.ndarray:
    """(windows, distances, passages): the mean loss over the scored tokens of each passage at each distance."""
    return np.stack([np.stack([losses[:, p.scored(span)].mean(axis=1) for p in placements if p.distance == d], axis=1)
                     for d in distances], axis=1)


def recurrence_distances(tokens: np.ndarray, n: int) -> np.ndarray:
    """For each target token t = 1..T of `tokens` (length T + 1; aligned with loss columns), how far back the n
    tokens before it last occurred as the same n-gram (0: never in this window, or fewer than n tokens before)."""
    last: dict[bytes, int] = {}
    out = np.zeros(len(tokens) - 1, dtype=np.int64)
    for t in range(n, len(tokens)):
        key = tokens[t - n : t].tobytes()
        if key in last:
            out[t - 1] = t - last[key]
        last[key] = t
    return out


def recurrence_view(windows: np.ndarray, losses: np.ndarray, n: int, edges: list[int]) -> list[dict[str, Any]]:
    """The mean loss of tokens whose preceding n-gram last occurred within each [edges[i], edges[i + 1]) tokens
    back, and of tokens whose n-gram never occurred before in the window (pooled over windows)."""
    distance = np.concatenate([recurrence_distances(row, n) for row in windows])
    flat = losses.reshape(-1)
    rows = [{"from": 0, "to": 0, "tokens": int((distance == 0).sum()),
             "nll": float(flat[distance == 0].mean()) if (distance == 0).any() else None}]
    for low, high in zip(edges[:-1], edges[1:]):
        chosen = (distance >= low) & (distance < high)
        rows.append({"from": int(low), "to": int(high), "tokens": int(chosen.sum()),
                     "nll": float(flat[chosen].mean()) if chosen.any() else None})
    return rows


def reach(model: Transformer, trained: int) -> int | None:
    """How far back in tokens the model's attention methods let a query see (a sliding window, sinks + window:
    their window; the first tokens a method keeps lie in the window's natural lead), or None: everything."""
    windows = [int(entry["window"]) for entry in normalize_methods(model.config.attention_methods, trained)
               if ATTENTION_METHODS[entry["method"]].sets_visibility and "window" in entry]
    return min(windows) if windows else None


MIN_WINDOWS = MIN_DRAWS  # fewer windows: no interval (the passages of one window are not independent draws)


@dataclass
class UseResult:
    """One model (under one method) at one window length: per-window and per-passage numbers at each distance."""

    method: str
    length: int
    distances: list[int]
    passages: np.ndarray  # (windows, distances, passages): use of each passage, nats
    probe: np.ndarray  # (windows, distances): NLL of the second copies in the probe
    control: np.ndarray  # (windows, distances): in the control
    reach: int | None
    recurrence: list[dict[str, Any]]
    seconds: float
    apart: np.ndarray | None = None  # (windows, distances, passages): copies in different documents; None: not known
    # (windows, distances, passages): NLL(control) - NLL(shuffled), the priming control's gain; None: not measured
    presence: np.ndarray | None = None
    layers: int = 1  # the model's layers: a window's reach relays through them (eval.verdicts.relay_reach)
    span: int = 0  # tokens per passage

    @property
    def use(self) -> np.ndarray:
        """(windows, distances): each window's use, the mean over its passages."""
        return self.passages.mean(axis=2)

    def values(self, index: int) -> tuple[np.ndarray, str]:
        """The windows' use at one distance, the values its interval is over (none below MIN_WINDOWS windows: the
        passages of one window share its text and its two forwards, so they are not independent draws)."""
        return self.use[:, index], "windows"

    def row(self, index: int, trained: int, margin: float) -> dict[str, Any]:
        values, unit = self.values(index)
        return {"method": self.method, "length": self.length, "distance": self.distances[index],
                "multiple": self.distances[index] / trained, "windows": int(self.passages.shape[0]),
                "unit": unit, "n": int(values.size), "use": draws_interval(values).__dict__,
                "use_values": self.use[:, index].tolist(),
                "probe_nll": float(self.probe[:, index].mean()), "control_nll": float(self.control[:, index].mean()),
                "se": float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else None,
                "verdict": verdict(spread(values[None, :]), margin) if values.size >= MIN_WINDOWS else "cannot tell",
                "past_reach": impossible_use(self.distances[index], self.reach, self.layers, self.span) is not None,
                **({} if self.presence is None else self.priming_row(index)),
                **({} if self.apart is None else {"across_documents": int(self.apart[:, index, :].sum()),
                                                  "passages_scored": int(self.apart[:, index, :].size)})}


    def priming_row(self, index: int) -> dict[str, Any]:
        """presence (the shuffled first copy's gain) and order (what reading it in order adds: use - presence) at one
        distance, each window's mean over its passages, with their intervals over windows."""
        presence = self.presence[:, index, :].mean(axis=1)
        order = self.use[:, index] - presence
        return {"presence": draws_interval(presence).__dict__, "presence_values": presence.tolist(),
                "order": draws_interval(order).__dict__}


@torch.inference_mode()
def measure_use(model: Transformer, ids: np.ndarray, trained: int, length: int, distances: list[int], span: int,
                per_distance: int, windows: int, seed: int = 0, methods: tuple[str, ...] = (NONE,),
                amp: torch.dtype | None = None, ngram: int = 4, separator: int | None = None,
                joiner: int | None = None, priming: bool = False) -> list[UseResult]:
    """use(d) for each method (model/methods/, set for `length`) on the same windows; see the module
    docstring. `separator`: the token that ends a document, to count the passages whose copies it parts; `joiner`:
    a token written in its place in every window (the same windows and passages with the documents joined);
    `priming`: also score the priming control (each first copy its passage's tokens shuffled), a third forward."""
    placements = place(length, span, distances, per_distance)
    probe, control = build_windows(ids, length, placements, span, windows, seed)
    apart = None if separator is None else across_documents(probe, placements, span, distances, separator)
    if joiner is not None and separator is not None:
        probe[probe == separator] = joiner
        control[control == separator] = joiner
    shuffled = shuffled_first_copies(control, probe, placements, span, np.random.default_rng([seed, length])) \
        if priming else None
    edges = sorted({1, *[e for e in (trained // 4, trained // 2, trained, 2 * trained, 4 * trained, 8 * trained,
                                     16 * trained) if 1 < e < length], length + 1})
    results = []
    for method in methods:
        started = time.perf_counter()
        spec = method_spec(method)
        view = model.under(spec, length, trained)
        prefill = min(p.second for p in placements)

        def score(windows_: np.ndarray) -> np.ndarray:
            if spec.incremental:  # dynamic NTK: each scored token under the base of its own prefix, as in decoding
                return score_incremental(view, windows_, prefill, amp)
            return score_windows(view, windows_, amp)

        probe_losses, control_losses = score(probe), score(control)
        on_probe = per_passage_losses(probe_losses, placements, span, distances)
        on_control = per_passage_losses(control_losses, placements, span, distances)
        presence = None if shuffled is None else \
            on_control - per_passage_losses(score(shuffled), placements, span, distances)
        results.append(UseResult(method, length, list(distances), on_control - on_probe, on_probe.mean(axis=2),
                                 on_control.mean(axis=2), reach(view, trained),
                                 recurrence_view(control, control_losses, ngram, edges), time.perf_counter() - started,
                                 apart, presence, view.config.n_layers, span))
        print(f"use @ {length:,} {method}: " + ", ".join(f"d={d:,} {u:+.3f}" for d, u in
                                                        zip(distances, results[-1].use.mean(axis=0)))
              + f" ({results[-1].seconds:.0f} s)", flush=True)
    return results


def row_spread(row: dict[str, Any]) -> Spread | None:
    """A row's use as the verdicts' rule reads it: mean, standard error over windows, df (None below MIN_WINDOWS)."""
    return Spread(row["use"]["mean"], row["se"], row["n"] - 1) \
        if row.get("se") is not None and row["n"] >= MIN_WINDOWS else None


def estimate_spread(entry: dict[str, Any]) -> Spread | None:
    """grid_estimate's dict as the verdicts' rule reads it (None without an interval)."""
    return Spread(entry["mean"], entry["se"], entry["n"] - 1) if "se" in entry else None


def calibrate(rows: list[dict[str, Any]], trained: int, floor: float = DEFAULT_MARGIN) -> float:
    """The verdicts of one checkpoint's rows as one family (eval.verdicts.use_verdicts): the margin a tenth of
    the positive control's use (rows as trained in windows of at most L, at distances within L; at least the floor),
    the rows past it Holm-corrected together; each row's "reach", the largest distance at which it and every nearer
    one of its (length, method) read "uses". The positive control keeps its own verdict (use shown at all). Returns
    the margin."""
    positive = [r for r in rows if r["method"] == NONE and r["length"] <= trained and r["distance"] < trained]
    margin = use_margin([row_spread(r) for r in positive], floor)
    family = [r for r in rows if r not in positive]
    for r, word in zip(family, use_verdicts([row_spread(r) for r in family], margin)):
        r["verdict"], r["margin"], r["margin_se"] = word, float(margin), margin.se
    for key in dict.fromkeys((r["length"], r["method"]) for r in family):
        chosen = [r for r in family if (r["length"], r["method"]) == key]
        counted = [r for r in chosen if not r.get("pinned")]  # a "max" column's first copies sit at the window start
        farthest = reach_of([r["distance"] for r in counted], [r["verdict"] for r in counted])
        for r in chosen:
            r["reach"] = farthest
    return margin


def self_checks(rows: list[dict[str, Any]], trained: int) -> list[str]:
    """The positive and the negative control, in words, from the rows of one model. The positive control reads the
    model as trained in a window of at most L tokens (every position one it trained at), at distances within L."""
    lines = []
    within = [r for r in rows if r["method"] == NONE and r["length"] <= trained and r["distance"] < trained]
    if within and all(r["use"].get("low") is None for r in within):
        lines.append(f"positive control (as trained, windows of {within[0]['length']:,} <= L tokens): not decided: "
                     f"{within[0]['n']} window(s), no interval (use "
                     + ", ".join(f"{r['use']['mean']:+.3f} at d = {r['distance']:,}" for r in within) + ")")
    elif within:
        shown_at = ", ".join(f"{r['distance']:,}" for r in within if r["verdict"] == "uses")
        lines.append(f"positive control (as trained, windows of {within[0]['length']:,} <= L tokens): "
                     + (f"passes: use shown at d = {shown_at}" if shown_at else
                        "FAILS: no use shown within L; this model does not copy a repeated passage even within its "
                        "context, so nothing it shows past L is use (it needs more training: docs/evaluation.md)"))
    else:
        lines.append("positive control: not measured (give a length of at most L with a distance within it)")
    for r in rows:
        if r["past_reach"]:
            word = {"none": "passes", "negligible": "passes", "uses": "FAILS"}.get(r["verdict"],
                                                                                "not confirmed (too noisy)")
            lines.append(f"negative control ({r['method']}, d = {r['distance']:,} beyond its reach): "
                         f"{word}: {r['verdict']} ({Estimate(**r['use']).format(3, signed=True)})")
    apart = {(r["length"], r["distance"]): r for r in rows if r.get("across_documents")}  # the same at every method
    if apart:
        lines.append("copies in two documents (a document's end between them): " + "; ".join(
            f"window {length:,}, d = {d:,}: {r['across_documents']} of {r['passages_scored']}"
            for (length, d), r in sorted(apart.items()))
                     + ": use there includes reading across a document boundary")
    return lines


def rows_table(rows: list[dict[str, Any]], trained: int) -> list[str]:
    """The markdown table of use rows (where every row records them, the passages whose copies lie in different
    documents and the seconds, in last columns)."""
    timed = all("seconds" in r for r in rows)
    apart = any(r.get("across_documents") for r in rows) and all("across_documents" in r for r in rows)
    primed = all("presence" in r for r in rows)
    lines = ["| window | method | distance (tokens) | distance / L | use, nats [95% t] | over | verdict | "
             "NLL probe | NLL control |" + (" presence | order |" if primed else "")
             + (" copies in two documents |" if apart else "")
             + ((" seconds (three forwards) |" if primed else " seconds (probe + control) |") if timed else ""),
             "|---:|---|---:|---:|---:|---|---|---:|---:|" + ("---:|---:|" if primed else "") + ("---:|" if apart else "")
             + ("---:|" if timed else "")]
    for r in rows:
        flag = (" (past reach)" if r["past_reach"] else "") + (" (window start: not a reach)" if r.get("pinned") else "")
        lines.append(f"| {r['length']:,} ({r['length'] / trained:g}L) | {r['method']} | {r['distance']:,} | "
                     f"{r['multiple']:.2f} | {Estimate(**r['use']).format(3, signed=True)} | "
                     + (f"{r['n']} {r['unit']}" if r["use"].get("low") is not None else
                        f"{r['n']} window{'s' * (r['n'] > 1)}: no interval") + " | "
                     f"{r['verdict']}{flag} | {r['probe_nll']:.3f} | {r['control_nll']:.3f} |"
                     + (f" {Estimate(**r['presence']).format(3, signed=True)} | "
                        f"{Estimate(**r['order']).format(3, signed=True)} |" if primed else "")
                     + (f" {r['across_documents']} of {r['passages_scored']} |" if apart else "")
                     + (f" {r['seconds']:.0f} |" if timed else ""))
    return lines


def text_section(title: str, rows: list[dict[str, Any]], trained: int) -> list[str]:
    """One checkpoint's use rows on one text as a report section: their verdicts calibrated as one family
    (calibrate), the table, the self-checks, and where rows ran in other precisions ("dtype"), which in which."""
    calibrate(rows, trained)
    lines = [f"## {title}", "", "Repeated passages of S tokens, each second copy d tokens after its first, against the "
             "same window with other text in place of the first copies; use = NLL(control) - NLL(probe) on the second "
             "copies' tokens 2..S, nats, mean [95% t over windows; none below 3 windows]; verdicts calibrated "
             "(eval.use.calibrate), the text's rows past the positive control one family against the margin (a tenth "
             f"of the positive control's use, at least {DEFAULT_MARGIN:g} nats): {USE_RULE}. A window of L tokens "
             "holds the model as "
             "trained (the positive control); a method whose attention cannot reach d is marked 'past reach' (the "
             "negative control).", "", *rows_table(rows, trained), "",
             *[f"- {check}" for check in self_checks(rows, trained)], ""]
    precisions: dict[str, dict[str, None]] = {}
    for r in rows:
        precisions.setdefault(r.get("dtype", "bfloat16"), {}).setdefault(f"{r['method']} at {r['length']:,}", None)
    if len(precisions) > 1:
        lines += ["Precision: " + "; ".join(f"{dtype} for {', '.join(cells)}" for dtype, cells in
                                            sorted(precisions.items())) + ".", ""]
    return lines


def markdown(name: str, rows: list[dict[str, Any]], recurrence: dict[str, list[dict]], meta: dict[str, Any]) -> str:
    trained = meta["trained"]
    lines = [f"## {name}", "", meta["setup"], "", *rows_table(rows, trained)]
    lines += ["", "Self-checks:", ""] + [f"- {line}" for line in self_checks(rows, trained)] + [""]
    first = next(iter(recurrence.values()))
    lines += [f"Second view (the control's natural tokens by how far back their preceding {meta['ngram']}-gram last "
              "occurred; mean NLL (tokens), pooled over windows; the longest window):", "",
              "| method | " + " | ".join(recurrence_label(b, trained) for b in first) + " |",
              "|---|" + "---:|" * len(first)]
    for method, bins in recurrence.items():
        lines.append(f"| {method} | " + " | ".join("" if b["nll"] is None else f"{b['nll']:.3f} ({b['tokens']:,})"
                                                  for b in bins) + " |")
    return "\n".join(lines + [""])


def seed_group(checkpoint: str) -> str | None:
    """The variant a checkpoint is a seed of: VARIANT for OUT/VARIANT/seedS, and "VARIANT @ step-N" for a model kept
    during training, OUT/VARIANT/seedS/snapshots/step-N (None: neither)."""
    path = Path(checkpoint)
    if path.name.startswith("seed"):
        return path.parent.name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("seed"):
        return f"{path.parent.parent.parent.name} @ {path.name}"
    return None


def across_seeds(results: dict[str, dict[str, Any]]) -> list[str]:
    """Checkpoints OUT/VARIANT/seedS of one variant (and its kept models, OUT/VARIANT/seedS/snapshots/step-N),
    measured on the same windows: each cell's use over seeds and windows (eval.stats.spread: the between-seed and the
    between-window variance, t with seeds - 1 degrees of freedom) and its verdict, with presence and order where
    --priming measured them, as a markdown table; [] when no variant has two seeds."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, entry in results.items():
        group = seed_group(entry["checkpoint"])
        if group is not None:
            groups.setdefault(group, []).append(entry)
    found = []  # (variant, seeds, method, length, distance, trained, spread, margin)
    primed: dict[tuple, tuple] = {}  # (variant, method, length, distance) -> (presence, order) spreads
    for variant, entries in groups.items():
        if len(entries) < 2:
            continue
        cells: dict[tuple, list] = {}
        for entry in entries:
            for r in entry["rows"]:
                cells.setdefault((r["method"], r["length"], r["distance"]), []).append(r)
        trained, floor = entries[0]["trained"], entries[0]["margin"]
        estimates = {}
        for key, rows in cells.items():
            values = [r.get("use_values") for r in rows]
            if len(values) != len(entries) or any(v is None or len(v) != len(values[0]) for v in values):
                continue  # not the same windows in every seed
            estimates[key] = spread(np.asarray(values, dtype=np.float64))
            if all("presence_values" in r for r in rows):  # order = use - presence, window by window
                presence = np.asarray([r["presence_values"] for r in rows], dtype=np.float64)
                primed[(variant, *key)] = (spread(presence), spread(np.asarray(values, dtype=np.float64) - presence))
        positive = [e for (method, length, distance), e in estimates.items()
                    if e is not None and method == NONE and length <= trained and distance < trained]
        margin = use_margin(positive, floor)
        found += [(variant, len(entries), *key, trained, e, margin) for key, e in estimates.items() if e is not None]
    if not found:
        return []
    family = [i for i, f in enumerate(found) if f[3] > f[5]]  # past the positive control: one family
    words = dict(zip(family, use_verdicts([found[i][6] for i in family], [found[i][7] for i in family])))
    def shown(estimate) -> str:
        low, high = estimate.bounds()
        return f"{estimate.mean:+.3f} [{low:+.3f}, {high:+.3f}]"

    with_priming = bool(primed) and all((f[0], *f[2:5]) in primed for f in found)
    lines = []
    for i, (variant, seeds, method, length, distance, trained, estimate, margin) in enumerate(found):
        lines.append(f"| {variant} | {seeds} | {length:,} ({length / trained:g}L) | {method} | "
                     f"{distance:,} ({distance / trained:g}L) | {shown(estimate)} | "
                     f"{words.get(i, verdict(estimate, margin))} |"
                     + ("".join(f" {shown(e)} |" for e in primed[(variant, method, length, distance)])
                        if with_priming else ""))
    return ["## Across seeds", "", "Each variant's seeds on the same windows: use, mean [95% t over seeds and windows], "
            "and its verdict (eval/verdicts.py: the cells past the positive control one family, each against its "
            f"variant's margin, a tenth of its use within L, at least the floor: {USE_RULE})"
            + ("; presence and order (the priming control), the same way" if with_priming else "") + ".", "",
            "| variant | seeds | window | method | distance | use (nats) | verdict |"
            + (" presence | order |" if with_priming else ""),
            "|---|---:|---|---|---|---:|---|" + ("---:|---:|" if with_priming else ""), *lines, ""]


def recurrence_label(bin_: dict, trained: int) -> str:
    if bin_["to"] == 0:
        return "never"
    return f"{bin_['from']:,}-{bin_['to']:,} back"


def plot(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """use(d) against d / L, one line per checkpoint, method and window length, with its interval."""
    figure, axis = figures.new(width=6.5, height=4.2)
    for name, entry in results.items():
        for method, length in dict.fromkeys((r["method"], r["length"]) for r in entry["rows"]):
            rows = [r for r in entry["rows"] if (r["method"], r["length"]) == (method, length)]
            x = [r["multiple"] for r in rows]
            line, = axis.plot(x, [r["use"]["mean"] for r in rows], marker="o", label=(
                name if method == NONE else f"{name} + {method}") + f" @ {length / entry['trained']:g}L")
            if all(r["use"]["low"] is not None for r in rows):
                axis.fill_between(x, [r["use"]["low"] for r in rows], [r["use"]["high"] for r in rows],
                                  color=line.get_color(), alpha=0.15)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.axvline(1, color="grey", linestyle="--", linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("distance between the copies / trained length L (dashed: L)")
    axis.set_ylabel("use: NLL(control) - NLL(probe), nats")
    axis.set_title("Use on the same weights: repeated passages against their control")
    axis.legend(fontsize=7)
    return figures.save(figure, path, axis)


def default_span(trained: int) -> int:
    """S = L / 4 within 8..64 tokens: longer passages give a model more of a copy to lock onto (at L = 64, 16 tokens
    nearly doubled a quick-preset model's use within L over 8)."""
    return int(min(64, max(8, trained // 4)))


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.use", __doc__)
    add_checkpoint(parser, "one or more checkpoint folders (required)", nargs="+")
    parser.add_argument("--lengths", default="1x,16x",
                        help="window lengths T: multiples of L (16x) or token counts; a length of at most L is "
                             "measured as trained only (the positive control), with the distances that fit in it")
    parser.add_argument("--distances", default="0.5x,2x,4x,8x,max",
                        help="comma-separated distances between the copies: multiples of L, token counts, or max "
                             "(the longest the longest window holds)")
    parser.add_argument("--span", type=int, default=0, help="tokens S per passage (0: L / 4, within 8..64)")
    parser.add_argument("--per-distance", type=int, default=4, help="passages K per distance in each window")
    parser.add_argument("--windows", type=int, default=64,
                        help=f"windows of held-out text (intervals over windows; none below {MIN_WINDOWS})")
    parser.add_argument("--methods", default=NONE, help="inference-time methods, each where it applies (none: as "
                                                        "trained), e.g. none,yarn,sinks")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="nats: the floor of the verdicts' margin (a tenth of the positive control's use, at "
                             "least this)")
    parser.add_argument("--ngram", type=int, default=4, help="n of the second view's recurring n-grams")
    parser.add_argument("--data", help="prepared folder, source or path (default: each checkpoint's held-out text)")
    parser.add_argument("--all-documents", action="store_true",
                        help="--data that may be the checkpoint's training source: score every document")
    parser.add_argument("--seed", type=int, default=0, help="seed of the passages drawn")
    parser.add_argument("--priming", action="store_true",
                        help="also score the priming control (each first copy holds its passage's tokens shuffled): "
                             "presence and order beside use, a third forward per window")
    add_device(parser)
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | auto")
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: write report.md and use.png again from OUT/results.json under the "
                             "current verdict rules")
    add_out(parser, "output folder: results.json, report.md, use.png (required)", type=Path)
    return parser


def distances_at(items: list[str], trained: int, length: int, longest: int, span: int, per_distance: int) -> list[int]:
    """The distances measured in windows of `length`: those that fit in it (within L only, for a length of at most
    L), and "max" resolved at the longest length."""
    fixed = sorted({resolve_length(item, trained) for item in items if item != "max"})
    fixed = [d for d in fixed if span + GAP <= d and d + span + GAP + lead_tokens(length) <= length
             and (length > trained or d < trained)]
    if "max" in items and length == longest:
        try:
            fixed.append(longest_distance(length, span, fixed, 1))
        except ConfigError:  # the window holds no further distance
            pass
    return sorted(set(fixed))


def measure_checkpoint(model: Transformer, ids: np.ndarray, trained: int, lengths: list[int], items: list[str],
                       span: int, per_distance: int, windows: int | dict[int, int], seed: int, methods: list[str],
                       amp: torch.dtype | None, ngram: int, separator: int | None = None,
                       priming: bool = False) -> tuple[list[UseResult], list[str]]:
    """measure_use at every length (`windows` of it, or windows[length]): at a length of at most L the model as
    trained, past L every method. Returns the results and, for a (method, length) the model cannot run (a learned
    table's end), why (not raised)."""
    found, errors = [], []
    for length in lengths:
        distances = distances_at(items, trained, length, max(lengths), span, per_distance)
        count = fitting_count(length, span, distances, per_distance)  # a short window holds fewer: as many as fit
        if not distances or not count:
            continue
        for method in ([NONE] if length <= trained else list(dict.fromkeys([NONE, *methods]))):
            try:
                found += measure_use(model, ids, trained, length, distances, span, count,
                                     windows if isinstance(windows, int) else windows[length], seed, (method,),
                                     amp, ngram, separator, priming=priming)
            except PositionRangeError as error:
                errors.append(f"{method} @ {length}: {error}")
    return found, errors


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    parser = build_parser()
    args = parse(parser, argv, "out")
    if args.report_only:
        return rewrite_report(args.out)
    require(parser, args, "checkpoint")
    if args.windows < 1 or args.per_distance < 1 or args.margin <= 0 or args.ngram < 1:
        raise ConfigError("--windows, --per-distance and --ngram must be at least 1 and --margin positive")
    methods = check_methods(comma_list(args.methods))
    device = resolve_device(args.device)
    amp = autocast_dtype(device, args.dtype)
    results: dict[str, dict[str, Any]] = {}
    sections = []
    for checkpoint in args.checkpoint:
        model = load_model(checkpoint, device).eval()
        trained = trained_length(checkpoint)
        tokenizer = load_tokenizer(checkpoint)
        ids, scored = checkpoint_eval_tokens(args.data or training_data_dir(checkpoint), checkpoint, tokenizer,
                                             all_documents=args.all_documents)
        lengths = sorted({resolve_length(item, trained) for item in parse_lengths(args.lengths)})
        span = args.span or default_span(trained)
        chosen = [m for m in methods if applies(m, model.config.position, model.config.layer_encodings)]
        found, errors = measure_checkpoint(model, ids, trained, lengths, comma_list(args.distances), span,
                                           args.per_distance, args.windows, args.seed, chosen, amp, args.ngram,
                                           tokenizer.convert_tokens_to_ids(ENDOFTEXT), priming=args.priming)
        for error in errors:
            print(f"not measured: {error}")
        rows = [result.row(i, trained, args.margin) for result in found for i in range(len(result.distances))]
        if not rows:
            raise ConfigError(f"{checkpoint}: no distance of --distances {args.distances} fits with passages of "
                              f"{span} tokens in a window of {', '.join(map(str, lengths))} tokens (L = {trained}): "
                              "use longer --lengths, shorter --distances or a smaller --span")
        if "max" in comma_list(args.distances):  # its first copies lie at the window's start in every window
            farthest = max(r["distance"] for r in rows if r["length"] == lengths[-1])
            for r in rows:
                r["pinned"] = r["length"] == lengths[-1] and r["distance"] == farthest
        margin = calibrate(rows, trained, args.margin)
        longest = [r for r in found if r.length == lengths[-1]]
        name = str(checkpoint)  # the whole path: a comparison names its runs seed1, seed2, ... in each folder
        meta = {"trained": trained, "ngram": args.ngram, "setup": portable_command(
            f"Checkpoint `{checkpoint}` (L = {trained:,}); {scored}. Windows: {args.windows} per length of "
            f"T = {', '.join(f'{n:,}' for n in lengths)} tokens, each with {args.per_distance} passages of "
            f"S = {span} tokens per distance (in a window of at most L, as many as fit), second copies at the window's end; use on tokens 2..S of each second "
            f"copy; intervals over windows (none below {MIN_WINDOWS} windows); verdicts (eval/verdicts.py), the rows "
            f"past the positive control one family against the margin, {margin:.3f} nats (a tenth of the positive "
            f"control's use, at least {args.margin:g}): {USE_RULE}; "
            f"{args.dtype}. Seconds per (length, method), probe + control"
            + (" + the priming control" if args.priming else "") + ": "
            + ", ".join(f"{r.length:,} {r.method} {r.seconds:.0f}" for r in found) + ".")}
        results[name] = {"checkpoint": str(checkpoint), "trained": trained, "lengths": lengths, "span": span,
                         "per_distance": args.per_distance, "windows": args.windows, "margin": args.margin,
                         "rows": rows, "recurrence": {r.method: r.recurrence for r in longest}, "meta": meta}
        sections.append(markdown(name, rows, results[name]["recurrence"], meta))
        print(sections[-1])
    write_outputs(args.out, results, sections)
    return 0


def write_outputs(out: Path, results: dict[str, dict[str, Any]], sections: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(results_json(results))
    (out / "report.md").write_text("# Use on the same weights (eval.use)\n\n![use against the distance between "
                                   "the copies, one line per checkpoint, method and window](use.png)\n\n"
                                   + "\n".join([*sections, *across_seeds(results)]))
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and {plot(results, out / 'use.png')}")


# A setup's statement of its verdict rule (two earlier rules' words, then today's), which rewrite_report replaces.
STATED_RULE = re.compile(r"; (verdicts calibrated: 'uses' needs .*?at least [\d.]+\)|verdict margin [\d.]+ nats|verdicts "
                         r"\(eval/verdicts\.py\), the rows past .*?" + re.escape(USE_RULE) + ")")


def rewrite_report(out: Path) -> int:
    """--report-only: OUT/results.json's rows under the rules of now (an interval over windows from MIN_WINDOWS of
    them, verdicts calibrated over each checkpoint's rows), written again with the report and the figure."""
    path = out / "results.json"
    if not path.exists():
        raise ConfigError(f"--report-only: {path} does not exist; run eval.use into {out} first")
    results = json.loads(path.read_text())
    sections = []
    for name, entry in results.items():
        for row in entry["rows"]:
            values = np.asarray(row["use_values"], dtype=np.float64)
            row.update(unit="windows", n=int(values.size), use=draws_interval(values).__dict__,
                       se=float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else None)
        margin = calibrate(entry["rows"], entry["trained"], entry["margin"])
        setup = STATED_RULE.sub("", entry["meta"]["setup"].split(" Verdicts re-derived")[0])
        entry["meta"]["setup"] = portable_command(
            f"{setup} Verdicts re-derived by `python -m eval.use --report-only` (eval/verdicts.py), this checkpoint's "
            f"rows past the positive control one family against the margin, {margin:.3f} nats (a tenth of the "
            f"positive control's use, at least {entry['margin']:g}): {USE_RULE}.")
        sections.append(markdown(name, entry["rows"], entry["recurrence"], entry["meta"]))
    write_outputs(out, results, sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------ over the seeds of a fleet of models

PER_DISTANCE = 4  # a fleet's probe: passages per distance in each window
FLEET_NGRAM = 4  # its second view's n-grams
WINDOW_CONTROL = "window"  # attention limited to the last L keys: the negative control, probed beside every model


def fleet_windows(use_windows: int, trained: int, longest: int, tokens: int) -> dict[int, int]:
    """Windows per length of a fleet's probe: `use_windows` at the longest length; in windows of L (the positive
    control, one passage per distance where a long window holds many) the tokens of those windows, as many as the
    `tokens` of held-out text hold."""
    many = use_windows * (longest + 1) // (trained + 1)
    return {trained: max(use_windows, min(many, tokens // (trained + 1))), longest: use_windows}


def check_fleet_windows(use_windows: int, trained: int, longest: int, tokens: int) -> None:
    """Before any training: the probe's longest windows must fit `use_windows` times in the held-out `tokens`."""
    fits = max(0, (tokens - 1) // (longest + 1))
    if fits < use_windows:
        raise ConfigError(
            f"the use probe needs use_windows = {use_windows} windows of {longest + 1:,} tokens (the longest length, "
            f"{longest // trained}x of L = {trained}), and the held-out text ({tokens:,} tokens) holds {fits}: lower "
            f"use_windows to {fits} or less, shorten the lengths, or hold out more text (val_fraction)")


def fleet_probe(model: Transformer, ids: np.ndarray, trained: int, longest: int, items: list[str],
                windows: dict[int, int], methods: list[str], priming: bool,
                separator: int | None = None) -> dict[str, Any]:
    """The use probe of one model of a fleet: in windows of L as trained (the positive control, distances within
    L) and at the longest length as trained, under each of `methods` that applies and under the window control.
    Kept per window (the mean over its passages: the passages of one window are not independent draws), with the
    passages whose copies lie in different documents counted per distance (`separator`: the end of a document)."""
    methods = [m for m in dict.fromkeys([*methods, WINDOW_CONTROL])
               if applies(m, model.config.position, model.config.layer_encodings)]
    span = default_span(trained)
    found, errors = measure_checkpoint(model, ids, trained, sorted(windows), items, span, PER_DISTANCE, windows, 0,
                                       methods, None, FLEET_NGRAM, separator, priming=priming)
    return {"span": span, "per_distance": PER_DISTANCE, "errors": errors,
            "results": [{"method": r.method, "length": r.length, "distances": r.distances, "reach": r.reach,
                         "use": significant(np.asarray(r.passages, dtype=np.float64).mean(axis=2)),
                         **({} if r.apart is None else {"across_documents": r.apart.sum(axis=(0, 2)).tolist(),
                                                        "passages": int(r.apart[:, 0, :].size)}),
                         **({} if r.presence is None else
                            {"presence": significant(np.asarray(r.presence, dtype=np.float64).mean(axis=2))})}
                        for r in found]}


def significant(values: np.ndarray) -> list:
    """Each window's value to 9 significant digits, as a record keeps it (the tests read intervals over windows)."""
    return np.vectorize(lambda x: float(f"{x:.9g}"))(values).tolist()


@dataclass
class UseSummary:
    """One variant's use over seeds and windows at each (window length, distance) it was probed at."""

    label: str
    distances: list[int]
    estimates: list[Estimate | None]
    verdicts: list[str]
    reach: int | None  # how far its attention sees (a window control), None: everything
    lengths: list[int] = field(default_factory=list)  # the window length of each column
    across: list[tuple[int, int] | None] = field(default_factory=list)  # per column: (copies apart, passages)
    spreads: list = field(default_factory=list)  # per column: eval.stats.Spread, what the tests read
    pinned: int | None = None  # the longest length's "max" distance: shown, not counted in how far back
    presence: list = field(default_factory=list)  # per column, with the priming control
    order: list = field(default_factory=list)

    def longest_columns(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n == max(self.lengths)]

    def reads_back(self) -> int | None:
        """The largest distance at the longest length at which it and every nearer one read 'uses'."""
        columns = [i for i in self.longest_columns() if self.distances[i] != self.pinned]
        return reach_of([self.distances[i] for i in columns], [self.verdicts[i] for i in columns])

    def at(self, distance: int) -> tuple[Estimate | None, str] | None:
        """(estimate, verdict) at `distance` at the longest length."""
        for i in self.longest_columns():
            if self.distances[i] == distance:
                return self.estimates[i], self.verdicts[i]
        return None

    def reads_back_words(self, trained: int) -> str:
        farthest = self.reads_back()
        if farthest is None:
            nearest = min(self.distances[i] for i in self.longest_columns())
            return f"no reach: use not shown at the nearest distance ({nearest:,} tokens)"
        estimate = self.at(farthest)[0]
        size = f"; use there {estimate.mean:+.3f} nats" if estimate is not None else ""
        return f"reads back to about {farthest:,} tokens ({farthest / trained:.3g}L{size})"

    def positive(self, trained: int) -> bool | None:
        return positive_control(self.distances, self.lengths, self.verdicts, trained)


def summarise_fleet(probes: dict[str, list[dict]], margin: float, pinned: bool = False) -> dict[str, UseSummary]:
    """encoding -> its seeds' fleet_probe records  =>  variant label -> its summary over seeds and windows (a
    method's variant takes its encoding's windows of at most L, measured as trained, as its positive control), the
    verdicts of every variant's columns past the positive control calibrated as one family."""
    summaries: dict[str, UseSummary] = {}
    for encoding, per_seed_records in probes.items():
        entries: dict[tuple[str, int], list[dict]] = {}
        for record in per_seed_records:
            for entry in record.get("results", []):
                entries.setdefault((entry["method"], entry["length"]), []).append(entry)
        if not entries:
            continue
        longest = max(length for _, length in entries)
        short = [key for key in entries if key[1] < longest and key[0] == NONE]
        for method in dict.fromkeys(m for m, length in entries if length == longest):
            columns, across, primed = [], [], []
            for key in [*short, (method, longest)]:
                per_seed = entries[key]
                if any(entry["distances"] != per_seed[0]["distances"] for entry in per_seed):
                    continue  # probed with other settings: not comparable
                use = np.stack([np.asarray(entry["use"], dtype=np.float64) for entry in per_seed])  # (seeds, w, d)
                counts = per_seed[0].get("across_documents")  # the same windows in every seed and method
                presence = np.stack([np.asarray(entry["presence"], dtype=np.float64) for entry in per_seed]) \
                    if all("presence" in entry for entry in per_seed) else None
                for i, distance in enumerate(per_seed[0]["distances"]):
                    columns.append((key[1], distance, use[:, :, i]))
                    across.append(None if counts is None else (counts[i], per_seed[0]["passages"]))
                    primed.append(None if presence is None else (spread_interval(presence[:, :, i]),
                                                                 spread_interval(use[:, :, i] - presence[:, :, i])))
            summaries[label(encoding, method)] = UseSummary(
                label(encoding, method), [d for _, d, _ in columns], [spread_interval(m) for _, _, m in columns],
                [verdict(spread(m), margin) for _, _, m in columns], entries[(method, longest)][0]["reach"],
                [n for n, _, _ in columns], across, [spread(m) for _, _, m in columns],
                presence=[None if p is None else p[0] for p in primed],
                order=[None if p is None else p[1] for p in primed])
    if pinned:
        for summary in summaries.values():
            summary.pinned = max(summary.distances[i] for i in summary.longest_columns())
    calibrate_fleet(summaries, margin)
    return summaries


def calibrate_fleet(summaries: dict[str, UseSummary], floor: float) -> None:
    """The verdicts of a fleet's use cells as one family (eval.verdicts.use_verdicts): every variant's columns
    past its positive control (windows longer than the shortest), each against its variant's margin, a tenth of its
    positive control's use (at least `floor`); the positive control keeps its own test."""
    family, margins = [], []
    for summary in summaries.values():
        shortest, longest = min(summary.lengths), max(summary.lengths)
        positive = [e for e, n in zip(summary.spreads, summary.lengths) if e is not None and n == shortest < longest]
        own = use_margin(positive, floor)
        for index, length in enumerate(summary.lengths):
            if length > shortest or shortest == longest:
                family.append((summary, index))
                margins.append(own)
    words = use_verdicts([summary.spreads[index] for summary, index in family], margins)
    for (summary, index), word in zip(family, words):
        summary.verdicts[index] = word


# --------------------------------------------------- one window of the use grid (experiments/use_grid.py), four forwards

GRID_FORWARDS = ("natural", "probe", "control", "shuffled")


def window_starts(tokens: int, length: int, windows: int) -> list[int]:
    """`windows` starts of windows of length + 1 tokens with equal gaps before, between and after them (none at the
    text's first token: a book's title and contents)."""
    free = tokens - windows * (length + 1)
    if free < windows + 1:
        raise DataError(f"the text holds {tokens:,} tokens, too few for {windows} windows of {length + 1:,} tokens with "
                        "text around them; use a longer text, fewer windows or a shorter length")
    gap = free / (windows + 1)
    return [int(round(gap * (i + 1))) + i * (length + 1) for i in range(windows)]


def grid_layout(length: int, trained: int, windows: int, distances: list[int], within: list[int], passages: int,
                span: int, seed: int) -> list[tuple[list[Placement], list[Placement]]]:
    """Per window, its own draw (seeded [seed, window]): `passages` placements per distance in a window of `length`
    with every second copy past L, then the positive control's at the distances `within` L in a window of L."""
    if length <= trained or max(distances) + span + GAP + lead_tokens(length) > length or max(within) >= trained:
        raise ConfigError(f"the window length must exceed L = {trained:,}, every distance fit in it and every "
                          "distance of the positive control lie within L")
    found = []
    for window in range(windows):
        rng = np.random.default_rng([seed, window])
        found.append((jittered(length, span, distances, passages, rng, second_from=trained),
                      jittered(trained, span, within, passages, rng)))
    return found


def grid_forwards(ids: np.ndarray, start: int, length: int, placements: list[Placement], span: int,
                  seed: list[int]) -> dict[str, np.ndarray]:
    """The four windows (GRID_FORWARDS) at ids[start : start + length + 1], each (1, length + 1): the control's other
    passages and the shuffles drawn from `seed` (the same under every method)."""
    rng = np.random.default_rng(seed)
    probe, control = write_copies(ids, start, length, placements, span, rng)
    shuffled = shuffled_first_copies(control[None], probe[None], placements, span, rng)[0]
    natural = np.asarray(ids[start : start + length + 1], dtype=np.int64)
    return {"natural": natural[None], "probe": probe[None], "control": control[None], "shuffled": shuffled[None]}


def measure_window(model: Transformer, ids: np.ndarray, start: int, length: int, trained: int,
                   placements: list[Placement], span: int, seed: list[int], method: str, amp: torch.dtype | None,
                   step: int = 1, natural: bool = True, lead: list[int] = ()) -> dict[str, Any]:
    """One window under `method` set for `length` (natural=False: the probe, control and shuffled forwards only, as
    the positive control runs). Kept: per passage, in `placements`' order, the mean loss on tokens 2..S of its second
    copy in the probe, the control and the shuffled control; of the natural window, the mean loss on [0, L) and
    [L, T); seconds per forward, the attention's reach and paths, the dtype. Dynamic NTK (an incremental method) runs
    through the KV cache `step` tokens at a time after a prefill to the first scored token (L for the natural one)."""
    forwards = grid_forwards(ids, start, length, placements, span, seed)
    kinds = GRID_FORWARDS[0 if natural else 1:]
    record, losses = score_forwards(model, {kind: forwards[kind] for kind in kinds}, length, trained, placements,
                                    span, method, amp, step, f"{method} at {start:,}", lead)
    if natural:
        record["natural"] = {"within": float(losses["natural"][:trained].mean()),
                             "past": float(losses["natural"][trained:].mean())}
    return record


def score_forwards(model: Transformer, forwards: dict[str, np.ndarray], length: int, trained: int,
                   placements: list[Placement], span: int, method: str, amp: torch.dtype | None, step: int,
                   name: str, lead: list[int] = ()) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Each of `forwards` (kind -> (1, length + 1) window) under `method` set for `length`: (the record: per passage
    of every kind but "natural" the mean loss on tokens 2..S of its second copy, seconds per forward, the attention's
    reach and paths, the dtype; the losses per kind). An incremental method runs through the KV cache `step` tokens
    at a time after a prefill to the first scored token (L for the natural window). `lead`: the ids the tokenizer
    starts a text with (data.tokenizer.leading_ids: Gemma's <bos>), written over each window's first tokens, which
    hold no passage (lead_tokens)."""
    if lead:
        forwards = {kind: np.concatenate((np.broadcast_to(np.asarray(lead, dtype=window.dtype),
                                                          (window.shape[0], len(lead))), window[:, len(lead):]), axis=1)
                    for kind, window in forwards.items()}
    spec = method_spec(method)
    view = model.under(spec, length, trained)
    losses, seconds = {}, {}
    copies = np.concatenate([p.scored(span) for p in placements]) if placements else None  # what a probe scores
    for kind, window in forwards.items():
        started = time.perf_counter()
        if spec.incremental:
            prefill = trained if kind == "natural" else min(p.second for p in placements)
            losses[kind] = score_incremental(view, window, prefill, amp, step=step)[0]
        else:  # the head at the second copies alone, but in the natural window (harm: every position)
            losses[kind] = score_windows(view, window, amp, only=None if kind == "natural" else copies)[0]
        seconds[kind] = time.perf_counter() - started
    print(f"{name}: " + ", ".join(f"{kind} {s:.0f} s" for kind, s in seconds.items()), flush=True)
    passages = {kind: [float(losses[kind][p.scored(span)].mean()) for p in placements]
                for kind in forwards if kind != "natural"}
    return ({"passages": passages, "seconds": seconds, "reach": reach(view, trained), "paths": view.attention_paths(),
             "dtype": "float32" if amp is None else str(amp).removeprefix("torch.")}, losses)


def null_forwards(ids: np.ndarray, start: int, length: int, placements: list[Placement], span: int,
                  seed: list[int]) -> dict[str, np.ndarray]:
    """A true null by construction: the control twice, (1, length + 1) each. Both hold the same second copies; at
    each first copy the control holds one other passage of the text and the second control another, drawn
    independently, so neither first copy is the passage its second copy repeats and the difference
    NLL(second control) - NLL(control) on the second copies is 0 in expectation, whatever the model reads."""
    rng = np.random.default_rng(seed)
    _, control = write_copies(ids, start, length, placements, span, rng)
    second = control.copy()
    for placement, other in zip(placements, draw_passages(ids, (start, start + length + 1), len(placements), span, rng)):
        second[placement.first : placement.first + span] = other
    return {"control": control[None], "second_control": second[None]}


# ------------------------------------------ the use grid's windows summarised: intervals over windows and verdicts

GRID_POSITIVE = "positive"  # the grid's positive control: the checkpoint as trained in windows of L
GRID_KINDS = ("use", "presence", "order")
# compared paired by window past L: the four said to read the whole window, YaRN, and the window baseline
GRID_PAIRED = ("rerope", "selfextend", "string", "dca", "yarn", "sinks")


def grid_entry(record: dict[str, Any], placements: list[list[int]], distances: list[int]) -> dict[str, Any]:
    """One window's numbers from measure_window's record: harm on the natural window and per distance use, presence
    and order (the mean over the window's passages), the control's NLL on the second copies, each passage's use and
    where its second copy lies (`placements`: [distance, first, second] in the record's order)."""
    probe, control, shuffled = (np.asarray(record["passages"][k]) for k in GRID_FORWARDS[1:])
    entry: dict[str, Any] = {"seconds": record["seconds"], "reach": record["reach"], "paths": record.get("paths"),
                             **record.get("natural", {})}
    for d in distances:
        at = [i for i, p in enumerate(placements) if p[0] == d]
        entry[d] = {"use": float((control[at] - probe[at]).mean()), "presence": float((control[at] - shuffled[at]).mean()),
                    "order": float((shuffled[at] - probe[at]).mean()), "control_nll": float(control[at].mean()),
                    "passage_use": (control[at] - probe[at]).tolist(), "second": [placements[i][2] for i in at]}
    return entry


def grid_estimate(values: list[float], low: float | None = None) -> dict[str, Any]:
    """Mean with Student's t 95% over windows (from MIN_WINDOWS; `low`: the quantity's floor), the values themselves
    and the standard error."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if len(values) < MIN_WINDOWS:
        return {"n": len(values), "mean": float(np.mean(values)), "values": values} if values else {"n": 0, "values": []}
    found = bounded_t_interval(values, low) if low is not None else t_interval(values)
    se = float(np.std(values, ddof=1) / math.sqrt(len(values)))
    return {"n": len(values), "mean": found.mean, "low": found.low, "high": found.high, "se": se, "values": values}


def summarise_grid(texts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """texts: text -> {"trained", "distances", "within", "placements" (window -> the methods' placements), "methods":
    method -> per window its grid_entry or None}. Per text and method: harm and use with intervals over windows; the
    verdicts of every use cell of the grid as one family, each against its text's margin (use_verdicts), beside
    the same rule against a fixed 0.05; each method's reach; the impossible cells, the paired
    comparisons and the split by position."""
    summary: dict[str, Any] = {"texts": {}}
    family: list[tuple[str, dict]] = []  # (text, use at one distance) for every cell of the grid
    for text, found in texts.items():
        cells, distances = found["methods"], found["distances"]
        plain, positive = cells.get(NONE, []), cells.get(GRID_POSITIVE, [])
        control = {d: grid_estimate([w[d]["use"] for w in positive if w]) for d in found["within"]}
        floor = np.mean([w[d]["control_nll"] for w in positive if w for d in found["within"]]) if any(positive) else None
        positive_cells = [estimate_spread(c) for c in control.values()]
        methods = {}
        for method in [m for m in cells if m != GRID_POSITIVE]:
            windows = cells[method]
            pairs = [(w, p) for w, p in zip(windows, plain + [None] * len(windows)) if w is not None and "within" in w]
            entry: dict[str, Any] = {
                "windows": sum(w is not None for w in windows), "past": grid_estimate([w["past"] for w, _ in pairs], 0.0),
                "cost_within": grid_estimate([w["within"] - p["within"] for w, p in pairs if p]),
                "penalty": grid_estimate([w["past"] - p["within"] for w, p in pairs if p])}
            for d in distances:
                entry[d] = {kind: grid_estimate([w[d][kind] for w in windows if w]) for kind in GRID_KINDS}
                entry[d]["control_nll"] = float(np.mean([w[d]["control_nll"] for w in windows if w])) \
                    if any(windows) else None
                family.append((text, entry[d]["use"]))
            reaches = {w["reach"] for w in windows if w} - {None}
            entry["attention_reach"] = max(reaches) if reaches else None
            entry["layers"] = max((layers_in(w["paths"]) for w in windows if w and w.get("paths")), default=None)
            entry["seconds"] = {kind: [w["seconds"][kind] for w in windows if w and kind in w["seconds"]]
                                for kind in GRID_FORWARDS}
            entry["cell_minutes"] = {i: sum(w["seconds"].values()) / 60 for i, w in enumerate(windows) if w}
            methods[method] = entry
        summary["texts"][text] = {**found, "margin": float(margin := use_margin(positive_cells)), "margin_se": margin.se,
                                  "margin_df": margin.df,
                                  "positive": control, "positive_control_nll": floor, "methods": methods}
    tests = [estimate_spread(use) for _, use in family]
    # one family, each cell against its own text's margin: Holm over all, the margin per text; beside it the same
    # rule against a margin fixed before the data (the floor, MARGIN_FLOOR nats): the verdicts' sensitivity to it
    margins = [Margin(found["margin"], found["margin_se"], found["margin_df"])
               for found in (summary["texts"][text] for text, _ in family)]
    for (_, use), word, fixed in zip(family, use_verdicts(tests, margins), use_verdicts(tests, MARGIN_FLOOR)):
        use["verdict"], use["fixed_margin"] = word, fixed
    for found in summary["texts"].values():
        for entry in found["methods"].values():
            entry["reach"] = reach_of(found["distances"], [entry[d]["use"]["verdict"] for d in found["distances"]])
    summary.update(family=len(family), impossible=grid_impossible(summary), pairs=grid_pairs(texts),
                   position=grid_position_split(texts))
    return summary


def layers_in(paths: dict[str, str]) -> int:
    """The layer count of a model from its attention_paths ({"layers 0-29": ...}: 30)."""
    return 1 + max(int(part) for key in paths for part in key.split()[-1].split("-"))


def grid_impossible(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells where the method cannot read the first copy (eval/verdicts.py impossible_use), with their verdicts."""
    found = []
    for text, entry in summary["texts"].items():
        for method, cells in entry["methods"].items():
            for d in entry["distances"]:
                why = impossible_use(d, cells["attention_reach"], cells["layers"] or 1, entry["span"])
                if why:
                    found.append({"text": text, "method": method, "distance": d, "why": why, "use": cells[d]["use"]})
    return found


def grid_pairs(texts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """GRID_PAIRED methods against each other, paired by window: use at every distance past L and the NLL past L,
    A minus B; every difference of the table one family (eval/verdicts.py separated_by_windows: "holm")."""
    rows = []
    for text, found in texts.items():
        past, cells = [d for d in found["distances"] if d > found["trained"]], found["methods"]
        present = [m for m in GRID_PAIRED if m in cells]
        for i, a in enumerate(present):
            for b in present[i + 1:]:
                both = [(x, y) for x, y in zip(cells[a], cells[b]) if x and y]
                rows.append({"text": text, "a": a, "b": b, "windows": len(both),
                             "use": {d: grid_estimate([x[d]["use"] - y[d]["use"] for x, y in both]) for d in past},
                             "past": grid_estimate([x["past"] - y["past"] for x, y in both if "past" in x and "past" in y])})
    family = [e for row in rows for e in (*row["use"].values(), row["past"])]
    for entry, separated in zip(family, separated_by_windows([(e.get("mean"), e.get("se"), e["n"]) for e in family])):
        entry["holm"] = separated
    return rows


def grid_position_split(texts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Distance or position? The largest distance is measured only where its second copies can lie, near the window's
    end: use at every distance split by where the second copy lies, before or from the first place a second copy of
    the largest distance lies (each window's mean over its passages in that part; intervals over every text's
    windows together)."""
    cut = min((p[2] for found in texts.values() for window in found["placements"].values() for p in window
               if p[0] == max(found["distances"])), default=None)
    if cut is None:
        return {}
    rows: dict[str, dict] = {}
    for found in texts.values():
        for method, windows in found["methods"].items():
            for w in windows if method != GRID_POSITIVE else []:
                for d in found["distances"] if w else []:
                    use, second = np.asarray(w[d]["passage_use"]), np.asarray(w[d]["second"])
                    parts = rows.setdefault(method, {}).setdefault(d, {"before": [], "from": []})
                    for part, chosen in (("before", second < cut), ("from", second >= cut)):
                        if chosen.any():
                            parts[part].append(float(use[chosen].mean()))
    return {"cut": cut, "methods": {method: {d: {part: grid_estimate(values) for part, values in by[d].items()}
                                             for d in sorted(by)} for method, by in rows.items()}}


def summaries_from_estimates(cells: dict[str, list], reach: dict[str, int], across: dict[str, list], priming: dict,
                             margin: float, pinned: bool, df) -> dict[str, UseSummary]:
    """A fleet's summaries from the estimates a study kept where it kept no per-window values (variant -> its cells:
    window length, distance, use estimate; LENGTH@DISTANCE -> copies apart, and the priming control's presence and
    order), their verdicts made again by the current rule: each interval's standard error read back from it,
    (high - low) / (2 t(0.975, df)), df(length) its degrees of freedom (seeds - 1, or one seed's windows - 1)."""
    summaries = {}
    for name, found in cells.items():
        estimates = [Estimate(**{"n": 1, **c["use"]}) for c in found]
        columns = [f"{c['length']}@{c['distance']}" for c in found]
        primed = [priming.get(name, {}).get(column) for column in columns]
        spreads = [Spread(e.mean, (e.high - e.low) / (2 * t_quantile_975(df(c["length"]))), df(c["length"]))
                   for e, c in zip(estimates, found)]
        summaries[name] = UseSummary(
            name, [c["distance"] for c in found], estimates, [verdict(s, margin) for s in spreads],
            reach.get(name), [c["length"] for c in found], [across.get(column) for column in columns], spreads,
            presence=[Estimate(**{"n": 1, **p["presence"]}) if p else None for p in primed],
            order=[Estimate(**{"n": 1, **p["order"]}) if p else None for p in primed])
        if pinned:
            summaries[name].pinned = max(summaries[name].distances[i] for i in summaries[name].longest_columns())
    calibrate_fleet(summaries, margin)
    return summaries
