"""Length extrapolation, context-matched: what happens to a checkpoint's loss at k times its trained length L.

    python -m eval.extrapolation --checkpoint runs/tiny --lengths 1x,2x,4x,8x,16x --out runs/extrap
    python -m eval.extrapolation --checkpoint runs/cmp/rope runs/cmp/alibi --methods yarn,dynamic \\
        --data ../shared/data/books --tokens 131072 --out runs/extrap

What is scored: segments as long as the longest length, spread evenly over all the held-out text
(eval/segments.py). Every length tiles them with nonoverlapping windows, so every length, and every checkpoint
with the same tokenizer and L, scores the same tokens. For each checkpoint, method and length k*L:
  ppl      perplexity of nonoverlapping windows of k*L tokens (the ALiBi paper's protocol);
  penalty  the extrapolation penalty, in nats: for tokens at positions >= L of those windows, their loss there
           minus their loss in the L-window reference (the same tokens scored by sliding windows of length L
           that advance by S, so each has between L - S + 1 and L tokens of context, all at trained positions).
           > 0: positions beyond L cost more than the longer context gives; < 0: the longer context helps.
           Interval: 95% bootstrap over windows, this model's only: it says nothing about another training
           run (over seeds, experiments.compare's t interval);
  probe    the position-shift probe: the L-token windows of the 1x cell scored with their positions offset by
           0, L, 3L and 15L; only absolute positions change, the context does not (relative encodings must not
           move at all).
Methods: "none" (the checkpoint as trained) plus each of --methods that applies (model/methods/): RoPE scalings
with factor = length / L, dynamic NTK scored token by token, a learned table clamped at its last row.
Writes OUT/results.json (a row per checkpoint, method and length: ppl, nll, tokens, penalty and its interval; the
1x rows also the probe), OUT/table.md (the perplexity, penalty and probe tables) and OUT/plot.png (perplexity
and penalty against length, side by side).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commands import add_checkpoint, add_device, add_out, comma_list, command_parser, parse, renamed, results_json
from data.tokenizer import load_tokenizer
from errors import ConfigError, PositionRangeError, cli_command
from eval import figures
from eval.heldout import checkpoint_eval_tokens
from eval.scoring import OnBatch, score_incremental, score_windows
from eval.segments import (
    Segments,
    choose_segments,
    reference_in_tiling,
    reference_layout,
    reference_windows,
    tiled_layout,
    tiled_windows,
)
from eval.stats import Estimate, crossed_bootstrap, draws_interval
from model.checkpoint import load_model, trained_length, training_data_dir
from model.methods import METHODS, NONE, applies, check_methods, label, method_spec
from model.runtime import autocast_dtype, configure_runtime, resolve_device
from model.transformer import Transformer

DEFAULT_METHODS = "linear,ntk,dynamic,yarn,clamp"
PROBE_MULTIPLES = (0, 1, 3, 15)  # position offsets of the shift probe, in units of L


MAX_MULTIPLE = 10_000  # 10,000 x L: past any memory, but a bound that keeps the arithmetic finite
MAX_TOKENS = 2**31 - 1


def parse_lengths(text: str) -> list[str]:
    """Comma-separated lengths: multiples of the trained length ("4x", "0.5x") or token counts ("1024")."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        try:
            if item.endswith("x"):
                valid = 0 < float(item[:-1]) <= MAX_MULTIPLE  # also refuses nan and inf
            else:
                valid = 0 < int(item) <= MAX_TOKENS
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(f"--lengths item {item!r} must be a multiple like 4x (at most {MAX_MULTIPLE}x) or a "
                              "token count like 1024")
    return items


def resolve_length(item: str, trained: int) -> int:
    """The length in tokens of a --lengths item for a model trained at `trained` tokens (at least 1)."""
    length = int(round(float(item[:-1]) * trained)) if item.endswith("x") else int(item)
    if length < 1:
        raise ConfigError(f"--lengths item {item!r} is less than one token at the trained length {trained}")
    return length


