"""The long-context methods on a pretrained model nobody here trained: mean NLL by position bucket at 1x, 2x and
4x of its context, passkey retrieval past it, wall time and peak memory. Resumable: every cell is cached.

    make real-model-deps
    python -m scripts.import_hf --checkpoint smollm2 --out runs/smollm2 --parity-tokens 2048
    python -m experiments.real_model --checkpoint runs/smollm2 --book path/to/book.txt --out runs/real_model

Texts: the standard library's files concatenated (`stdlib`, documents separated by <|endoftext|>) and, with --book,
a local text file read whole. The model never trained here, so every token is scored. Each text gives --windows
windows of the longest length, spread evenly over it. A cell is (text, window, method, length): the method set
for that length (model/methods/: a RoPE scaling with factor = length / L, an attention method's
parameters for the length) scores the window's first `length` tokens, one forward, the per-token losses chunked
so that no (tokens x vocab) logits are held. A cell whose settings equal those of a longer cell of the same window
(plain RoPE; a scaling at factor 1; logn, rerope, sinks and window, which do not depend on the length) is that
cell's prefix: causal attention gives its first tokens the same context and settings. Dynamic NTK is scored token
by token through the KV cache (as generation uses it) on the last --dynamic-tail positions before each length
past L, after a prefill of the rest. Buckets: positions [0, L), [L, 2L), [2L, 4L). Intervals: Student's t 95%
over windows (the mean of each window's bucket), cut at 0 (a mean NLL is not negative), and for the difference to
plain RoPE, paired by window; a cell with one window has no interval. Passkey (eval/passkey.py's prompt, greedy)
for --passkey-methods at --passkey-lengths and --depths; cells with fewer than 10 trials stay out of the report.
Use of the text on the same weights (eval/use.py) for --use-methods at --use-lengths: repeated passages at
--use-distances against the control without their first copies. Cells are run in priority order (window by window)
until --minutes have passed; a rerun continues. Writes OUT/cache/, OUT/results.json, OUT/report.md and
OUT/nll_by_position.png; --report-only rewrites report.md from results.json and the use cache.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import resource
import shlex
import sys
import time
from dataclasses import dataclass
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
    results_json,
)
from data.tokenizer import ENDOFTEXT, load_tokenizer
from errors import ConfigError, DataError, cli_command
from eval import figures
from eval.extrapolation import parse_lengths, resolve_length
from eval.heldout import load_eval_tokens
from eval.passkey import evaluate_passkey
from eval.scoring import score_incremental, score_windows
from eval.segments import choose_segments
from eval.stats import MIN_DRAWS, T_975, Estimate, draws_interval, t_interval
from eval.use import (
    DEFAULT_MARGIN,
    calibrate,
    default_span,
    distances_at,
    fitting_count,
    measure_use,
    rows_table,
    self_checks,
)
from model.checkpoint import load_model, trained_length
from model.methods import NONE, check_methods, method_spec
from model.runtime import autocast, autocast_dtype, configure_runtime, resolve_device

DEFAULT_METHODS = "none,linear,ntk,dynamic,yarn,selfextend,rerope,sinks,logn"
MIN_PASSKEY_TRIALS = 10  # a passkey cell with fewer trials is left out of the report


@dataclass(frozen=True)
class Cell:
    text: str
    window: int
    method: str
    length: int  # tokens scored from the window's start; for dynamic NTK, the end of the scored tail

    @property
    def name(self) -> str:
        return f"{self.text}/w{self.window}/{self.method}@{self.length}"


def machine() -> str:
    """The CPU's model name and core count (from /proc/cpuinfo where there is one), and the RAM."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        cores = sum(line.startswith("processor") for line in info.splitlines())
        cpu += " (avx512_bf16)" if " avx512_bf16" in info else ""
    except (OSError, StopIteration):
        cpu, cores = platform.processor() or "unknown CPU", 0
    memory = ""
    try:
        kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")))
        memory = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {cores} cores{memory}"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def read_texts(tokenizer, book: str | None, stdlib: bool = True) -> dict[str, np.ndarray]:
    """{name: token ids}: the standard library concatenated, and the book read whole."""
    texts = {"stdlib": load_eval_tokens("stdlib", tokenizer, all_documents=True)} if stdlib else {}
    if book:
        path = Path(book)
        if not path.is_file():
            raise DataError(f"--book {book}: no such file; give a local text file (a long book, UTF-8)")
        texts[path.stem] = np.asarray(tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False),
                                      dtype=np.int64)
    return texts


