"""RULER's synthetic tasks through lm-evaluation-harness for every inference-time method of one checkpoint: a grid of
(model, task, length) cells, and the parity of pelab's model with lm-eval's own hf model on the same weights.

    make ruler-deps
    python -m experiments.ruler --checkpoint runs/smollm2 --methods none,yarn,selfextend \\
        --tasks niah_single_1,niah_multikey_2 --lengths 4096,16384 --set-for 16384 --samples 20 --out runs/ruler
    python -m experiments.ruler --checkpoint runs/smollm2 --parity runs/smollm2_hf --parity-yarn true \\
        --tasks niah_single_1 --lengths 4096 --set-for 16384 --samples 20 --dtype float32 --out runs/ruler_parity

A cell runs lm-eval's own task file unchanged on the task's first `samples` samples (or, in a grid block with
`first`, `samples` of them from that one on) at that length (generated from
the checkpoint's tokenizer: the same for every method), the method set for set_for tokens, so PI, NTK and YaRN at 4k
are the 16k setting's cost within L (eval/ruler.py). Its record: each sample's target, response, score, prompt tokens
and, for a needle task, how far back its needle stands and what its response gives; the seconds. lm-eval's response
cache (OUT/work/cache/KEY) lets an interrupted cell continue. ruler.grid adds blocks of cells, each a product, to
methods x tasks x lengths (configs/ruler.toml's presets). ruler.parity (scripts.export_hf's folder of the checkpoint)
adds lm-eval's hf model on it ("hf"); parity_yarn adds YaRN and the hf model with YaRN at set_for / L ("hf-yarn").
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from errors import ConfigError
from eval.ruler import language_model, run_task, yarn_folder  # lm-eval itself loads in them: make ruler-deps
from experiments.engine import STUDY_FILE, Context, Study, key, option
from experiments.ruler_report import PARITY, report
from experiments.use_grid import digest
from model.checkpoint import CONFIG, WEIGHTS, trained_length
from model.methods import NONE, check_methods

BLOCK = ["lengths", "methods", "tasks"]
MORE = {"first", "samples"}  # a block's own samples: `samples` of them from the task's sample `first` on


@dataclass
class Settings:
    checkpoint: str = option("", "a checkpoint with its tokenizer (required)")
    methods: list = option([NONE], "inference-time methods (none: as trained)")
    tasks: list = option(["niah_single_1", "niah_multikey_2", "ruler_vt"], "lm-eval task names (RULER's synthetic ones)")
    lengths: list = option([4096, 8192, 16384], "RULER's max_seq_lengths, one cell each")
    grid: list = option([], "more blocks of cells, each a table {methods, tasks, lengths} (and, to add samples to "
                             "cells declared already, first and samples: the task's samples first to first + samples - 1)")
    set_for: int = option(0, "the length every method is set for (0: the longest length)")
    samples: int = option(20, "samples per cell (the task's first)")
    dtype: str = option("auto", "auto | bfloat16 | float32")
    parity: str = option("", "a transformers folder of the same weights (scripts.export_hf): lm-eval's hf model too")
    parity_yarn: bool = option(False, "with parity: YaRN too, pelab's method against the folder's rope_parameters")
    use_results: str = option("", "an experiments.use_grid folder on the same checkpoint: the rank correlation of "
                              "RULER at the longest length with same-weights use")
    out: str = option("runs/ruler", "the study's folder")

    def __post_init__(self) -> None:
        if any(not isinstance(block, dict) or sorted(set(block) - MORE) != BLOCK for block in self.grid):
            raise ConfigError(f"ruler.grid: each block is a table of {BLOCK} (and optionally {sorted(MORE)}), "
                              f"got {self.grid!r}")
        check_methods([method for methods, *_ in self.blocks() for method in methods])
        counts = [n for *_, lengths, _, samples in self.blocks() for n in [*lengths, samples]]
        firsts = [first for *_, first, _ in self.blocks()]
        if any(not isinstance(n, int) or n < 1 for n in counts) or any(
                not isinstance(n, int) or n < 0 for n in firsts) or self.set_for < 0 or (
                self.dtype not in ("auto", "bfloat16", "float32")):
            raise ConfigError("ruler: lengths and samples positive integers, first >= 0, set_for >= 0, dtype auto, "
                              "bfloat16 or float32")
        if self.parity_yarn and not self.parity:
            raise ConfigError("ruler.parity_yarn compares with the hf folder of ruler.parity: give it too")

    def blocks(self) -> list[tuple[list, list, list, int, int]]:
        """(methods, tasks, lengths, first sample, samples) of each block, the settings' own first."""
        return [(self.methods, self.tasks, self.lengths, 0, self.samples)] + [
            (b["methods"], b["tasks"], b["lengths"], b.get("first", 0), b.get("samples", self.samples))
            for b in self.grid]


