"""Harm and use of inference-time methods window by window on one checkpoint (the real model's grid).

    python -m experiments.method_grid --checkpoint runs/smollm2 --texts path/to/book1.txt,path/to/book2.txt \\
        --length 2x --windows 8 --out runs/method_grid

Texts: local files read whole (UTF-8), each named by its file's stem. Each gives --windows windows of T = --length
tokens, spread evenly over it with equal gaps before, between and after them: none starts at the text's first token
(a book's title and contents). The window is the unit: every interval is Student's t 95% over windows, and a cell
with fewer than MIN_WINDOWS windows prints its values without one.

In each window its own draw (seeded by window) of --passages passages of S tokens per distance d
(--distances; S = L / 4 within 8..64 tokens, eval.use.default_span), taken from the text outside the window, each written twice d apart; each second copy starts at a
random free token past L (eval.use.jittered), so no distance is measured at one fixed place in every window. For
each (text, window, method) four forwards of the window under the method set for T (model/methods/):

    natural   the window as it is                            harm: mean NLL on [0, L) and [L, T)
    probe     the passages written twice
    control   another passage of the text at each first copy
    shuffled  each first copy holding its passage's tokens shuffled (the priming control)

and on tokens 2..S of every second copy (a window's value the mean over its passages):

    use      = NLL(control) - NLL(probe)      reading the first copy
    presence = NLL(control) - NLL(shuffled)   having its tokens in context, in any order
    order    = NLL(shuffled) - NLL(probe)     what reading them in order adds

The positive control: in each window's first L + 1 tokens the checkpoint as trained (every position one it trained
at) with passages at the distances within L; its use sets the verdicts' margin (eval.stats.use_margin). Dynamic NTK
runs through the KV cache in chunks of --dynamic-step tokens after a prefill to the first scored token (a chunked
prefill: each chunk under the base of its end). Every cell is cached as soon as its four forwards are
done (OUT/cache/TEXT/wN/METHOD.json: per passage its losses, per window its harm: small enough to commit as the
record); a rerun continues where the last stopped, and processes may share OUT, on different texts or on the same
one: each takes a cell under a lock (OUT/cache/TEXT/wN/METHOD.lock, released when its process ends), and skips
cells another live process holds, so one process per core fills the grid.
Writes OUT/results.json and OUT/report.md (experiments/method_grid_report.py); --report-only rewrites them from the
cache.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from commands import add_checkpoint, add_device, add_out, comma_list, command_parser, parse, results_json
from data.tokenizer import load_tokenizer
from errors import ConfigError, DataError, cli_command
from eval.extrapolation import resolve_length
from eval.scoring import score_incremental, score_windows
from eval.use import GAP, Placement, default_span, jittered, lead_tokens, reach, shuffled_first_copies, write_copies
from experiments.method_grid_report import write_report
from experiments.real_model import log_invocation, machine, peak_rss_gib
from model.checkpoint import load_model, trained_length
from model.methods import NONE, check_methods, method_spec
from model.runtime import autocast_dtype, configure_runtime, resolve_device

DEFAULT_METHODS = "none,linear,ntk,dynamic,yarn,selfextend,rerope,string,dca,sinks,logn"
FORWARDS = ("natural", "probe", "control", "shuffled")
POSITIVE = "positive"  # the cache name of the positive control's cell (the checkpoint as trained in L tokens)


def window_starts(tokens: int, length: int, windows: int) -> list[int]:
    """`windows` starts of windows of length + 1 tokens with equal gaps before, between and after them."""
    free = tokens - windows * (length + 1)
    if free < windows + 1:
        raise DataError(f"the text holds {tokens:,} tokens, too few for {windows} windows of {length + 1:,} tokens with "
                        "text around them; use a longer text, fewer --windows or a shorter --length")
    gap = free / (windows + 1)
    return [int(round(gap * (i + 1))) + i * (length + 1) for i in range(windows)]


def text_name(path: Path) -> str:
    return path.stem


def read_text(path: Path, tokenizer) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"--texts {path}: no such file; give local text files (UTF-8), comma-separated")
    return np.asarray(tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False), dtype=np.int64)


class Layout:
    """Where each window of one text starts and where its passages go, kept in OUT/cache/TEXT/layout.json so that
    every invocation scores the same windows (other settings on the same cache are refused)."""

    def __init__(self, out: Path, text: str, ids: np.ndarray, length: int, trained: int, windows: int,
                 distances: list[int], within: list[int], passages: int, seed: int) -> None:
        self.path = out / "cache" / text / "layout.json"
        wanted = {"tokens": int(len(ids)), "length": length, "trained": trained, "windows": windows,
                  "distances": distances, "within": within, "passages": passages, "span": default_span(trained),
                  "seed": seed}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            clash = [key for key, value in wanted.items() if saved["settings"].get(key) != value]
            if clash:
                raise ConfigError(f"{self.path.parent} holds cells of other settings ({', '.join(clash)}: "
                                  f"{[saved['settings'].get(k) for k in clash]}); use the same settings or another --out")
            self.data = saved
            return
        starts, span = window_starts(len(ids), length, windows), wanted["span"]
        self.data = {"settings": wanted, "starts": starts, "placements": [], "positive": []}
        for window in range(windows):
            rng = np.random.default_rng([seed, window])
            self.data["placements"].append([[p.distance, p.first, p.second] for p in
                                            jittered(length, span, distances, passages, rng, second_from=trained)])
            self.data["positive"].append([[p.distance, p.first, p.second] for p in
                                          jittered(trained, span, within, passages, rng)])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data))

    def placements(self, window: int, positive: bool = False) -> list[Placement]:
        return [Placement(*entry) for entry in self.data["positive" if positive else "placements"][window]]


def build_forwards(ids: np.ndarray, start: int, length: int, placements: list[Placement], span: int,
                   seed: list[int]) -> dict:
    """The four windows of one cell (FORWARDS), each (1, length + 1): the passages, the other passages of the control
    and the shuffles drawn from `seed` (the same in every method)."""
    rng = np.random.default_rng(seed)
    probe, control = write_copies(ids, start, length, placements, span, rng)
    shuffled = shuffled_first_copies(control[None], probe[None], placements, span, rng)[0]
    natural = np.asarray(ids[start : start + length + 1], dtype=np.int64)
    return {"natural": natural[None], "probe": probe[None], "control": control[None], "shuffled": shuffled[None]}


BIN = 256  # tokens per bin of the natural window's loss by position


def cell_record(losses: dict[str, np.ndarray], placements: list[Placement], span: int, trained: int) -> dict:
    """What a cell keeps of its forwards' per-token losses: per passage (in the layout's order), the mean loss on
    tokens 2..S of its second copy in the probe, the control and the shuffled control; of the natural window, the
    mean on [0, L) and [L, T) and the mean of every BIN tokens."""
    record: dict = {"passages": {kind: [float(losses[kind][p.scored(span)].mean()) for p in placements]
                                 for kind in ("probe", "control", "shuffled")}}
    if "natural" in losses:
        natural = losses["natural"]
        record["natural"] = {"within": float(natural[:trained].mean()), "past": float(natural[trained:].mean()),
                             "bins": [float(natural[i : i + BIN].mean()) for i in range(0, len(natural), BIN)]}
    return record


class Grid:
    """Computes and caches the cells of one checkpoint."""

    def __init__(self, model, trained: int, length: int, out: Path, amp: torch.dtype | None, step: int) -> None:
        self.model, self.trained, self.length, self.out, self.amp, self.step = model, trained, length, out, amp, step

    def path(self, text: str, window: int, method: str) -> Path:
        return self.out / "cache" / text / f"w{window}" / f"{method}.json"

    @contextlib.contextmanager
    def claim(self, text: str, window: int, method: str) -> Iterator[bool]:
        """True when this process holds the cell's lock and the cell is still to compute; False when it is cached or
        another live process holds it. The lock is the kernel's (flock), so a killed process leaves none behind."""
        path = self.path(text, window, method)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_suffix(".lock")
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield not path.exists()  # checked under the lock: another process may have just written it
            finally:
                lock_path.unlink(missing_ok=True)  # before releasing: a later opener re-checks the cell, written

    def score(self, view, windows: np.ndarray, incremental: bool, prefill: int) -> np.ndarray:
        if incremental:
            return score_incremental(view, windows, prefill, self.amp, step=self.step)[0]
        return score_windows(view, windows, self.amp)[0]

    def compute(self, text: str, ids: np.ndarray, layout: Layout, window: int, method: str) -> None:
        positive = method == POSITIVE
        length = self.trained if positive else self.length
        placements = layout.placements(window, positive)
        start = layout.data["starts"][window]
        settings = layout.data["settings"]
        forwards = build_forwards(ids, start, length, placements, settings["span"],
                                  [settings["seed"], window, int(positive)])
        spec = method_spec(NONE if positive else method)
        view = self.model.under(spec, length, self.trained)
        first_scored = min(p.second for p in placements)
        losses, seconds = {}, {}
        for kind in FORWARDS if not positive else FORWARDS[1:]:
            started = time.perf_counter()
            prefill = self.trained if kind == "natural" else first_scored
            losses[kind] = self.score(view, forwards[kind], spec.incremental, prefill)
            seconds[kind] = time.perf_counter() - started
        record = cell_record(losses, placements, settings["span"], self.trained)
        record.update(seconds=seconds, peak_rss_gib=peak_rss_gib(), paths=view.attention_paths(),
                      dtype="float32" if self.amp is None else "bfloat16", incremental=spec.incremental,
                      step=self.step, reach=reach(view, self.trained))
        path = self.path(text, window, method)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(results_json(record))
        staging.replace(path)
        print(f"{text}/w{window}/{method}: " + ", ".join(f"{kind} {seconds[kind]:.0f} s" for kind in seconds)
              + f" (peak RSS {peak_rss_gib():.1f} GiB)", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.method_grid", __doc__)
    add_checkpoint(parser, "a checkpoint (e.g. scripts.import_hf's runs/smollm2) (required)")
    parser.add_argument("--texts", default="", help="comma-separated local text files (UTF-8), each read whole "
                                                    "(required unless --report-only)")
    parser.add_argument("--length", default="2x", help="the window length T: a multiple of L or a token count")
    parser.add_argument("--windows", type=int, default=8, help="windows per text (intervals over windows)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="inference-time methods (none: as trained)")
    parser.add_argument("--distances", default="0.25x,0.75x,1.25x,1.75x",
                        help="distances between the copies past L: multiples of L or token counts")
    parser.add_argument("--within", default="0.25x,0.75x",
                        help="the positive control's distances, within L (windows of L tokens, as trained)")
    parser.add_argument("--passages", type=int, default=8, help="passages per distance in each window")
    parser.add_argument("--dynamic-step", type=int, default=256,
                        help="tokens per cached forward of dynamic NTK (1: token by token)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the passages and their places")
    parser.add_argument("--minutes", type=float, default=600.0, help="start no new cell after this many minutes")
    parser.add_argument("--report-only", action="store_true", help="compute nothing: write the report from the cache")
    add_device(parser)
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 where native, else float32) | bfloat16 | "
                                                         "float32")
    add_out(parser, "output folder (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()
    args = parse(build_parser(), argv, "checkpoint", "out")
    if args.report_only:
        write_report(args.out, args.checkpoint)
        return 0
    if not args.texts:
        raise ConfigError("--texts: give one or more local text files, comma-separated")
    if args.windows < 1 or args.passages < 1 or args.dynamic_step < 1:
        raise ConfigError("--windows, --passages and --dynamic-step must be at least 1")
    started = time.perf_counter()
    trained = trained_length(args.checkpoint)
    length = resolve_length(args.length, trained)
    distances = sorted({resolve_length(item, trained) for item in comma_list(args.distances)})
    within = sorted({resolve_length(item, trained) for item in comma_list(args.within)})
    span = default_span(trained)
    if length <= trained or max(distances) + span + GAP + lead_tokens(length) > length or max(within) >= trained:
        raise ConfigError(f"--length must exceed L = {trained:,}, every --distances fit in it and every --within "
                          "lie within L")
    methods = [NONE] + [m for m in check_methods(comma_list(args.methods)) if m != NONE]
    device = resolve_device(args.device)
    amp = autocast_dtype(device, args.dtype)
    model = load_model(args.checkpoint, device).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    texts = {text_name(Path(path)): read_text(Path(path), tokenizer) for path in comma_list(args.texts)}
    layouts = {name: Layout(args.out, name, ids, length, trained, args.windows, distances, within, args.passages,
                            args.seed) for name, ids in texts.items()}
    (args.out / "cache").mkdir(parents=True, exist_ok=True)
    grid = Grid(model, trained, length, args.out, amp, args.dynamic_step)
    deadline = started + 60 * args.minutes
    computed = 0
    log_invocation(args.out, "experiments.method_grid", argv, started, computed)
    for window in range(args.windows):  # window by window: an interrupted run has every method on its first windows
        for name, ids in texts.items():
            for method in [POSITIVE, *methods]:
                if grid.path(name, window, method).exists() or time.perf_counter() >= deadline:
                    continue
                with grid.claim(name, window, method) as mine:
                    if mine:
                        grid.compute(name, ids, layouts[name], window, method)
                        computed += 1
                        log_invocation(args.out, "experiments.method_grid", argv, started, computed)
    print(f"{machine()}; {(time.perf_counter() - started) / 60:.1f} min")
    write_report(args.out, args.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