class Runner:
    """Computes cells in order, each cached under OUT/cache as soon as it is done."""

    def __init__(self, model, texts: dict[str, np.ndarray], starts: dict[str, np.ndarray], trained: int,
                 out: Path, amp: torch.dtype | None, tail: int) -> None:
        self.model, self.texts, self.starts, self.trained = model, texts, starts, trained
        self.cache, self.amp, self.tail = out / "cache", amp, tail
        self.own = model.config.to_dict()

    def settings(self, method: str, length: int) -> str:
        """What the model is under `method` set for `length` (equal strings: equal models)."""
        spec = method_spec(method)
        if method == NONE or spec.as_trained_at(self.own, length, self.trained):
            return "{}"
        return json.dumps(spec.changes(self.own, length, self.trained), sort_keys=True)

    def cells(self) -> list[Cell]:
        """Every cell in the cache (of this and earlier invocations)."""
        found = []
        for path in sorted(self.cache.glob("*/w*/*@*.npz")):
            method, length = path.stem.rsplit("@", 1)
            found.append(Cell(path.parent.parent.name, int(path.parent.name[1:]), method, int(length)))
        return found

    def longest(self) -> int:
        return max([cell.length for cell in self.cells()], default=0)

    def path(self, cell: Cell) -> Path:
        return self.cache / cell.text / f"w{cell.window}" / f"{cell.method}@{cell.length}.npz"

    def cached(self, cell: Cell, longest: int) -> np.ndarray | None:
        """The cell's losses from the cache: its own, or the prefix of a longer cell with the same settings."""
        if method_spec(cell.method).incremental:
            path = self.path(cell)
            return np.load(path)["losses"] if path.exists() else None
        wanted = self.settings(cell.method, cell.length)
        for method in dict.fromkeys([cell.method, NONE]):
            for length in sorted({cell.length, longest}):
                if length < cell.length or self.settings(method, length) != wanted:
                    continue
                path = self.path(Cell(cell.text, cell.window, method, length))
                if path.exists():
                    return np.load(path)["losses"][: cell.length]
        return None

    def window(self, cell: Cell, length: int) -> np.ndarray:
        start = int(self.starts[cell.text][cell.window])
        return self.texts[cell.text][start : start + length + 1][None, :]

    def compute(self, cell: Cell) -> None:
        started = time.perf_counter()
        spec = method_spec(cell.method)
        view = self.model.under(spec, cell.length, self.trained)
        if spec.incremental:  # the last `tail` positions before cell.length, token by token after a prefill
            losses = score_incremental(view, self.window(cell, cell.length), cell.length - self.tail,
                                       self.amp)[0, -self.tail:]
        else:
            losses = score_windows(view, self.window(cell, cell.length), self.amp)[0]
        seconds = time.perf_counter() - started
        path = self.path(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".tmp.npz")
        np.savez(staging, losses=losses, seconds=seconds, peak_rss_gib=peak_rss_gib(),
                 paths=json.dumps(view.attention_paths()))
        staging.replace(path)
        print(f"{cell.name}: mean NLL {float(np.mean(losses)):.4f} ({seconds:.0f} s, peak RSS {peak_rss_gib():.1f} GiB)",
              flush=True)


def plan_cells(texts: list[str], windows: int, methods: list[str], lengths: list[int], trained: int) -> list[Cell]:
    """Window by window (so an interrupted run has every method on its first windows), longest length first (so
    shorter cells of length-independent methods come from its prefix)."""
    cells = []
    for window in range(windows):
        for text in texts:
            for method in methods:
                if method_spec(method).incremental:
                    cells += [Cell(text, window, method, length) for length in lengths if length > trained]
                else:
                    cells += [Cell(text, window, method, length) for length in sorted(lengths, reverse=True)]
    return cells


def run_passkey(model, tokenizer, out: Path, methods: list[str], lengths: list[int], depths: list[float],
                trials: int, trained: int, amp: torch.dtype | None, deadline: float) -> list[dict]:
    """Passkey rows per (method, length, depth), each cached in OUT/cache/passkey/; returns every cached row."""
    for length in lengths:
        for method in methods if length > trained else [NONE]:  # the passkey methods act past L only
            for depth in depths:
                path = out / "cache" / "passkey" / f"{method}@{length}@{depth:g}.json"
                if not path.exists():
                    if time.perf_counter() > deadline:
                        continue
                    view = model.under(method_spec(method), length, trained)
                    started = time.perf_counter()
                    with autocast(next(model.parameters()).device, amp):
                        [row] = evaluate_passkey(view, tokenizer, [length], [depth], trials, seed=0)
                    row.update(method=method, seconds=time.perf_counter() - started)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(row))
    # every cached row, this invocation's and earlier ones'
    rows = [json.loads(path.read_text()) for path in (out / "cache" / "passkey").glob("*.json")]
    return sorted(rows, key=lambda row: (row["length"], row["method"], row["depth"]))