def cells(settings: Settings, context: Context) -> list[dict]:
    """One cell per (model, task, length) of each block; a model: a method, or a parity model (PARITY, and YaRN). A
    block of other samples than the settings' (first, samples) makes cells of their own, named with their range (the
    report pools a model's samples of one task and length); a cell from sample 0 has no `first`, as before it
    could be set."""
    if not settings.checkpoint:
        raise ConfigError("ruler.checkpoint: a checkpoint folder is required (--checkpoint PATH)")
    if settings.use_results and not (Path(settings.use_results) / STUDY_FILE).exists():
        raise ConfigError(f"ruler.use_results: {settings.use_results} holds no experiments.use_grid study")
    folder = Path(settings.checkpoint)
    common = {"trained": trained_length(folder), "checkpoint": digest(folder / WEIGHTS, folder / CONFIG),
              "set_for": settings.set_for or max(max(lengths) for _, _, lengths, *_ in settings.blocks()),
              "dtype": settings.dtype}
    local, hf, parity = {"checkpoint": settings.checkpoint}, {}, []
    if settings.parity:
        local["hf"], parity = settings.parity, ["hf", "yarn", "hf-yarn"] if settings.parity_yarn else ["hf"]
        hf = {"hf_checkpoint": digest(Path(settings.parity) / WEIGHTS, Path(settings.parity) / CONFIG)}
    found: dict[str, dict] = {}
    for methods, tasks, lengths, first, samples in settings.blocks():
        span = {"samples": samples, **({"first": first} if first else {})}
        own = "" if (first, samples) == (0, settings.samples) else f"[{first}:{first + samples}]"
        for model, task, length in itertools.product(dict.fromkeys([*methods, *parity]), tasks, lengths):
            name = f"{model}/{task}@{length}{own}"
            found.setdefault(name, {"name": name, "model": model, "task": task, "length": length, **common, **span,
                                    **(hf if model in PARITY else {}), "local": local})
    return list(found.values())


def measure(cell: dict, context: Context) -> dict:
    """One cell through lm_eval.simple_evaluate (eval/ruler.py): its samples, seconds and precision."""
    checkpoint, hf = cell["local"]["checkpoint"], cell["local"].get("hf")
    if digest(Path(checkpoint) / WEIGHTS, Path(checkpoint) / CONFIG) != cell["checkpoint"]:
        raise ConfigError(f"{checkpoint} is not the checkpoint this cell was declared on: run the study again")
    if cell["model"] == "hf-yarn":
        hf = str(yarn_folder(Path(hf), cell["set_for"] / cell["trained"], cell["trained"], context.work))
    lm, precision = language_model(checkpoint, cell["model"], cell["set_for"], max(cell["set_for"], cell["length"]),
                                   cell["dtype"], context.device, hf if cell["model"] in PARITY else None)
    record = run_task(lm, checkpoint, cell["task"], cell["length"], cell["samples"], context.work / "cache" / key(cell),
                      cell.get("first", 0))
    return {**record, "dtype": precision}


STUDY = Study("experiments.ruler", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.ruler"))
