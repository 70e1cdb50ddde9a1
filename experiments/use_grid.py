"""Harm and use of inference-time methods window by window on one checkpoint (the real model's use grid).

    python -m experiments.use_grid --checkpoint runs/smollm2 --texts path/to/book1.txt,path/to/book2.txt \\
        --length 2x --windows 8 --out runs/use_grid

Texts: local files read whole (UTF-8), each named by its file's stem, each giving --windows windows of T = --length
tokens with equal gaps before, between and after them. In each window its own draw (seeded [seed, window]) of
--passages passages of S tokens (L / 4 within 8..64) per distance (--distances), taken from the text outside the
window, each written twice d apart, each second copy at a random free token past L. The layout (window starts,
placements) is a function of the settings and the text: each cell carries its own. A cell is one (text, window,
method): the four forwards of eval.use.measure_window under the method set for T: natural (harm: the NLL on [0, L)
and [L, T)), probe, control (another passage at each first copy) and shuffled (each first copy's tokens shuffled),
and on tokens 2..S of every second copy use = NLL(control) - NLL(probe), presence = NLL(control) - NLL(shuffled),
order = NLL(shuffled) - NLL(probe). The positive control, a cell per (text, window): the window's first L + 1
tokens as trained with passages at the distances --within L; its use sets the verdicts' margin. Dynamic NTK runs
through the KV cache in chunks of --dynamic-step tokens after a prefill to the first scored token. The window is the
unit: intervals are Student's t 95% over windows (experiments/use_grid_report.py). A window starts with the ids the
checkpoint's tokenizer starts a text with (Gemma's <bos>; none for SmolLM2's), over its first token.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.tokenizer import leading_ids, load_tokenizer
from errors import ConfigError, DataError
from eval.extrapolation import resolve_length
from eval.use import GRID_POSITIVE, Placement, default_span, grid_layout, measure_window, summarise_grid, window_starts
from experiments import use_grid_report
from experiments.engine import STUDY_FILE, Context, Records, Study, load_records, option
from experiments.use_grid_report import load
from model.checkpoint import CONFIG, WEIGHTS, load_model, trained_length
from model.methods import NONE, check_methods, method_spec
from model.runtime import autocast_dtype, configure_runtime, resolve_device


@dataclass
class Settings:
    checkpoint: str = option("", "a checkpoint folder, e.g. scripts.import_hf's runs/smollm2 (required)")
    texts: list = option([], "local text files (UTF-8), each read whole (required)")
    length: str = option("2x", "the window length T: a multiple of L or a token count")
    windows: int = option(8, "windows per text (intervals over windows)")
    methods: list = option(["none", "linear", "ntk", "dynamic", "yarn", "selfextend", "rerope", "string", "dca",
                            "sinks", "logn"], "inference-time methods (none: as trained)")
    distances: list = option(["0.25x", "0.75x", "1.25x", "1.75x"], "distances between the copies: multiples of L or "
                             "token counts")
    within: list = option(["0.25x", "0.75x"], "the positive control's distances, within L (windows of L tokens)")
    passages: int = option(8, "passages per distance in each window")
    dynamic_step: int = option(256, "tokens per cached forward of dynamic NTK (1: token by token)")
    seed: int = option(0, "seed of the passages and their places")
    dtype: str = option("auto", "auto (bfloat16 where native, else float32) | bfloat16 | float32")
    beside: str = option("", "another use grid's folder, on another model: the report sets this grid's ranking of "
                         "methods beside it (experiments/use_transfer.py)")
    out: str = option("runs/use_grid", "the study's folder")


def digest(*paths: Path) -> str:
    """What an input is: the SHA-256 of its files' bytes, first 16 hex digits."""
    found = hashlib.sha256()
    for path in paths:
        found.update(path.read_bytes())
    return found.hexdigest()[:16]


def read_text(path: Path, tokenizer) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"--texts {path}: no such file; give local text files (UTF-8), comma-separated")
    return np.asarray(tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False), dtype=np.int64)