def run_use(model, texts: dict[str, np.ndarray], trained: int, out: Path, methods: list[str], lengths: list[int],
            items: list[str], windows: int, passages: int, amp: torch.dtype | None, deadline: float,
            separator: int | None = None, joiner: int | None = None) -> list[dict]:
    """The use measurement (eval/use.py) per (text, method, length), each cached in OUT/cache/use/TEXT/; at a length
    of at most L the model as trained only (the positive control). `separator`: the token between documents;
    `joiner`: a token put in its place in every window, the text then named TEXT-joined. Returns every cached row,
    with its text."""
    span = default_span(trained)
    for name, ids in texts.items():
        text = f"{name}{JOINED}" if joiner is not None else name
        for length in lengths:
            distances = distances_at(items, trained, length, max(lengths), span, passages)
            count = fitting_count(length, span, distances, passages)
            for method in ([NONE] if length <= trained else methods):
                path = out / "cache" / "use" / text / f"{method}@{length}.json"
                if path.exists() or not distances or not count or time.perf_counter() > deadline:
                    continue
                [result] = measure_use(model, ids, trained, length, distances, span, count, windows, seed=0,
                                       methods=(method,), amp=amp, separator=separator, joiner=joiner)
                rows = [{**result.row(i, trained, DEFAULT_MARGIN), "text": text, "seconds": result.seconds,
                         "dtype": "float32" if amp is None else "bfloat16",
                         "passages": result.passages[:, i, :].tolist()} for i in range(len(distances))]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"rows": rows, "recurrence": result.recurrence}))
    return cached_use(out, trained)


JOINED = "-joined"  # the suffix of a text measured with its documents joined (--join-documents)


