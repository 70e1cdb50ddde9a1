"""True nulls on the same weights: how often the use rule reads use where there is none by construction.

    python -m experiments.use_null --checkpoint runs/smollm2 --texts path/to/book1.txt,path/to/book2.txt \\
        --length 2x --windows 6 --out runs/use_null

The use grid's windows and layout (experiments/use_grid.py, the same settings), with two forwards per (text, window,
method): the control and a second control (eval.use.null_forwards). Both hold the same second copies; at every first
copy each holds another passage of the text, drawn independently, so no first copy is the passage its second copy
repeats: use = NLL(second control) - NLL(control) is 0 in expectation at every distance, for every method, within the
attention's reach or past it. A null cell is one (text, method, distance) with its windows: the unit the grid's
verdicts read. The report (experiments/use_null_report.py) counts the cells that read "uses" under the one verdict
rule (eval/verdicts.py use_verdicts) with the exact 95% interval of the rate, the cells shown above 0, and the rule's
detection rate where a known use near the margin is added to the same windows.
"""
from __future__ import annotations

from dataclasses import dataclass

from eval.use import GRID_POSITIVE, Placement, null_forwards, score_forwards
from experiments import use_grid
from experiments.engine import Context, Study, option
from experiments.use_null_report import report

DISTANCES = [f"{k / 16:g}x" for k in range(1, 27)]  # 1/16 L to 26/16 L: 26 distances a window


@dataclass
class Settings(use_grid.Settings):
    windows: int = option(6, "windows per text (intervals over windows)")
    passages: int = option(2, "passages per distance in each window")
    methods: list = option(["none", "yarn"], "inference-time methods (none: as trained)")
    distances: list = option(DISTANCES, "distances between the copies: multiples of L or token counts")
    out: str = option("runs/use_null", "the study's folder")


def cells(settings: Settings, context: Context) -> list[dict]:
    """The use grid's cells under these settings, less its positive control, each marked a null cell."""
    return [{**c, "null": True} for c in use_grid.cells(settings, context) if c["method"] != GRID_POSITIVE]


def measure(cell: dict, context: Context) -> dict:
    """The window's control and second control under the cell's method: per passage, the mean loss on tokens 2..S of
    its second copy in each."""
    model, ids, amp = use_grid.inputs(cell, context)
    placements = [Placement(*p) for p in cell["placements"]]
    forwards = null_forwards(ids, cell["start"], cell["length"], placements, cell["span"], [cell["seed"], cell["window"]])
    return score_forwards(model, forwards, cell["length"], cell["trained"], placements, cell["span"], cell["method"],
                          amp, cell.get("step", 1), f"{cell['method']} at {cell['start']:,}",
                          cell.get("lead", []))[0]


STUDY = Study("experiments.use_null", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.use_null"))