def cells(settings: Settings, context: Context) -> list[dict]:
    """Window by window (a stopped study has every method on its first windows), per text, the positive control and
    each method."""
    if not settings.checkpoint or not settings.texts:
        raise ConfigError("--checkpoint and --texts (local text files, comma-separated) are required")
    if min(settings.windows, settings.passages, settings.dynamic_step) < 1:
        raise ConfigError("--windows, --passages and --dynamic-step must be at least 1")
    if settings.beside and not (Path(settings.beside) / STUDY_FILE).exists():
        raise ConfigError(f"--beside {settings.beside}: no study there (no {STUDY_FILE}); give another use grid's --out")
    folder = Path(settings.checkpoint)
    trained = trained_length(folder)
    length = resolve_length(str(settings.length), trained)
    distances, within = (sorted({resolve_length(str(item), trained) for item in items})
                         for items in (settings.distances, settings.within))
    span = default_span(trained)
    methods = [NONE] + [m for m in check_methods(settings.methods) if m != NONE]
    layout = grid_layout(length, trained, settings.windows, distances, within, settings.passages, span, settings.seed)
    tokenizer, checkpoint = load_tokenizer(folder), digest(folder / WEIGHTS, folder / CONFIG)
    lead = leading_ids(tokenizer)  # a tokenizer that starts a text with <bos> (Gemma's) starts each window with it
    texts = {Path(path).stem: (path, len(read_text(Path(path), tokenizer)), digest(Path(path)))
             for path in map(str, settings.texts)}
    starts = {text: window_starts(tokens, length, settings.windows) for text, (_, tokens, _) in texts.items()}
    found = []
    for window in range(settings.windows):
        for text, (path, tokens, text_digest) in texts.items():
            for method in [GRID_POSITIVE, *methods]:
                positive = method == GRID_POSITIVE
                cell = {"name": f"{text}/w{window}/{method}", "checkpoint": checkpoint, "trained": trained,
                        "text": text, "text_digest": text_digest, "tokens": tokens, "window": window,
                        "start": starts[text][window], "method": method, "length": trained if positive else length,
                        "span": span, "placements": [[p.distance, p.first, p.second] for p in layout[window][int(positive)]],
                        "seed": settings.seed, "dtype": settings.dtype,
                        "local": {"checkpoint": settings.checkpoint, "text": path}}
                if not positive and method_spec(method).incremental:
                    cell["step"] = settings.dynamic_step
                if lead:  # only then: a tokenizer without one declares the cells it always did
                    cell["lead"] = lead
                found.append(cell)
    return found


def inputs(cell: dict, context: Context) -> tuple:
    """(model, text ids, autocast dtype) of a cell, after checking that its checkpoint and text are the ones it was
    declared on."""
    configure_runtime()
    folder, path = Path(cell["local"]["checkpoint"]), Path(cell["local"]["text"])
    if digest(folder / WEIGHTS, folder / CONFIG) != cell["checkpoint"] or digest(path) != cell["text_digest"]:
        raise ConfigError(f"{folder} or {path} is not the checkpoint and text this cell was declared on: run the "
                          "study again to declare its cells")
    device = resolve_device(context.device)
    return (load_model(folder, device).eval(), read_text(path, load_tokenizer(folder)),
            autocast_dtype(device, cell["dtype"]))


def measure(cell: dict, context: Context) -> dict:
    """The cell's window under its method (the positive control: as trained, in a window of L): eval.use."""
    model, ids, amp = inputs(cell, context)
    positive = cell["method"] == GRID_POSITIVE
    return measure_window(model, ids, cell["start"], cell["length"], cell["trained"],
                          [Placement(*p) for p in cell["placements"]], cell["span"],
                          [cell["seed"], cell["window"], int(positive)], NONE if positive else cell["method"], amp,
                          cell.get("step", 1), natural=not positive, lead=cell.get("lead", []))


def use_by_method(records: Records) -> dict[str, dict]:
    """method -> text -> distance (tokens) -> use in nats, the mean over the windows measured, at every distance of
    the grid (within L too), for each method with a record (not the positive control): what RULER's rank correlation
    reads (experiments/ruler.py)."""
    found: dict[str, dict] = {}
    for text, entry in summarise_grid(load(records))["texts"].items():
        for method, by_distance in entry["methods"].items():
            for distance in entry["distances"]:
                if "mean" in by_distance[distance]["use"]:
                    found.setdefault(method, {}).setdefault(text, {})[distance] = by_distance[distance]["use"]["mean"]
    return found


def report(records: Records) -> None:
    """use_grid_report's, with the grid of --beside beside it."""
    beside = records.settings.beside
    use_grid_report.report(records, load_records(STUDY, Path(beside)) if beside else None)


STUDY = Study("experiments.use_grid", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.use_grid"))
