"""The true-null study's report from its records (experiments/use_null.py): every null cell with its use and verdict,
the false-positive rate of "uses" with its exact interval, the rate of cells shown above 0, and the detection rate of
a known use added to the same windows; report.md (experiments/render.py writes it).

A null cell: one (text, method, distance), its windows the unit (Student's t 95% over windows). The rule is the one
every report reads (eval/verdicts.py use_verdicts), against the margin's floor (MARGIN_FLOOR, fixed before the data):
the smallest margin the rule ever uses, where a false "uses" is likeliest (a model's own margin is at least this).
"""
from __future__ import annotations

import numpy as np

from eval.stats import Spread, clopper_pearson, p_above_zero, spread
from eval.verdicts import MARGIN_FLOOR, use_verdicts
from experiments.engine import Records
from experiments.render import provenance, write

PLANTED = (1.0, 1.5, 2.0)  # known uses added to every window of every null cell, in margins


def null_cells(records: Records) -> dict[tuple[str, str, int], list[float]]:
    """(text, method, distance) -> each window's use: the mean over its passages of NLL(second control) - NLL(control)
    on their second copies."""
    found: dict[tuple[str, str, int], list[float]] = {}
    for c, record in records.done():
        control, second = (np.asarray(record["passages"][kind]) for kind in ("control", "second_control"))
        for distance in sorted({p[0] for p in c["placements"]}):
            at = [i for i, p in enumerate(c["placements"]) if p[0] == distance]
            found.setdefault((c["text"], c["method"], distance), []).append(float((second[at] - control[at]).mean()))
    return dict(sorted(found.items()))


def count(words: list[str], word: str) -> str:
    found = clopper_pearson(sum(w == word for w in words), len(words))
    return f"{round(found.mean * found.n)} of {found.n} ({found.mean:.1%}, exact 95% [{found.low:.1%}, {found.high:.1%}])"


def report(records: Records) -> None:
    cells = null_cells(records)
    spreads = {key: spread(np.asarray(values)[None, :]) for key, values in cells.items() if len(values) >= 3}
    keys = list(spreads)
    if not keys:
        write(records.out, "report.md", "# True nulls\n\nNo null cell with 3 windows yet.\n")
        return
    family, one_by_one = use_verdicts([spreads[k] for k in keys], MARGIN_FLOOR), \
        [use_verdicts([spreads[k]], MARGIN_FLOOR)[0] for k in keys]
    above = [p_above_zero(spreads[k].mean, spreads[k].se, spreads[k].df) <= 0.025 for k in keys]
    first = records.done()[0][0]
    windows = sorted({len(v) for v in cells.values()})
    distances = sorted({p[0] for p in first["placements"]})
    per = len(first["placements"]) // len(distances)
    lines = [f"# True nulls: the use rule where use is 0 by construction ({first['checkpoint'][:8]}…, "
             f"L = {first['trained']:,}, windows of {first['length']:,} tokens)", "",
             "Each cell: one text, method and distance; use = NLL(second control) - NLL(control) on tokens 2..S of "
             "the second copies, both controls holding another passage at every first copy "
             f"(experiments/use_null.py): 0 in expectation. {len(distances)} distances from {distances[0]:,} to "
             f"{distances[-1]:,} tokens, {per} passage(s) of {first['span']} tokens per distance in each window (the "
             "grid's windows hold 8: these cells are noisier than its, so their detection understates its). "
             "Intervals: Student's t 95% over windows "
             f"({', '.join(map(str, windows))} per cell). The rule: eval/verdicts.py use_verdicts against a margin "
             f"fixed at {MARGIN_FLOOR} nats (the floor, the smallest margin the rule uses).", "",
             "## Rates on the true nulls", "",
             f"- \"uses\", the cells one family (Holm), as every report tests them: {count(family, 'uses')}",
             f"- \"uses\", each cell tested alone (no correction): {count(one_by_one, 'uses')}",
             f"- shown above 0 by the one-sided t test at 2.5%, each cell alone (the test the rule's \"negligible\" "
             f"rests on, expected about 2.5% on nulls): {count(['yes' if a else 'no' for a in above], 'yes')}",
             f"- \"none\" (the interval within +-{MARGIN_FLOOR}), the family: {count(family, 'none')}", "",
             "## Detection of a known use", "",
             "The same windows with a use added to every window's value (the null's noise, a known effect): the share "
             "of cells that read \"uses\". At the margin itself the rule must say \"uses\" at most 2.5% of the time "
             "(its one-sided level); above it, how often it finds the use.", "",
             "| use added | \"uses\", the family (Holm) | \"uses\", each cell alone |", "|---|---|---|"]
    for factor in PLANTED:
        planted = [Spread(spreads[k].mean + factor * MARGIN_FLOOR, spreads[k].se, spreads[k].df) for k in keys]
        lines.append(f"| {factor * MARGIN_FLOOR:.3f} nats ({factor:g} x margin) | "
                     f"{count(use_verdicts(planted, MARGIN_FLOOR), 'uses')} | "
                     f"{count([use_verdicts([p], MARGIN_FLOOR)[0] for p in planted], 'uses')} |")
    lines += ["", "Each cell's windows are in the records (per passage, the two controls' NLL on its second copy)."]
    lines += ["", "## Cost", "", provenance(records.invocations, [records.seconds(c) for c, _ in records.done()]), ""]
    write(records.out, "report.md", "\n".join(lines))