def default_reference_stride(trained: int) -> int:
    """L / 8 (at least 1): each reference token sees between 7/8 L and L tokens of context."""
    return max(1, trained // 8)


@dataclass(frozen=True)
class EvalPlan:
    """What one checkpoint's evaluation scores: the same for every method and length."""

    trained: int  # L
    lengths: tuple[int, ...]
    segments: Segments
    reference_stride: int
    probe_offsets: tuple[int, ...]  # in tokens; () = no probe

    def key(self) -> dict[str, Any]:
        """A JSON description that identifies the plan (cached results are reused only for an equal key)."""
        starts = hashlib.sha256(self.segments.starts.tobytes()).hexdigest()[:16]
        return {"trained": self.trained, "lengths": list(self.lengths), "segment_length": self.segments.length,
                "segments": len(self.segments.starts), "starts_sha": starts,
                "reference_stride": self.reference_stride, "probe_offsets": list(self.probe_offsets)}


def make_plan(n_tokens: int, trained: int, length_items: list[str], tokens: int, reference_stride: int = 0,
              probe: bool = True, segment_lengths: list[str] | None = None) -> EvalPlan:
    """The plan for `length_items`; segments are laid out for `segment_lengths` (default the same), so a plan for a
    subset of the lengths scores the same tokens as the plan for all of them."""
    lengths = tuple(sorted({resolve_length(item, trained) for item in length_items}))
    layout = sorted({resolve_length(item, trained) for item in segment_lengths or length_items})
    longest = layout[-1]
    stride = reference_stride or default_reference_stride(trained)
    if trained % stride:
        raise ConfigError(f"the reference stride ({stride}) must divide the trained length ({trained})")
    # Segments are whole multiples of every length (and of the reference stride), so every token is scored at
    # every length; for lengths without a small common multiple, those that do not divide it score a little less.
    segment = math.lcm(stride, *layout)
    if segment > 4 * longest:
        segment = -(-longest // stride) * stride
    segments = choose_segments(n_tokens, segment, tokens, margin=trained)
    offsets = tuple(multiple * trained for multiple in PROBE_MULTIPLES) if probe else ()
    return EvalPlan(trained, lengths, segments, stride, offsets)


def key_for(method: str, length: int) -> str:
    return f"{method}@{length}"


POSITION_BUCKETS = ((0, 1), (1, 2), (2, 4))  # positions [0, L), [L, 2L), [2L, 4L), in units of L


def position_spans(length: int, trained: int, tail: int, incremental: bool) -> list[tuple[int, int]]:
    """The positions a window of `length` tokens is reported on: the buckets within it and the last `tail`
    positions before each of 2L and 4L that it reaches (what dynamic NTK scores; an incremental method's only span,
    before `length`)."""
    if incremental:
        return [(length - tail, length)]
    return [(low * trained, min(high * trained, length)) for low, high in POSITION_BUCKETS if low * trained < length] \
        + [(end - tail, end) for end in (2 * trained, 4 * trained) if trained < end <= length]


def by_position(losses: np.ndarray, length: int, trained: int, tail: int, incremental: bool) -> dict[str, Any]:
    """One window's losses (score_under's row) by position: the mean over each of position_spans ([begin, end,
    mean]) and, for a whole window, the means of bins of L / 8 positions (what a curve by position needs)."""
    offset = length - len(losses)  # an incremental method's losses begin `offset` positions in
    spans = [[begin, end, float(losses[begin - offset:end - offset].mean())]
             for begin, end in position_spans(length, trained, tail, incremental)]
    width = max(1, trained // 8)
    bins = [] if incremental else losses[: length // width * width].reshape(-1, width).mean(axis=1).tolist()
    return {"spans": spans, "bin_width": width, "bins": bins}


def position_rows(windows: dict[tuple[str, int, str, int], list], trained: int) -> list[dict[str, Any]]:
    """(text, window, method, length) -> by_position's spans of that window  =>  a row per (text, method, length,
    span): the mean NLL over windows with its t interval cut at 0 (none below MIN_DRAWS windows: the values), and the
    difference to plain RoPE at the same length and positions, paired by window; plain RoPE at the length of every
    method. A (method, length) without spans of its own reads them from the shortest longer cell of the same method
    (the same settings, by the caller's choice of cells), plain RoPE from its longest."""
    def spans(text: str, window: int, method: str, length: int) -> dict[tuple[int, int], float]:
        longer = [n for t, w, m, n in windows if (t, w, m) == (text, window, method) and n >= length]
        return {} if not longer else {(b, e): v for b, e, v in windows[(text, window, method, min(longer))]
                                      if e <= length}

    rows, every = [], sorted({w for _, w, _, _ in windows})
    for text, method, length in dict.fromkeys(k for t, _, m, n in windows for k in ((t, NONE, n), (t, m, n))):
        pairs = [(spans(text, w, method, length), spans(text, w, NONE, length)) for w in every]
        for at in dict.fromkeys(at for own, _ in pairs for at in own):
            values = [own[at] for own, _ in pairs if at in own]
            differences = [own[at] - plain[at] for own, plain in pairs if at in own and at in plain]
            nll = draws_interval(values, 0.0)
            versus = (None if method == NONE else draws_interval(differences)) or Estimate(None, None, None, 0)
            rows.append({"text": text, "method": method, "length": length, "bucket": list(at), "windows": len(values),
                         "kind": "tail" if method_spec(method).incremental or at[0] % trained else "bucket",
                         "nll": nll.mean, "nll_low": nll.low, "nll_high": nll.high, "values": values,
                         "vs_plain": versus.mean, "vs_plain_low": versus.low, "vs_plain_high": versus.high,
                         "vs_plain_values": differences if versus.n else None})
    return rows


@dataclass
class CheckpointEvaluation:
    """Per-token losses of one checkpoint (segment layout) under each method and length, its L-window reference,
    and the shift probe's mean loss per L-window."""

    plan: dict[str, Any]
    reference: np.ndarray  # (segments, M)
    losses: dict[str, np.ndarray] = field(default_factory=dict)  # key_for(method, length) -> (segments, M)
    errors: dict[str, str] = field(default_factory=dict)  # key_for(method, length) -> why there is no number
    probe: dict[str, np.ndarray] = field(default_factory=dict)  # key_for(method, offset) -> (L-windows,) mean loss
    seconds: float = 0.0
    # key_for(method, length) -> the attention path each layer took there (Transformer.attention_paths)
    paths: dict[str, dict[str, str]] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        arrays = {"reference": self.reference}
        arrays.update({f"loss__{key}": value for key, value in self.losses.items()})
        arrays.update({f"probe__{key}": value for key, value in self.probe.items()})
        meta = {"plan": self.plan, "errors": self.errors, "seconds": self.seconds, "paths": self.paths}
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".tmp.npz")
        np.savez(staging, meta=np.array(json.dumps(meta)), **arrays)
        staging.replace(path)

    @classmethod
    def load(cls, path: Path) -> "CheckpointEvaluation":
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            evaluation = cls(meta["plan"], data["reference"], errors=meta["errors"], seconds=meta.get("seconds", 0.0),
                             paths=meta.get("paths", {}))
            for name in data.files:
                if name.startswith("loss__"):
                    evaluation.losses[name[len("loss__"):]] = data[name]
                elif name.startswith("probe__"):
                    evaluation.probe[name[len("probe__"):]] = data[name]
        return evaluation

    # Summaries ------------------------------------------------------------------------------------------------
    def nll(self, method: str, length: int) -> float | None:
        losses = self.losses.get(key_for(method, length))
        return None if losses is None else float(np.nanmean(losses))

    def penalty_windows(self, method: str, length: int) -> np.ndarray | None:
        """Per k*L window: mean over its positions >= L of (loss - reference loss), in nats. None at <= L."""
        losses = self.losses.get(key_for(method, length))
        trained, segment = self.plan["trained"], self.plan["segment_length"]
        if losses is None or length <= trained:
            return None
        per_segment = segment // length
        diff = (losses - self.reference)[:, : per_segment * length].reshape(-1, per_segment, length)
        return diff[:, :, trained:].mean(axis=-1).reshape(-1).astype(np.float64)

    def position_curve(self, method: str, length: int, reference: bool = False) -> np.ndarray | None:
        """Mean loss at each position of the length-windows (reference=True: the same tokens' reference loss)."""
        losses = self.losses.get(key_for(method, length))
        if losses is None:
            return None
        values = self.reference if reference else losses
        segment = self.plan["segment_length"]
        per_segment = segment // length
        return values[:, : per_segment * length].reshape(-1, length).mean(axis=0).astype(np.float64)

    def probe_nll(self, method: str, offset: int) -> float | None:
        values = self.probe.get(key_for(method, offset))
        return None if values is None else float(values.mean())

    def summary(self, methods: list[str], bins: int = 64) -> dict[str, Any]:
        """What a study's record keeps of the evaluation: per method and length the mean NLL (or why there is
        none) and the penalty of each window past L (a float32: read it back through np.float32); per method the
        penalty by position at the longest length in `bins` bins (window loss less reference loss, each bin the mean
        of longest // bins positions); the probe's mean NLL per offset; the seconds and the attention paths."""
        lengths, longest = self.plan["lengths"], max(self.plan["lengths"])
        bucket = max(1, longest // bins)
        found: dict[str, Any] = {"nll": {}, "penalty": {}, "curve": {}, "probe": {}, "errors": self.errors,
                                 "seconds": self.seconds, "paths": self.paths}
        for method in methods:
            for length in lengths:
                nll = self.nll(method, length)
                if nll is not None:
                    found["nll"][key_for(method, length)] = nll
                windows = self.penalty_windows(method, length)
                if windows is not None:  # float32 means: each the shortest decimal that reads back as that float32
                    found["penalty"][key_for(method, length)] = [float(str(v)) for v in windows.astype(np.float32)]
            curve = self.position_curve(method, longest)
            if curve is not None:
                curve = (curve - self.position_curve(method, longest, reference=True))[: longest // bucket * bucket]
                found["curve"][method] = curve.reshape(-1, bucket).mean(axis=1).tolist()
            for offset in self.plan.get("probe_offsets", []):
                nll = self.probe_nll(method, offset)
                if nll is not None:
                    found["probe"][key_for(method, offset)] = nll
        return found


def score_reference(model: Transformer, ids: np.ndarray, segments: Segments, trained: int, stride: int,
                    at_trained: np.ndarray | None, amp: torch.dtype | None, progress: bool,
                    on_batch: OnBatch = None) -> np.ndarray:
    """The L-window reference's losses (windows, stride): only each window's last `stride` targets are scored,
    and the windows that are windows of the L cell take their losses from it (`at_trained`, that cell's losses in
    window layout, or None)."""
    windows = reference_windows(ids, segments, trained, stride)
    losses = np.empty((len(windows), stride), dtype=np.float32)
    shared, cell = reference_in_tiling(segments, trained, stride) if at_trained is not None else ([], [])
    rest = np.setdiff1d(np.arange(len(windows)), shared)
    losses[rest] = score_windows(model, windows[rest], amp, progress=progress, desc=f"reference @ {trained}",
                                 last=stride, on_batch=on_batch)
    if len(shared):
        losses[shared] = at_trained[cell, -stride:]
    return losses


def evaluate_checkpoint(model: Transformer, ids: np.ndarray, plan: EvalPlan, methods: list[str],
                        amp: torch.dtype | None = None, progress: bool = False,
                        on_batch: OnBatch = None) -> CheckpointEvaluation:
    """Score `ids` under the plan with each applicable method (and "none"), the reference, and the probe
    (on_batch: eval/scoring.py)."""
    started = time.perf_counter()
    own = model.config.to_dict()
    trained, segments = plan.trained, plan.segments
    at_trained: dict[str, np.ndarray] = {}  # method -> its losses at L in window layout (the probe's offset 0)
    if trained in plan.lengths:  # the L cell first: every (L / stride)-th reference window is one of its windows
        at_trained[NONE] = score_windows(model, tiled_windows(ids, segments, trained), amp, progress=progress,
                                         desc=f"{NONE} @ {trained}", on_batch=on_batch)
    paths = model.attention_paths()
    evaluation = CheckpointEvaluation(plan.key(), reference_layout(
        score_reference(model, ids, segments, trained, plan.reference_stride, at_trained.get(NONE), amp, progress,
                        on_batch),
        segments, plan.reference_stride))
    if NONE in at_trained:
        evaluation.paths[key_for(NONE, trained)] = paths
    chosen = [NONE] + [method for method in methods if method != NONE and applies(method, model.config.position,
                                                                                  model.config.layer_encodings)]
    for method in chosen:
        spec = method_spec(method)
        for length in plan.lengths:
            key = key_for(method, length)
            if method != NONE and spec.as_trained_at(own, length, trained) and key_for(NONE, length) in \
                    evaluation.losses:  # scored as the checkpoint is: that cell, not scored twice
                evaluation.losses[key] = evaluation.losses[key_for(NONE, length)]
                if length == trained and NONE in at_trained:
                    at_trained[method] = at_trained[NONE]
                continue
            if method == NONE and length == trained:
                evaluation.losses[key] = tiled_layout(at_trained[NONE], segments, length)
                continue
            view = model.under(spec, length, trained)
            windows = tiled_windows(ids, segments, length)
            try:
                if spec.incremental:
                    losses = score_incremental(view, windows, trained, amp, progress, desc=f"{method} @ {length}",
                                               on_batch=on_batch)
                else:
                    losses = score_windows(view, windows, amp, progress=progress, desc=f"{method} @ {length}",
                                           on_batch=on_batch)
                    if length == trained:
                        at_trained[method] = losses
                evaluation.losses[key] = tiled_layout(losses, segments, length)
                evaluation.paths[key] = view.attention_paths()
            except PositionRangeError as error:
                evaluation.errors[key] = str(error).split(";")[0]
        if spec.shift_probe and plan.probe_offsets:
            view = model.under(spec, trained, trained)
            windows = tiled_windows(ids, segments, trained)
            for offset in plan.probe_offsets:
                try:
                    # Offset 0 is the L cell itself (the same windows, positions and settings).
                    losses = at_trained[method] if offset == 0 and method in at_trained else \
                        score_windows(view, windows, amp, position_offset=offset, on_batch=on_batch)
                    evaluation.probe[key_for(method, offset)] = losses.mean(axis=1)
                except PositionRangeError as error:
                    evaluation.errors[key_for(f"probe:{method}", offset)] = str(error).split(";")[0]
    evaluation.seconds = time.perf_counter() - started
    return evaluation


def summary_rows(evaluation: CheckpointEvaluation, name: str, position: str, checkpoint: str = "") -> list[dict]:
    """One row per method x length: ppl, nll, tokens, and the penalty with a bootstrap interval over windows."""
    plan = evaluation.plan
    rows = []
    methods = dict.fromkeys(key.split("@")[0] for key in [*evaluation.losses, *evaluation.errors]
                            if not key.startswith("probe:"))
    for method in methods:
        for length in plan["lengths"]:
            key = key_for(method, length)
            row: dict[str, Any] = {"checkpoint": checkpoint, "name": name, "label": label(name, method),
                                   "method": method, "position": position, "trained_length": plan["trained"],
                                   "length": length, "multiple": length / plan["trained"],
                                   "attention": evaluation.paths.get(key)}
            nll = evaluation.nll(method, length)
            if nll is None:
                row.update(ppl=None, error=evaluation.errors.get(key, "not evaluated"))
            else:
                losses = evaluation.losses[key]
                row.update(nll=nll, ppl=math.exp(nll), tokens=int(np.isfinite(losses).sum()))
                windows = evaluation.penalty_windows(method, length)
                if windows is not None:
                    estimate = crossed_bootstrap(windows[None, :])
                    row.update(penalty=estimate.mean, penalty_low=estimate.low, penalty_high=estimate.high)
            if length == plan["trained"]:
                row.update(probe_rows(evaluation, method))
            rows.append(row)
    return rows


def probe_rows(evaluation: CheckpointEvaluation, method: str) -> dict[str, Any]:
    """{"probe": [{offset, offset_multiple, nll, ppl} or {offset, offset_multiple, error}, ...]} of the shift probe
    under `method` (the 1x cell's L-windows with their positions offset), or {} where it did not run."""
    trained = evaluation.plan["trained"]
    probe = []
    for offset in evaluation.plan.get("probe_offsets", []):
        entry: dict[str, Any] = {"offset": offset, "offset_multiple": offset / trained}
        nll = evaluation.probe_nll(method, offset)
        error = evaluation.errors.get(key_for(f"probe:{method}", offset))
        if nll is not None:
            entry.update(nll=nll, ppl=math.exp(nll))
        elif error is not None:
            entry.update(error=error)
        else:
            continue
        probe.append(entry)
    return {"probe": probe} if probe else {}


def format_cell(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def tables_markdown(rows: list[dict[str, Any]]) -> str:
    """Perplexity and the extrapolation penalty by variant (rows) and multiple (columns), single runs."""
    multiples = sorted({row["multiple"] for row in rows})
    labels = list(dict.fromkeys(row["label"] for row in rows))
    by_key = {(row["label"], row["multiple"]): row for row in rows}
    trained = {row["label"]: row["trained_length"] for row in rows}  # each variant's own L
    header = "| variant | L | " + " | ".join(f"{m:g}x" for m in multiples) + " |\n|---|---:|" + "---:|" * len(multiples)
    ppl_lines, penalty_lines = [header], [header]
    for name in labels:
        cells, penalties = [], []
        for multiple in multiples:
            row = by_key.get((name, multiple), {})
            cells.append(format_cell(row.get("ppl")))
            if row.get("penalty") is None:
                penalties.append("n/a" if row.get("ppl") is None or multiple > 1 else "")
            else:
                penalties.append(f"{row['penalty']:+.3f} [{row['penalty_low']:+.3f}, {row['penalty_high']:+.3f}]")
        ppl_lines.append(f"| {name} | {trained[name]} | " + " | ".join(cells) + " |")
        penalty_lines.append(f"| {name} | {trained[name]} | " + " | ".join(penalties) + " |")
    tokens = sorted({row["tokens"] for row in rows if row.get("tokens")})
    lengths = "; ".join(f"L = {length}: " + ", ".join(f"{m:g}x = {m * length:g}" for m in multiples)
                        for length in sorted(set(trained.values())))
    note = (f"Columns are multiples of each variant's own trained length L (tokens: {lengths}). Scored tokens per cell: "
            f"{', '.join(f'{t:,}' for t in tokens)} (nonoverlapping windows over segments spread across the "
            "held-out text).")
    return ("### Perplexity\n\n" + "\n".join(ppl_lines) + "\n\n"
            "### Extrapolation penalty (nats; positions >= L, against the L-window reference; 95% bootstrap over "
            "this model's windows)\n\n" + "\n".join(penalty_lines) + "\n\n" + note + "\n" + probe_markdown(rows))


def probe_markdown(rows: list[dict[str, Any]]) -> str:
    """The position-shift probe's table (perplexity of the L-windows at each position offset), or "" without one."""
    probed = [row for row in rows if row.get("probe")]
    if not probed:
        return ""
    multiples = sorted({entry["offset_multiple"] for row in probed for entry in row["probe"]})
    lines = ["| variant | L | " + " | ".join(f"+{m:g}L" for m in multiples) + " |",
             "|---|---:|" + "---:|" * len(multiples)]
    for row in probed:
        by_multiple = {entry["offset_multiple"]: entry for entry in row["probe"]}
        cells = [format_cell(by_multiple.get(m, {}).get("ppl")) for m in multiples]
        lines.append(f"| {row['label']} | {row['trained_length']} | " + " | ".join(cells) + " |")
    return ("\n### Position-shift probe (perplexity of the 1x windows with every position offset by 0, L, 3L, 15L; "
            "the context is the same, so an encoding that reads only relative positions gives equal numbers)\n\n"
            + "\n".join(lines) + "\n")


def plot_results(rows: list[dict[str, Any]], path: Path,
                 title: str = "Perplexity and extrapolation penalty vs evaluation length") -> None:
    """Two panels on one length axis: perplexity, and the extrapolation penalty (with its bootstrap band) beyond L.
    One line per checkpoint and method, each with a colour of its own: the encoding's as trained, the method's under
    a method, with the encoding's marker and the method's line style (eval/figures.py)."""
    labels = list(dict.fromkeys(row["label"] for row in rows))
    first = {name: next(row for row in rows if row["label"] == name) for name in labels}
    styles = dict(zip(labels, figures.line_styles([(first[name]["position"], first[name]["method"])
                                                    for name in labels])))
    # The legend names the encoding of a checkpoint whose folder does not (runs/demo: "demo (rope)").
    legend = {name: name if first[name]["name"] == first[name]["position"] else f"{name} ({first[name]['position']})"
              for name in labels}
    figure, (ppl_axis, penalty_axis) = figures.new(columns=2, width=13, height=5)
    for name in labels:
        chosen = sorted((row for row in rows if row["label"] == name), key=lambda row: row["length"])
        points = [(row["length"], row["ppl"]) for row in chosen if row["ppl"] is not None]
        if points:
            ppl_axis.plot(*zip(*points), **styles[name], markersize=4, linewidth=1.3, label=legend[name])
        beyond = [row for row in chosen if row.get("penalty") is not None]
        if beyond:
            xs = [row["length"] for row in beyond]
            penalty_axis.plot(xs, [row["penalty"] for row in beyond], **styles[name], markersize=4, linewidth=1.3,
                              label=legend[name])
            penalty_axis.fill_between(xs, [row["penalty_low"] for row in beyond],
                                      [row["penalty_high"] for row in beyond], color=styles[name]["color"],
                                      alpha=0.15, linewidth=0)
    lengths = sorted({row["length"] for row in rows})
    for axis in (ppl_axis, penalty_axis):
        for trained in sorted({row["trained_length"] for row in rows}):
            axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        if len(lengths) <= 12:  # the lengths evaluated, in tokens, rather than powers of two
            axis.set_xticks(lengths, [str(length) for length in lengths])
            axis.minorticks_off()
        axis.set_xlabel("evaluation length (tokens, log scale); dotted = trained length L")
        axis.grid(True, which="both", alpha=0.3)
    ppl_axis.set_yscale("log")
    figures.plain_numbers(ppl_axis.yaxis)
    ppl_axis.set_ylabel("perplexity (log scale)")
    ppl_axis.set_title("Perplexity", fontsize=10)
    penalty_axis.axhline(0, color="black", linewidth=0.8)
    penalty_axis.set_ylabel("penalty (nats); band: 95% bootstrap over windows")
    penalty_axis.set_title("Penalty: loss beyond L minus the L-window reference (> 0: worse)", fontsize=10)
    figure.suptitle(title, fontsize=11)
    figures.save(figure, path, penalty_axis)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.extrapolation", __doc__)
    add_checkpoint(parser, "one or more checkpoint folders (required)", nargs="+")
    parser.add_argument("--lengths", default="1x,2x,4x,8x,16x",
                        help="comma-separated multiples of the trained length (4x) or token counts (1024)")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help=f"inference-time methods, each where it applies ('none' is always evaluated); valid: "
                             f"{', '.join(sorted(METHODS))}, or compositions such as yarn+logn")
    renamed(parser, "--scalings", "--methods")
    parser.add_argument("--data", help="prepared folder, source or path (default: each checkpoint's own held-out "
                                       "val.bin); a raw source that is the checkpoint's training source keeps only "
                                       "its held-out documents, any other is scored whole")
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="raw --data: the held-out share used to split it (default: the checkpoint's, else 0.05)")
    parser.add_argument("--all-documents", action="store_true",
                        help="raw --data that is the checkpoint's training source: score every document, training "
                             "documents included (other sources are always scored whole)")
    parser.add_argument("--tokens", type=int, default=65536, help="tokens scored per length")
    parser.add_argument("--reference-stride", type=int, default=0,
                        help="stride S of the L-window reference (0: L / 8)")
    add_device(parser)
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | auto")
    add_out(parser, "output folder: results.json, table.md and plot.png (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint", "out")
    rows: list[dict[str, Any]] = []
    lengths = parse_lengths(args.lengths)
    methods = check_methods(comma_list(args.methods))
    device = resolve_device(args.device)
    amp = autocast_dtype(device, args.dtype)
    for checkpoint in args.checkpoint:
        model = load_model(checkpoint, device)
        trained = trained_length(checkpoint)
        tokenizer = load_tokenizer(checkpoint)
        data = args.data or training_data_dir(checkpoint)
        ids, scored = checkpoint_eval_tokens(data, checkpoint, tokenizer, None, args.val_fraction, args.all_documents)
        print(f"{checkpoint}: {scored}")
        plan = make_plan(len(ids), trained, lengths, args.tokens, args.reference_stride)
        evaluation = evaluate_checkpoint(model, ids, plan, methods, amp, progress=True)
        for length in plan.lengths:  # the attention path of each length as trained (model/attention/registry.py)
            for layers, path in evaluation.paths.get(key_for(NONE, length), {}).items():
                print(f"  attention @ {length} ({layers}): {path}")
        rows += summary_rows(evaluation, Path(checkpoint).name, model.config.position, str(checkpoint))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(results_json(rows))
    (args.out / "table.md").write_text(tables_markdown(rows))
    plot_results(rows, args.out / "plot.png")
    print(tables_markdown(rows))
    print(f"wrote {args.out / 'results.json'}, {args.out / 'table.md'} and {args.out / 'plot.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