def newline_token(tokenizer) -> int:
    """The tokenizer's one token for a newline (what --join-documents puts in place of a document's end)."""
    ids = tokenizer.encode("\n", add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(f"--join-documents needs a tokenizer with one token for a newline; this one gives {ids}")
    return ids[0]


def cached_use(out: Path, trained: int, rows: list[dict] | None = None) -> list[dict]:
    """Every use row of OUT/cache/use (or `rows`, those a results file keeps), its interval and verdict made again by
    the rules of now: an interval over windows only from MIN_DRAWS of them, the verdicts of each text's rows
    calibrated as one family (eval.use.calibrate)."""
    found = rows if rows is not None else [row for path in sorted((out / "cache" / "use").glob("*/*@*.json"))
                                           for row in json.loads(path.read_text())["rows"]]
    for row in found:
        values = row.get("use_values") or [row["use"]["mean"]]
        if len(values) < MIN_DRAWS:  # the passages of one window are not independent draws: no interval
            row["use"] = {"mean": float(np.mean(values)), "low": None, "high": None, "n": len(values)}
            row["unit"], row["n"], row["se"], row["verdict"] = "windows", len(values), None, "cannot tell"
        elif "se" not in row:
            row["se"] = float(np.std(values, ddof=1) / np.sqrt(len(values)))
    for text in dict.fromkeys(row["text"] for row in found):
        calibrate([row for row in found if row["text"] == text], trained)
    return sorted(found, key=lambda row: (row["text"], row["length"], row["method"], row["distance"]))


def window_values(mean: float, high: float | None, windows: int) -> list[float]:
    """The windows' own values of a mean over one or two windows reported with a t interval (at two windows the
    interval is mean +- t(0.975, 1) |x1 - x2| / 2, so the values are mean -+ (high - mean) / t(0.975, 1))."""
    if windows == 1 or high is None:
        return [mean]
    half = (high - mean) / T_975[0]
    return [mean - half, mean + half]


def use_markdown(use: list[dict], meta: dict[str, Any]) -> list[str]:
    """The use tables per text, with their self-checks (eval/use.py)."""
    trained = meta["trained"]
    lines = []
    for text in dict.fromkeys(row["text"] for row in use):
        rows = [row for row in use if row["text"] == text]
        lines += [f"## {text}: use of the text on the same weights (eval/use.py)", "",
                  "Repeated passages of S tokens, each second copy d tokens after its first, against the same window "
                  "with other text in place of the first copies; use = NLL(control) - NLL(probe) on the second "
                  "copies' tokens 2..S, nats, mean [95% t over windows; none below 3 windows]; verdicts calibrated "
                  "(eval.use.calibrate): 'uses' where the one-sided t test, Holm-corrected over the text's rows "
                  "past the positive control, shows use above 0 and the mean is at least the margin (a tenth of the "
                  f"positive control's use, at least {DEFAULT_MARGIN:g} nats); 'negligible' where shown above 0 "
                  "but below it; 'none' where the interval lies within +-margin; else 'cannot tell'. A window of "
                  "L tokens holds the model as trained (the positive control); a method whose attention cannot "
                  "reach d is marked 'past reach' (the negative control).", "", *rows_table(rows, trained)]
        lines += ["", *[f"- {check}" for check in self_checks(rows, trained)], ""]
        precisions = {}
        for row in rows:
            precisions.setdefault(row.get("dtype", "bfloat16"), {}).setdefault(f"{row['method']} at "
                                                                              f"{row['length']:,}", None)
        if len(precisions) > 1:
            lines += ["Precision: " + "; ".join(f"{dtype} for {', '.join(cells)}" for dtype, cells in
                                                sorted(precisions.items())) + ".", ""]
        lines += joined_markdown(use, text, trained)
    return lines


def joined_markdown(use: list[dict], text: str, trained: int) -> list[str]:
    """For TEXT-joined beside TEXT: each (method, length, distance) measured both ways, with the difference paired
    by passage (the same windows and passages; only the document ends differ)."""
    if not text.endswith(JOINED):
        return []
    as_is = {(r["method"], r["length"], r["distance"]): r for r in use if r["text"] == text[: -len(JOINED)]}
    pairs = [(as_is[key], r) for r in use if r["text"] == text
             and (key := (r["method"], r["length"], r["distance"])) in as_is and "passages" in as_is[key]]
    if not pairs:
        return []
    lines = [f"{text} against {text[: -len(JOINED)]}: the same windows and passages with each document end in the "
             "window replaced by a newline; the difference paired by passage, mean [95% t].", "",
             "| window | method | distance (tokens) | copies in two documents | use as is | use, documents joined | "
             "joined - as is |", "|---:|---|---:|---:|---:|---:|---:|"]
    for before, after in pairs:
        change = np.asarray(after["passages"], dtype=float).ravel() - np.asarray(before["passages"], dtype=float).ravel()
        apart = (f"{before['across_documents']} of {before['passages_scored']}" if "across_documents" in before
                 else "")
        lines.append(f"| {after['length']:,} ({after['length'] / trained:g}L) | {after['method']} | "
                     f"{after['distance']:,} | {apart} | {Estimate(**before['use']).format(3, signed=True)} | "
                     f"{Estimate(**after['use']).format(3, signed=True)} | "
                     f"{t_interval(change).format(3, signed=True)} |")
    return lines + [""]


BUCKETS = ((0, 1), (1, 2), (2, 4))  # in units of L
TEXT_NOTES = {"stdlib": ", this machine's Python standard library: its .py files and pydoc topics, concatenated"}


def trainer_note(checkpoint: str) -> str:
    """What the checkpoint is, from its trainer state: where an import came from and what its weights are."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    if state.get("weights") == "dequantized from GGUF":
        return (f"imported from {Path(state['imported_from']).name}: its quantized weights dequantized to float, so "
                "absolute losses are those of the quantized model (higher than the original's); methods compared on "
                "the same weights stay comparable")
    return f"from {state.get('imported_from', 'training here')}"
LAYOUT_MULTIPLE = 4  # windows are laid out for 4L tokens whatever --lengths is, so every invocation shares them


def window_layout(texts: dict[str, np.ndarray], length: int, windows: int, out: Path) -> dict[str, np.ndarray]:
    """Each text's window starts: `windows` windows of `length` tokens spread evenly; kept in OUT/cache/layout.json
    so that every invocation on OUT scores the same windows (another layout is refused)."""
    layout = {name: choose_segments(len(ids), length + 1, windows * (length + 1), 0).starts.tolist()
              for name, ids in texts.items()}
    path = out / "cache" / "layout.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    clash = [name for name in layout if name in saved and saved[name] != layout[name]]
    if clash:
        raise ConfigError(f"{out} holds cells of other windows of {clash} (another --windows or text); use the same "
                          "settings, or another --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**saved, **layout}))
    return {name: np.asarray(starts) for name, starts in layout.items()}


def spans(method: str, length: int, trained: int, tail: int) -> list[tuple[int, int, str]]:
    """(begin, end, kind) of the positions a (method, length) row reports: the buckets within the length, and the
    last `tail` positions before each multiple of L past it (what dynamic NTK scores; its only span)."""
    tails = [(end - tail, end, "tail") for end in (2 * trained, 4 * trained) if trained < end <= length]
    if method_spec(method).incremental:
        return [(length - tail, length, "tail")]
    return [(low * trained, min(high * trained, length), "bucket") for low, high in BUCKETS
            if low * trained < length] + tails


def summarise(runner: Runner, cells: list[Cell], longest: int) -> list[dict[str, Any]]:
    """One row per (text, method, length, span): the mean over windows with its t interval, and the difference to
    plain RoPE at the same length and positions, paired by window."""
    rows = []
    keys = dict.fromkeys(key for cell in cells for key in ((cell.text, NONE, cell.length),
                                                            (cell.text, cell.method, cell.length)))
    windows = sorted({cell.window for cell in cells})
    for text, method, length in keys:
        incremental = method_spec(method).incremental
        for begin, end, kind in spans(method, length, runner.trained, runner.tail):
            values, differences = [], []
            for window in windows:
                losses = runner.cached(Cell(text, window, method, length), longest)
                plain = runner.cached(Cell(text, window, NONE, length), longest)
                if losses is None:
                    continue
                part = losses if incremental else losses[begin:end]
                values.append(float(part.mean()))
                if plain is not None:
                    differences.append(float(part.mean() - plain[begin:end].mean()))
            if not values:
                continue
            # a mean NLL is >= 0: its t interval is cut there; below MIN_DRAWS windows, no interval (the values)
            estimate, difference = draws_interval(values, 0.0), draws_interval(differences) if differences else None
            if method == NONE:
                difference = None  # plain RoPE is the reference, not a difference
            rows.append({"text": text, "method": method, "length": length, "multiple": length / runner.trained,
                         "bucket": [begin, end], "kind": kind, "windows": len(values), "nll": estimate.mean,
                         "nll_low": estimate.low, "nll_high": estimate.high,
                         "vs_plain": None if difference is None else difference.mean,
                         "vs_plain_low": None if difference is None else difference.low,
                         "vs_plain_high": None if difference is None else difference.high, "values": values,
                         "vs_plain_values": differences if difference is not None else None})
    return rows


def bucket_name(bucket: list[int]) -> str:
    return f"{bucket[0]:,}-{bucket[1]:,}"


def interval(mean: float | None, low: float | None, high: float | None, signed: bool = False,
             values: list[float] | None = None) -> str:
    """'mean [low, high]', or below MIN_DRAWS windows the windows' own values and no interval."""
    if mean is None:
        return ""
    sign = "+" if signed else ""
    if low is None and values:
        return " / ".join(f"{v:{sign}.3f}" for v in values) + f" ({len(values)} window{'s' * (len(values) > 1)}: no interval)"
    return f"{mean:{sign}.3f}" if low is None else f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def report_markdown(rows: list[dict], passkey: list[dict], meta: dict[str, Any], use: list[dict] | None = None) -> str:
    lines = [f"# {meta['title']}", "", meta["setup"], ""]
    lines += ["![Mean NLL by position, bins of L / 8, one line per method and window length; dotted: L and 2L]"
              "(nll_by_position.png)", ""]
    if meta.get("parity"):
        lines += ["## Parity with transformers (scripts.import_hf --parity-tokens)", "", meta["parity"], ""]
    titles = {"bucket": "mean NLL by position bucket",
              "tail": f"the last {meta['tail']} positions before 2L and 4L (dynamic NTK scored token by token)"}
    for text in dict.fromkeys(row["text"] for row in rows):
        for kind, title in titles.items():
            chosen = [r for r in rows if r["text"] == text and r["kind"] == kind]
            if kind == "tail" and not any(method_spec(r["method"]).incremental for r in chosen):
                continue
            lines += [f"## {text}: {title}", "",
                      "| positions | window | method | windows | mean NLL [95% t over windows] | minus plain "
                      "[paired by window] |", "|---|---:|---|---:|---:|---:|"]
            for row in sorted(chosen, key=lambda r: (r["bucket"][0], r["length"])):
                lines.append(f"| {bucket_name(row['bucket'])} | {row['length'] / 1024:g}k ({row['multiple']:g}x) | "
                             f"{row['method']} | {row['windows']} | "
                             f"{interval(row['nll'], row['nll_low'], row['nll_high'], values=row.get('values'))} | "
                             + ("(the reference) |" if row["method"] == NONE else
                                f"{interval(row['vs_plain'], row['vs_plain_low'], row['vs_plain_high'], True, row.get('vs_plain_values'))} |"))
            lines.append("")
    shown = [row for row in passkey if row["trials"] >= MIN_PASSKEY_TRIALS]
    if len(shown) < len(passkey):
        lines += [f"Passkey: {len(passkey) - len(shown)} cells with fewer than {MIN_PASSKEY_TRIALS} trials each are "
                  "left out of the report (one prompt says little about retrieval; results.json keeps them).", ""]
    passkey = shown
    if use:
        lines += use_markdown(use, meta)
    if passkey:
        lines += ["## Passkey retrieval (greedy, eval/passkey.py's prompt)", "",
                  "| method | prompt length | depth | correct | answers (key -> answer) | seconds |",
                  "|---|---:|---:|---:|---|---:|"]
        for row in passkey:
            answers = ", ".join(f"{a['key']} -> {a['answer']}" for a in row["answers"])
            lines.append(f"| {row['method']} | {row['length']:,} | {row['depth']:g} | "
                         f"{round(row['accuracy'] * row['trials'])}/{row['trials']} | {answers} | {row['seconds']:.0f} |")
        lines.append("")
    lines += ["## Cost", "", meta["cost"], ""]
    return "\n".join(lines)


def plot(runner: Runner, path: Path) -> None:
    """Mean NLL in bins of L / 8 positions, one line per scored (method, length) cell, one panel per text; the mean
    over the windows every plotted cell of the text has (a method's colour, a length's line style); dotted lines at
    L and 2L. Dynamic NTK's tails are left out (they are in the tables)."""
    cells = [cell for cell in runner.cells() if not method_spec(cell.method).incremental]
    texts = list(dict.fromkeys(cell.text for cell in cells))
    figure, axes = figures.new(columns=len(texts), width=6.5 * len(texts), height=4.8)
    axes = np.atleast_1d(axes)
    width = max(1, runner.trained // 8)
    styles = {4: "-", 2: "--", 1: ":"}
    for axis, text in zip(axes, texts):
        lines = list(dict.fromkeys((cell.method, cell.length) for cell in cells if cell.text == text))
        common = set.intersection(*({cell.window for cell in cells if (cell.text, cell.method, cell.length) ==
                                     (text, method, length)} for method, length in lines))
        for method, length in lines:
            losses = [np.load(runner.path(cell))["losses"] for cell in cells
                      if (cell.text, cell.method, cell.length) == (text, method, length)
                      and (cell.window in common or not common)]
            bins = np.mean([part[: length // width * width].reshape(-1, width).mean(axis=1) for part in losses], axis=0)
            multiple = length / runner.trained
            axis.plot((np.arange(len(bins)) + 0.5) * width / 1024, bins, color=figures.method_colour(method),
                      linestyle=styles.get(round(multiple), "-."), label=f"{method} ({multiple:g}x)")
        for multiple in (1, 2):
            axis.axvline(multiple * runner.trained / 1024, color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel(f"position (thousands of tokens; bins of {width:,})")
        axis.set_ylabel("mean NLL (nats)")
        if not common:
            axis.set_title(f"{text} (each line over its own windows)")
        else:
            shown = sorted(common)
            axis.set_title(f"{text} (windows {shown})" if len(shown) > 1 else f"{text} (window {shown[0]})")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figures.save(figure, path)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.real_model", __doc__)
    add_checkpoint(parser, "an imported checkpoint (scripts.import_hf) (required)")
    parser.add_argument("--book", help="a long local text file, scored beside the standard library")
    parser.add_argument("--texts", default="stdlib,book", help="the texts this invocation scores (the report "
                                                                 "holds every cached cell)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="inference-time methods (none = plain RoPE)")
    parser.add_argument("--lengths", default="1x,2x,4x", help="window lengths of the NLL cells: multiples of L or "
                                                               "token counts ('' for none)")
    parser.add_argument("--windows", type=int, default=2, help="windows of the longest length per text")
    parser.add_argument("--dynamic-tail", type=int, default=128,
                        help="positions before each length past L that dynamic NTK scores token by token")
    parser.add_argument("--passkey-methods", default="none,yarn,selfextend")
    parser.add_argument("--passkey-lengths", default="1x,2x", help="passkey prompt lengths")
    parser.add_argument("--depths", default="0.1,0.5,0.9", help="passkey key depths")
    parser.add_argument("--trials", type=int, default=MIN_PASSKEY_TRIALS,
                        help=f"passkey keys per (method, length, depth); cells with fewer than {MIN_PASSKEY_TRIALS} "
                             "stay out of the report")
    parser.add_argument("--use-methods", default=DEFAULT_METHODS,
                        help="methods whose use of the text is measured (eval/use.py) past L; '' for none")
    parser.add_argument("--use-lengths", default="1x,2x",
                        help="window lengths of the use measurement (one of at most L: the positive control)")
    parser.add_argument("--use-distances", default="0.25x,0.75x,1.25x,1.75x",
                        help="distances between the repeated passages, multiples of L or tokens")
    parser.add_argument("--use-windows", type=int, default=1, help="windows per (text, length) for use")
    parser.add_argument("--use-passages", type=int, default=8, help="passages per distance in each use window")
    parser.add_argument("--join-documents", action="store_true",
                        help="measure use with every document end in the use windows replaced by a newline: the "
                             "same windows and passages with the documents joined, reported as TEXT-joined beside "
                             "TEXT (what a document boundary between the copies costs)")
    parser.add_argument("--report-only", action="store_true",
                        help="compute nothing: rewrite report.md from OUT/results.json (and OUT/cache/use)")
    add_device(parser)
    parser.add_argument("--dtype", default="auto",
                        help="auto (bfloat16 autocast where the device computes it natively, else float32) | "
                             "bfloat16 | float32")
    parser.add_argument("--minutes", type=float, default=120.0, help="start no new cell after this many minutes")
    add_out(parser, "output folder (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint", "out")
    if args.dtype not in ("auto", "bfloat16", "float32"):
        raise ConfigError(f"--dtype is auto, bfloat16 or float32, not {args.dtype!r}")
    if args.report_only:
        rewrite_report(args.out, trained_length(args.checkpoint))
        return 0
    started = time.perf_counter()
    deadline = started + 60 * args.minutes
    trained = trained_length(args.checkpoint)
    lengths = sorted({resolve_length(item, trained) for item in parse_lengths(args.lengths)})
    methods = check_methods(comma_list(args.methods))
    methods = [NONE] + [method for method in methods if method != NONE]
    device = resolve_device(args.device)
    amp = autocast_dtype(device, args.dtype)  # a CPU without native bf16 computes it tens of times slower
    args.dtype = "bfloat16" if amp is not None else "float32"  # as the report names it
    model = load_model(args.checkpoint, device).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    saved = args.out / "cache" / "layout.json"  # texts an earlier invocation scored stay in the report
    wanted = set(comma_list(args.texts)) | set(json.loads(saved.read_text()) if saved.exists() else [])
    texts = read_texts(tokenizer, args.book, stdlib="stdlib" in wanted)
    starts = window_layout(texts, max([*lengths, LAYOUT_MULTIPLE * trained]), args.windows, args.out)
    runner = Runner(model, texts, starts, trained, args.out, amp, args.dynamic_tail)
    asked = comma_list(args.texts)
    chosen = [name for name in texts if name in asked or (name != "stdlib" and "book" in asked)]
    for cell in plan_cells(chosen, args.windows, methods, lengths, trained):
        if runner.cached(cell, runner.longest()) is None and time.perf_counter() < deadline:
            runner.compute(cell)
    passkey = run_passkey(model, tokenizer, args.out, check_methods(comma_list(args.passkey_methods)),
                          [resolve_length(item, trained) for item in parse_lengths(args.passkey_lengths)],
                          [float(depth) for depth in comma_list(args.depths)], args.trials, trained, amp, deadline)
    use = run_use(model, {name: texts[name] for name in chosen}, trained, args.out,
                  [NONE] + [m for m in check_methods(comma_list(args.use_methods)) if m != NONE],
                  sorted({resolve_length(item, trained) for item in parse_lengths(args.use_lengths)}),
                  comma_list(args.use_distances), args.use_windows, args.use_passages, amp, deadline,
                  tokenizer.convert_tokens_to_ids(ENDOFTEXT), newline_token(tokenizer) if args.join_documents else None)
    log_invocation(args.out, "experiments.real_model", argv, started)
    write_outputs(runner, passkey, args, texts, use)
    return 0


def log_invocation(out: Path, module: str, argv: list[str] | None, started: float, cells: int | None = None) -> None:
    """Write this invocation's record (`python -m MODULE` and its arguments, wall time so far, the time of writing,
    load averages, the machine, cells computed when given) to OUT/cache/invocations.json, replacing the record it wrote before.
    Called at the start and after each cell, it leaves a killed run its record up to its last finished cell; the file
    is locked, so processes sharing a cache (one per text) do not lose each other's records."""
    path = out / "cache" / "invocations.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": portable_command(f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else argv)),
              "ended": time.strftime("%Y-%m-%d %H:%M"), "minutes": (time.perf_counter() - started) / 60,
              "load_average": [round(value, 2) for value in os.getloadavg()], "machine": machine(),
              "key": f"{platform.node()}:{os.getpid()}:{started:.6f}"}
    if cells is not None:
        record["cells"] = cells
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = json.loads(path.read_text()) if path.exists() else []
        log = [item for item in log if item.get("key") != record["key"]] + [record]
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(json.dumps(log, indent=1))
        staging.replace(path)


def cell_costs(runner: Runner) -> tuple[float, float, str]:
    """(seconds of every cached cell, passkey row and use measurement, the largest peak RSS any recorded, each method's attention
    path as its cells recorded it, e.g. "none: sdpa; selfextend: merged")."""
    seconds, peak = 0.0, 0.0
    kinds: dict[str, set[str]] = {}
    for path in sorted(runner.cache.rglob("*.npz")):
        with np.load(path) as data:
            seconds += float(data["seconds"])
            peak = max(peak, float(data["peak_rss_gib"]))
            recorded = json.loads(str(data["paths"])) if "paths" in data else {}
        method = path.stem.rsplit("@", 1)[0]
        kinds.setdefault(method, set()).update(kind.split(":")[0] for kind in recorded.values())
    for path in (runner.cache / "passkey").glob("*.json"):
        seconds += json.loads(path.read_text())["seconds"]
    for path in (runner.cache / "use").glob("*/*@*.json"):  # one measurement: every row carries its seconds
        seconds += json.loads(path.read_text())["rows"][0]["seconds"]
    paths = "; ".join(f"{method}: {', '.join(sorted(found))}" for method, found in sorted(kinds.items()) if found)
    return seconds, peak, paths


def rewrite_report(out: Path, trained: int) -> None:
    """report.md again from OUT/results.json, with the use rows of OUT/cache/use when there are any (mean NLL
    intervals cut at 0, as summarise now gives them)."""
    path = out / "results.json"
    if not path.exists():
        raise ConfigError(f"--report-only: {path} does not exist; run experiments.real_model into {out} first")
    results = json.loads(path.read_text())
    for row in results["rows"]:
        if row["windows"] < MIN_DRAWS:  # a row of one or two windows: their values, no interval
            row.setdefault("values", window_values(row["nll"], row["nll_high"], row["windows"]))
            if row["vs_plain"] is not None:
                row.setdefault("vs_plain_values", window_values(row["vs_plain"], row["vs_plain_high"], row["windows"]))
            row["nll_low"] = row["nll_high"] = row["vs_plain_low"] = row["vs_plain_high"] = None
        row["nll_low"] = None if row["nll_low"] is None else max(0.0, row["nll_low"])
    use = cached_use(out, trained) if (out / "cache" / "use").exists() else cached_use(out, trained, results.get("use", []))
    results["use"], results["meta"]["trained"] = use, trained
    measured = {(row["text"], row["method"], row["length"]): row["seconds"] for row in use}
    results["meta"]["cost"] = results["meta"]["cost"].split("\n\nUse measurements:")[0]  # the line is made anew
    if measured:
        results["meta"]["cost"] += (f"\n\nUse measurements: {sum(measured.values()) / 60:.1f} min of compute in all "
                                    f"({len(measured)} (text, method, length) cells, probe and control; the seconds "
                                    "column of the use table)")
    results["meta"]["cost"] = portable_command(results["meta"]["cost"])  # no path of the machine that ran it
    for item in results.get("invocations", []):
        item["command"] = portable_command(item["command"])
    results["meta"]["setup"] = results["meta"]["setup"].replace("95% over windows; a row", "95% over windows, cut at 0; a row").replace(
        "cut at 0; a row with one window has none", f"cut at 0; a row with fewer than {MIN_DRAWS} windows has none (its "
        "windows' own values are shown)")
    path.write_text(results_json(results))
    (out / "report.md").write_text(report_markdown(results["rows"], results["passkey"], results["meta"], use))


def write_outputs(runner: Runner, passkey: list[dict], args: argparse.Namespace, texts: dict[str, np.ndarray],
                  use: list[dict]) -> None:
    cells = runner.cells()
    longest = runner.longest()
    rows = summarise(runner, cells, longest)
    cell_seconds, peak, paths = cell_costs(runner)
    text_lines = "; ".join(f"{name} ({len(ids):,} tokens{TEXT_NOTES.get(name, ', the file given as --book, read whole')})"
                           for name, ids in texts.items())
    invocations = json.loads((runner.cache / "invocations.json").read_text())
    parity = Path(args.checkpoint) / "parity.json"
    meta = {"title": f"Long-context methods on {Path(args.checkpoint).name}, a model nobody here trained",
            "tail": runner.tail, "trained": runner.trained,
            "setup": (f"Checkpoint `{args.checkpoint}` (L = {runner.trained:,}), {trainer_note(args.checkpoint)}. "
                      f"Texts: {text_lines}. Windows: {args.windows} per text of up to {longest:,} tokens, spread "
                      f"evenly (window 0 starts at the text's first token); {args.dtype}. A cell scores a window's first "
                      "`window` tokens with the method set for that length (a RoPE scaling's factor = length / L); "
                      "its rows are the position buckets within it. Dynamic NTK: token by token through the KV cache "
                      f"on the last {runner.tail} positions before 2L and 4L, after a prefill of the rest; the tail "
                      "table sets every method's numbers on those same positions beside it. Intervals: Student's t "
                      "95% over windows, cut at 0; a row with one window has none. Attention path of each method's cells "
                      f"(docs/internals.md): {paths or 'not recorded'}."),
            "parity": json.loads(parity.read_text())["table"] if parity.exists() else "",
            "cost": (f"Machine: {machine()}. Cells and passkey rows: {cell_seconds / 60:.1f} min of compute in all; "
                     f"peak resident memory of any cell {peak:.1f} GiB. Invocations on this cache (end time, wall "
                     "minutes, load average 1/5/15 min at the end: the CPU was shared with other jobs):\n\n" +
                     "\n".join(f"- `{item['command']}`: ended {item['ended']}, {item['minutes']:.1f} min, load "
                               f"{' / '.join(map(str, item['load_average'])) or 'not recorded'}"
                               + (f" ({item['note']})" if item.get("note") else "") for item in invocations))}
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"meta": meta, "machine": machine(), "cell_minutes": cell_seconds / 60, "peak_rss_gib": peak,
               "rows": rows, "passkey": passkey, "use": use, "invocations": invocations}
    (args.out / "results.json").write_text(results_json(results))
    (args.out / "report.md").write_text(report_markdown(rows, passkey, meta, use))
    if rows:
        plot(runner, args.out / "nll_by_position.png")
    print(report_markdown(rows, passkey, meta, use))


if __name__ == "__main__":
    sys.exit(main())
