"""The report of experiments.ruler from its records: the grid as k of n with Wilson intervals (and RULER's own score
for vt), by how far back the needle stands, what the responses give, the parity with lm-eval's hf model, the ranking
held against same-weights use (an experiments.use_grid study) by Spearman's rank correlation with Holm over the
readings, and published orderings beside the lab's (experiments/published/ruler_orderings.toml)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from eval.stats import PERMUTATION_DRAWS, Estimate, holm, spearman, spearman_p, wilson_interval
from experiments.engine import Records, key, load_records
from experiments.render import provenance, published, write
from experiments.use_grid_report import name

PARITY = {"hf": "none", "hf-yarn": "yarn"}  # lm-eval's hf model -> the pelab method it is compared with


def full(cell: dict) -> tuple[int, int]:  # (samples answered in full, samples)
    return sum(s["score"] == 1.0 for s in cell["samples"]), len(cell["samples"])


def partial_score(cell: dict) -> Estimate | None:
    """RULER's own score (the share of a sample's answers found, mean over the samples) for a task with several
    answers a sample (vt), with the Wilson 95% interval on the summed score (valid: a score in [0, 1] with mean p
    varies at most as a 0-or-1 one, p(1 - p)); None for one answer, where it is the share answered in full."""
    several = any(len(s["target"]) > 1 for s in cell["samples"] if isinstance(s.get("target"), list))
    return wilson_interval(sum(s["score"] for s in cell["samples"]), len(cell["samples"])) if several else None


def bounds(rate: Estimate) -> str:
    return f"[{rate.low:.2f}, {rate.high:.2f}]"


def score_text(cell: dict) -> str:
    k, n = full(cell)
    partial = partial_score(cell)
    return f"{k}/{n} {bounds(wilson_interval(k, n))}" + ("" if partial is None else
                                                        f"; score {partial.mean:.2f} {bounds(partial)}")


def seconds_text(cell: dict) -> str:  # with how many of its samples an earlier invocation had answered
    earlier = cell.get("from_cache", 0)
    return f"{cell['seconds']:.0f} s" + (f"; {earlier} samples from an earlier run" if earlier else "")


# --------------------------------------------------------------------------------------- the rank correlation

def p_text(p: float) -> str:
    """'0.012', or for a share of random orders of which none reached the observed value, '< 1 / draws'."""
    return f"< {1 / PERMUTATION_DRAWS:.0e}" if p == 0 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


# One number of use per method from text -> distance -> use: the mean over the texts of the mean over the distances
# (RULER spreads its needles over the whole window), and of use at the farthest distance alone.
USE_SUMMARIES = {
    "mean over the distances": lambda by_text: float(np.mean([np.mean(list(d.values())) for d in by_text.values()])),
    "at the farthest distance": lambda by_text: float(np.mean([d[max(d)] for d in by_text.values()])),
}


def needle_shares(cells: list[dict], length: int, task: str | None = None) -> dict[str, float]:
    """method -> the share of needle samples answered in full at `length`: of `task`, or (None) the mean over the
    niah tasks every method with a niah cell there has (no method's share mixes in a task the others were not asked)."""
    rates: dict[str, dict[str, float]] = {}
    for cell in cells:
        if cell["length"] == length and cell["task"].startswith("niah") and task in (None, cell["task"]):
            k, n = full(cell)
            rates.setdefault(cell["method"], {})[cell["task"]] = k / n
    shared = set.intersection(*(set(tasks) for tasks in rates.values())) if rates else set()
    return {method: float(np.mean([tasks[task] for task in sorted(shared)])) for method, tasks in rates.items()
            if shared}


def ruler_readings(cells: list[dict], length: int) -> dict[str, dict[str, float]]:
    """How RULER is read for the correlation with use: the mean over the niah tasks every method was asked (the
    first, the report's ranking) and, where that is more than one task, each of them alone."""
    pooled = needle_shares(cells, length)
    asked = {(c["method"], c["task"]) for c in cells if c["length"] == length}
    tasks = sorted({task for _, task in asked if task.startswith("niah") and all((m, task) in asked for m in pooled)})
    if len(tasks) < 2:
        return {tasks[0] if tasks else "niah": pooled}
    return {"mean over " + " and ".join(tasks): pooled, **{task: needle_shares(cells, length, task) for task in tasks}}


def correlate(readings: dict[str, dict[str, float]], use: dict[str, dict[str, dict[int, float]]]) -> list[dict]:
    """Spearman's rank correlation and its permutation p-value of each reading of RULER (method -> share) against each
    of USE_SUMMARIES, over the methods with both (at least three); `holm`: it survives Holm over the rows at 5%."""
    rows = []
    for ruler_reading, shares in readings.items():
        shared = [m for m in shares if m in use]
        if len(shared) < 3:
            continue
        ruler = [shares[m] for m in shared]
        for summary, read in USE_SUMMARIES.items():
            reading = [read(use[m]) for m in shared]
            rows.append({"ruler_reading": ruler_reading, "use": summary, "methods": shared, "ruler": ruler,
                         "reading": reading, "spearman": spearman(ruler, reading), "p": spearman_p(ruler, reading)})
    for row, survives in zip(rows, holm([row["p"] for row in rows], alpha=0.05)):
        row["holm"] = survives
    return rows


def use_of(folder: str) -> dict[str, dict[str, dict[int, float]]]:
    """method -> text -> distance -> use (mean over windows), from an experiments.use_grid study folder."""
    if not folder:
        return {}
    from experiments import use_grid

    return use_grid.use_by_method(load_records(use_grid.STUDY, Path(folder)))


# ------------------------------------------------------------------------------------- published orderings

def concordance(published: dict[str, float], ours: dict[str, float]) -> tuple[int, int, int]:
    """(pairs of methods ordered alike, ordered oppositely, tied in either) over the methods both score."""
    alike = opposite = tied = 0
    for first, second in itertools.combinations([m for m in published if m in ours], 2):
        sign = np.sign(published[first] - published[second]) * np.sign(ours[first] - ours[second])
        alike, opposite, tied = alike + int(sign > 0), opposite + int(sign < 0), tied + int(sign == 0)
    return alike, opposite, tied


def ordering(scores: dict[str, float], methods: list[str]) -> str:
    """`methods` from the highest score down, "A 3 > B 2 = C 2"."""
    ranked = sorted(methods, key=lambda m: -scores[m])
    text = f"{name(ranked[0])} {scores[ranked[0]]:g}"
    for before, method in zip(ranked, ranked[1:]):
        text += (" = " if scores[method] == scores[before] else " > ") + f"{name(method)} {scores[method]:g}"
    return text


def published_rows(shares: dict[str, float]) -> list[dict]:
    """Each published ordering over the methods the lab has scored too (at least two), with the pairs ordered
    alike."""
    rows = []
    for entry in published("ruler_orderings"):
        methods = [m for m in entry["published"] if m in shares]
        if len(methods) >= 2:
            ours = {m: shares[m] for m in methods}
            alike, opposite, tied = concordance({m: entry["published"][m] for m in methods}, ours)
            rows.append({**entry, "methods": methods, "ours": ours, "alike": alike, "opposite": opposite,
                         "tied": tied})
    return rows


# ------------------------------------------------------------------------------------------------ the tables

def by_distance(cells: list[dict], trained: int) -> list[str]:
    """Each needle cell's samples answered in full, k of n, by how far back their needle stands, in bins of L / 2
    (where same-weights use sees reach; a bin with no sample is left empty)."""
    cells = [c for c in cells if c["samples"] and all("needle_back" in sample for sample in c["samples"])]
    if not cells or trained <= 0:
        return []
    half = max(1, trained // 2)
    bins = [(b * half, (b + 1) * half)
            for b in range(max(s["needle_back"] for c in cells for s in c["samples"]) // half + 1)]
    lines = ["## By how far back the needle stands", "",
             "Each sample's needle (where its answer stands in the prompt), in tokens before the prompt's end; samples "
             f"answered in full, k of n, in bins of L / 2 = {half:,} tokens.", "",
             "| method | task @ length | " + " | ".join(f"{lo:,}-{hi:,} back" for lo, hi in bins) + " |",
             "|---|---|" + "---:|" * len(bins)]
    for cell in sorted(cells, key=lambda c: (c["task"], c["length"], c["method"])):
        inside = [[s for s in cell["samples"] if lo <= s["needle_back"] < hi] for lo, hi in bins]
        lines.append(f"| {name(cell['method'])} | {cell['task']} @ {cell['length']:,} | " + " | ".join(
            f"{sum(s['score'] == 1 for s in found)}/{len(found)}" if found else "" for found in inside) + " |")
    return lines + [""]


VALUES = {"answer": "the answer", "held": "another number the prompt holds", "invented": "a number not in the prompt",
          "none": "no number"}


def value_lines(cells: list[dict]) -> list[str]:
    """What each needle cell's responses give (eval.ruler.response_value), k of n each."""
    cells = sorted([c for c in cells if c["samples"] and all(s.get("value") is not None for s in c["samples"])],
                   key=lambda c: (c["task"], c["length"], name(c["method"])))
    if not cells:
        return []
    lines = ["## What the responses give", "",
             "Each needle sample's response: the answer (RULER's match), else its first number, one the prompt holds "
             "(another needle's value in niah_multikey_2: the needles were read, not which one was asked) or one it "
             "does not, or no number at all; samples of n.", "",
             "| method | task @ length | n | " + " | ".join(VALUES.values()) + " |",
             "|---|---|---:|" + "---:|" * len(VALUES)]
    for cell in cells:
        lines.append(f"| {name(cell['method'])} | {cell['task']} @ {cell['length']:,} | {len(cell['samples'])} | "
                     + " | ".join(str(sum(s["value"] == value for s in cell["samples"])) for value in VALUES) + " |")
    return lines + [""]


def parity_lines(cells: list[dict]) -> list[str]:
    """Each cell of lm-eval's hf model beside the pelab method's on the same samples: the responses identical."""
    found = {(c["method"], c["task"], c["length"]): c for c in cells}
    lines, differing = [], []
    for (model, task, length), theirs in found.items():
        ours = found.get((PARITY.get(model), task, length))
        if ours is None:
            continue
        by_doc = {s["doc_id"]: s for s in theirs["samples"]}
        pairs = [(s, by_doc[s["doc_id"]]) for s in ours["samples"] if s["doc_id"] in by_doc]
        lines.append(f"| {name(ours['method'])} | {task} | {length:,} | {len(pairs)} | "
                     f"{sum(a['response'] == b['response'] for a, b in pairs)} | {score_text(ours)} | "
                     f"{score_text(theirs)} | {seconds_text(ours)} / {seconds_text(theirs)} |")
        differing += [f"- {ours['method']} {task}@{length} sample {a['doc_id']}: pelab {a['response']!r}, hf "
                      f"{b['response']!r}" for a, b in pairs if a["response"] != b["response"]]
    if not lines:
        return []
    return ["## Parity with lm-eval's hf model on the same weights", "",
            "| method | task | length | samples compared | identical responses | pelab | hf | seconds pelab / hf |",
            "|---|---|---:|---:|---:|---:|---:|---:|", *lines, *differing, ""]


def correlation_lines(readings: dict[str, dict[str, float]], correlation: list[dict], longest: int) -> list[str]:
    if not correlation:
        return []
    lines = ["## RULER against same-weights use", "",
             f"Across the {len(correlation[0]['methods'])} methods with both: the share of needle samples answered in "
             f"full at {longest:,} tokens (the mean over the niah tasks every method was asked, and where that is more "
             "than one, each alone) against use in the windows of experiments.use_grid (mean over its texts), read two "
             "ways. Spearman's rank correlation, how often a random pairing of the methods gives one as large "
             f"(one-sided; every order of up to 9 methods, else {PERMUTATION_DRAWS:,} random orders), and whether it "
             f"survives Holm's correction over the {len(correlation)} pairs of readings at 5%:", "",
             "| RULER read as | use read as | Spearman | p | Holm |", "|---|---|---:|---:|---|"]
    lines += [f"| {row['ruler_reading']} | {row['use']} | " + (
        "undefined (one of them constant) | | |" if row["spearman"] is None else
        f"{row['spearman']:+.2f} | {p_text(row['p'])} | {'survives' if row['holm'] else 'does not'} |")
        for row in correlation]
    columns = [row for row in correlation if row["use"] == correlation[0]["use"]]
    lines += ["", "| method | " + " | ".join(f"RULER: {row['ruler_reading']}" for row in columns) + " | "
              + " | ".join(f"use {summary} (nats)" for summary in USE_SUMMARIES) + " |",
              "|---|" + "---:|" * (len(columns) + len(USE_SUMMARIES))]
    for index, method in enumerate(correlation[0]["methods"]):
        ruler = [readings[row["ruler_reading"]].get(method) for row in columns]
        lines.append(f"| {name(method)} | " + " | ".join("" if r is None else f"{r:.2f}" for r in ruler) + " | "
                     + " | ".join(f"{row['reading'][index]:+.3f}" for row in correlation
                                  if row["ruler_reading"] == correlation[0]["ruler_reading"]) + " |")
    return lines + [""]


def published_lines(readings: dict[str, dict[str, float]], longest: int) -> list[str]:
    rows = [{**row, "ruler_reading": reading} for reading, shares in readings.items()
            for row in published_rows(shares)]
    if not rows:
        return []
    lines = ["## Published orderings beside the lab's", "",
             "Each source's scores (as its paper reports them) beside the lab's share of needle samples answered in full "
             f"at {longest:,} tokens (read as in the correlation above), for the methods both have; pairs of methods "
             "the two order alike, oppositely, or tie in either.", "",
             "| source | setting | published | RULER read as | the lab | pairs alike / opposite / tied |",
             "|---|---|---|---|---|---:|"]
    for row in sorted(rows, key=lambda row: row["source"]):
        ours = {m: round(share, 2) for m, share in row["ours"].items()}
        lines.append(f"| {row['source']} | {row['setting']} | {ordering(row['published'], row['methods'])} | "
                     f"{row['ruler_reading']} | {ordering(ours, row['methods'])} | {row['alike']} / "
                     f"{row['opposite']} / {row['tied']} |")
    return lines + [""]


def report(records: Records) -> None:
    """OUT/report.md from whatever cells have records."""
    found = [{**record, "method": cell["model"], "task": cell["task"], "length": cell["length"],
              "set_for": cell["set_for"], "trained": cell["trained"]} for cell, record in records.done()]
    cells = [c for c in found if c["method"] not in PARITY]
    lines = ["# RULER through lm-evaluation-harness (experiments.ruler)", ""]
    if cells:
        machines = sorted({records.stored[key(cell)]["machine"] for cell, _ in records.done()})
        lines += [f"Machine: {'; '.join(machines)}. Methods set for {cells[0]['set_for']:,} tokens; {cells[0]['dtype']}; "
                  "RULER's own task files (lm-eval's), samples generated from the checkpoint's tokenizer (the same for "
                  "every method). Score: samples answered in full, k of n, Wilson 95% interval; for a task with several "
                  "answers a sample (vt), also RULER's own score (the share of its answers found, mean over the "
                  "samples), with the Wilson interval on the summed score; seconds per cell.", ""]
        columns = sorted({(c["task"], c["length"]) for c in cells}, key=lambda column: (column[1], column[0]))
        by = {(c["method"], c["task"], c["length"]): c for c in cells}
        lines += ["| method | " + " | ".join(f"{task} @ {length:,}" for task, length in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for method in dict.fromkeys(c["method"] for c in cells):
            lines.append(f"| {name(method)} | " + " | ".join(
                f"{score_text(by[(method, *column)])} ({seconds_text(by[(method, *column)])})"
                if (method, *column) in by else "" for column in columns) + " |")
        lines += ["", *by_distance(cells, cells[0]["trained"]), *value_lines(cells)]
    lines += parity_lines(found)
    longest = max((c["length"] for c in cells), default=0)
    readings = ruler_readings(cells, longest)
    lines += correlation_lines(readings, correlate(readings, use_of(records.settings.use_results)), longest)
    lines += published_lines(readings, longest)
    if records.missing():
        lines += [f"Not measured yet ({len(records.missing())} cells): "
                  + ", ".join(cell["name"] for cell in records.missing()) + ".", ""]
    seconds = [records.seconds(cell) for cell, _ in records.done()]
    write(records.out, "report.md", "\n".join([*lines, provenance(records.invocations, seconds), ""]))
