"""The report of experiments.ruler: the grid as k of n with Wilson intervals, the parity with lm-eval's hf model, and
the ranking held against same-weights use (experiments.method_grid's results) by Spearman's rank correlation."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from commands import results_json
from eval.stats import Estimate, draws_interval, holm, wilson_interval
from experiments.method_grid_report import name
from experiments.real_model import machine

PARITY = {"hf": "none", "hf-yarn": "yarn"}  # lm-eval's hf model -> the pelab method it is compared with


def load_cells(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((out / "cells").glob("*/*@*.json"))]


def full(cell: dict) -> tuple[int, int]:
    """(samples answered in full, samples)."""
    return sum(s["score"] == 1.0 for s in cell["samples"]), len(cell["samples"])


def partial_score(cell: dict) -> Estimate | None:
    """RULER's own score (string_match_all: the share of a sample's answers found, averaged over the samples) for a
    task with several answers per sample (vt), with the Wilson 95% interval on the summed score: a score in [0, 1]
    with mean p varies at most as a 0-or-1 one does, p(1 - p), so the interval is valid for it; None for one answer,
    where it is the share answered in full."""
    if not any(len(s["target"]) > 1 for s in cell["samples"] if isinstance(s.get("target"), list)):
        return None
    return wilson_interval(sum(s["score"] for s in cell["samples"]), len(cell["samples"]))


def bounds(rate: Estimate) -> str:
    return f"[{rate.low:.2f}, {rate.high:.2f}]"


def score_text(cell: dict) -> str:
    k, n = full(cell)
    text = f"{k}/{n} {bounds(wilson_interval(k, n))}"
    partial = partial_score(cell)
    return text if partial is None else text + f"; score {partial.mean:.2f} {bounds(partial)}"


def seconds_text(cell: dict) -> str:
    """The cell's seconds, and how many of its samples an earlier invocation had already answered."""
    earlier = cell.get("from_cache", 0)
    return f"{cell['seconds']:.0f} s" + (f"; {earlier} samples from an earlier run" if earlier else "")


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    values = np.asarray(values, dtype=float)
    order = values.argsort(kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties at their mean rank); None when either is constant."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


PERMUTATION_DRAWS = 200_000


def p_text(p: float) -> str:
    """'= 0.012', or for a share of random orders of which none reached the observed value, '< 1 / draws'."""
    return f"< {1 / PERMUTATION_DRAWS:.0e}" if p == 0 else f"= {p:.3f}" if p >= 0.001 else f"= {p:.1e}"


def spearman_p(a: list[float], b: list[float], draws: int = PERMUTATION_DRAWS, seed: int = 0) -> float | None:
    """One-sided p-value of Spearman's rank correlation being as large as observed when the pairing is random: the
    share of the orders of `b`'s ranks (ties kept at their mean rank) whose correlation with `a`'s ranks is at least
    the observed one. Every order for up to 9 methods (9! = 362,880), else `draws` random ones."""
    observed = spearman(a, b)
    if observed is None:
        return None
    ra, rb = ranks(a), ranks(b)
    if len(rb) <= 9:
        orders = np.array(list(itertools.permutations(range(len(rb)))))
    else:
        generator = np.random.default_rng(seed)
        orders = np.argsort(generator.random((draws, len(rb))), axis=1)
    shuffled = rb[orders]
    centred_a = ra - ra.mean()
    centred = shuffled - shuffled.mean(axis=1, keepdims=True)
    rho = centred @ centred_a / (np.linalg.norm(centred, axis=1) * np.linalg.norm(centred_a))
    return float(np.mean(rho >= observed - 1e-12))


def concordance(published: dict[str, float], ours: dict[str, float]) -> tuple[int, int, int]:
    """(pairs of methods ordered alike, ordered oppositely, tied in either) over the methods both score."""
    shared = [m for m in published if m in ours]
    alike = opposite = tied = 0
    for first, second in itertools.combinations(shared, 2):
        sign = np.sign(published[first] - published[second]) * np.sign(ours[first] - ours[second])
        alike, opposite, tied = alike + int(sign > 0), opposite + int(sign < 0), tied + int(sign == 0)
    return alike, opposite, tied


def parity_rows(cells: list[dict]) -> list[dict]:
    found = {(c["method"], c["task"], c["length"]): c for c in cells}
    rows = []
    for hf, method in PARITY.items():
        for (model, task, length), cell in found.items():
            ours = found.get((method, task, length))
            if model != hf or ours is None:
                continue
            theirs = {s["doc_id"]: s for s in cell["samples"]}
            pairs = [(s, theirs[s["doc_id"]]) for s in ours["samples"] if s["doc_id"] in theirs]
            rows.append({"method": method, "task": task, "length": length, "compared": len(pairs),
                         "identical": sum(a["response"] == b["response"] for a, b in pairs),
                         "differing": [{"doc_id": a["doc_id"], "pelab": a["response"], "hf": b["response"]}
                                       for a, b in pairs if a["response"] != b["response"]],
                         "pelab": score_text(ours), "hf": score_text(cell),
                         "seconds": {"pelab": seconds_text(ours), "hf": seconds_text(cell)}})
    return rows


def use_by_method(use_results: Path | None) -> dict[str, dict[str, dict[int, float]]]:
    """method -> text -> distance -> use (mean over windows), from experiments.method_grid's results.json."""
    if use_results is None or not use_results.exists():
        return {}
    summary = json.loads(use_results.read_text())["summary"]
    found: dict[str, dict[str, dict[int, float]]] = {}
    for text, entry in summary["texts"].items():
        for method, cells in entry["methods"].items():
            for distance in entry["settings"]["distances"]:
                use = cells.get(str(distance), {}).get("use", {})
                if "mean" in use:
                    found.setdefault(method, {}).setdefault(text, {})[int(distance)] = use["mean"]
    return found


# How one number of use per method is read from its cells (text -> distance -> use): the mean over the texts of the
# mean over the window's distances (RULER places its needles at depths spread over the whole window), and of use at
# the farthest distance alone.
USE_SUMMARIES = {
    "mean over the distances": lambda by_text: float(np.mean([np.mean(list(d.values())) for d in by_text.values()])),
    "at the farthest distance": lambda by_text: float(np.mean([d[max(d)] for d in by_text.values()])),
}


def answered(sample: dict) -> bool:
    """A cell's sample answered in full, or a teacher-forced sample whose every answer token was the argmax."""
    return sample["greedy"] if "greedy" in sample else sample["score"] == 1


def by_distance(cells: list[dict], trained: int, title: str = "## By how far back the needle stands",
                what: str = "samples answered in full") -> list[str]:
    """Lines of a table: each needle cell's samples answered, k of n, by how far back their needle stands, in bins
    of L / 2 (where same-weights use sees reach; a bin with no sample is left empty)."""
    cells = [c for c in cells if all("needle_back" in sample for sample in c["samples"]) and c["samples"]]
    if not cells or trained <= 0:
        return []
    half = max(1, trained // 2)
    top = max(sample["needle_back"] for c in cells for sample in c["samples"]) // half + 1
    bins = [(b * half, (b + 1) * half) for b in range(top)]
    lines = [title, "",
             f"Each sample's needle (where its answer stands in the prompt), in tokens before the prompt's end; {what}, "
             "k of n, in bins of L / 2 = " + f"{half:,} tokens.", "",
             "| method | task @ length | " + " | ".join(f"{lo:,}-{hi:,} back" for lo, hi in bins) + " |",
             "|---|---|" + "---:|" * len(bins)]
    for cell in sorted(cells, key=lambda c: (c["task"], c["length"])):
        counts = []
        for lo, hi in bins:
            inside = [s for s in cell["samples"] if lo <= s["needle_back"] < hi]
            counts.append(f"{sum(answered(s) for s in inside)}/{len(inside)}" if inside else "")
        cue = " (needle cue)" if cell.get("cue") == "needle" else ""
        lines.append(f"| {name(cell['method'])}{cue} | {cell['task']} @ {cell['length']:,} | " + " | ".join(counts)
                     + " |")
    return lines + [""]


VALUES = {"answer": "the answer", "held": "another number the prompt holds", "invented": "a number not in the prompt",
          "none": "no number"}


def first_number(response: str) -> str | None:
    found = re.search(r"\d+", response)
    return found.group() if found else None


def digit_match(cell: dict, digit: int, of_answer: int) -> tuple[int, int, float] | None:
    """Of the cell's samples whose response misses a numeric answer but gives a number of more than `digit` digits:
    how many have at that digit (from 0) the answer's digit `of_answer`, of how many, and the chance of it: the rate
    at which the same numbers have there that digit of another sample's answer in the cell (the same responses
    against needles they did not see; the prompts hold no other digits). None without such samples."""
    samples = [(s["target"][0], number) for s in cell["samples"] if s.get("value") in ("held", "invented")
               and len(number := first_number(s["response"]) or "") > digit and len(s["target"][0]) > of_answer]
    answers = [s["target"][0] for s in cell["samples"] if len(s["target"][0]) > of_answer]
    if not samples or len(set(answers)) < 2:
        return None
    right = sum(number[digit] == answer[of_answer] for answer, number in samples)
    others = [number[digit] == other[of_answer] for answer, number in samples for other in answers if other != answer]
    return right, len(samples), sum(others) / len(others)


# (the response's digit, the answer's digit it is held against), from 0: its first digit against the answer's
# first, then its second against each of the answer's second to fifth. A copy that reads the needle in order but
# steps s tokens at a time gives the answer's digits 1, 1 + s, ...
DIGIT_READINGS = [(0, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
ORDINAL = ["1st", "2nd", "3rd", "4th", "5th"]


def digit_text(right: int, of: int, chance: float) -> str:
    return f"{right}/{of} {bounds(wilson_interval(right, of))} ({chance:.2f})"


def value_lines(cells: list[dict]) -> list[str]:
    """Lines of two tables: what each needle cell's responses give (experiments.ruler.response_value), k of n each;
    and, where they give wrong numbers, which of the answer's digits those hold where (digit_match)."""
    cells = sorted([c for c in cells if c["samples"] and all(s.get("value") is not None for s in c["samples"])],
                   key=lambda c: (c["task"], c["length"], name(c["method"])))
    if not cells:
        return []
    lines = ["## What the responses give", "",
             "Each needle sample's response: the answer (RULER's match), else its first number, one the prompt holds "
             "(another needle's value in niah_multikey_2: the needles were read, not which one was asked) or one it "
             "does not, or no number at all; samples of n.", "",
             "| method | task @ length | n | " + " | ".join(VALUES.values()) + " |", "|---|---|---:|" + "---:|" * len(VALUES)]
    for cell in cells:
        counts = [sum(s["value"] == value for s in cell["samples"]) for value in VALUES]
        lines.append(f"| {name(cell['method'])} | {cell['task']} @ {cell['length']:,} | {len(cell['samples'])} | "
                     + " | ".join(str(count) for count in counts) + " |")
    rows = []
    for cell in cells:
        readings = [digit_match(cell, *reading) for reading in DIGIT_READINGS]
        if readings[0] is not None and cell["task"] == "niah_single_1":
            rows.append(f"| {name(cell['method'])} | {cell['task']} @ {cell['length']:,} | " + " | ".join(
                "" if r is None else digit_text(*r) for r in readings) + " |")
    if rows:
        lines += ["", "Where the responses give a wrong number (niah_single_1, whose prompts hold no digit but the "
                  "needle's): how many hold the answer's digits, k of m with the Wilson 95% interval, and chance in "
                  "parentheses (the same numbers against the cell's other answers). A copy of the needle in order gives the answer's 2nd digit "
                  "second; one that steps s tokens at a time, its (1 + s)th.", "",
                  "| method | task @ length | 1st digit the answer's 1st | " + " | ".join(
                      f"2nd digit the answer's {ORDINAL[answer]}" for _, answer in DIGIT_READINGS[1:]) + " |",
                  "|---|---|" + "---:|" * len(DIGIT_READINGS)] + rows
    return lines + [""]


def forced_lines(forced: list[dict], cells: list[dict], trained: int) -> list[str]:
    """The teacher-forced answers beside the generated ones: reading the needle against generating the answer."""
    if not forced:
        return []
    generated = {(c["method"], c["task"], c["length"]): c for c in cells}
    lines = ["## The answer teacher-forced", "",
             "Each sample's answer scored after its prompt (`--forced`): counted when every answer token is the "
             "model's most likely token given the prompt and the answer tokens before it; the gain is the answer's "
             "log-probability minus that of a control answer of the same shape that the prompt does not hold (the "
             "needle's own same-weights use), mean over the samples with its t 95% interval (each sample its own "
             "haystack and needle). A method that reads the needle but cannot generate past L shows a gain and "
             "fails the cell.", "",
             "The cue: the task's own question, or the question followed by the needle's own words before its "
             "answer (`--cue needle`: the answer a verbatim copy, as a copied passage is for use).", "",
             "| method | task @ length | cue | teacher-forced | gain over the control (nats) | generated (the cell) | "
             "seconds |", "|---|---|---|---:|---:|---:|---:|"]
    for record in forced:
        k, n = sum(answered(s) for s in record["samples"]), len(record["samples"])
        gain = draws_interval([s["gain"] for s in record["samples"] if "gain" in s])
        cell = generated.get((record["method"], record["task"], record["length"]))
        lines.append(f"| {name(record['method'])} | {record['task']} @ {record['length']:,} | "
                     f"{record.get('cue', 'question')} | {k}/{n} {bounds(wilson_interval(k, n))} | {gain.format(signed=True) if gain else ''} | "
                     f"{score_text(cell) if cell else ''} | {record.get('seconds', 0):.0f} |")
    return lines + [""] + by_distance(forced, trained, "### Teacher-forced, by how far back the needle stands",
                                      "samples whose answer is the argmax")


# Published orderings of training-free methods on needle retrieval past the trained length, by the lab's method names.
PUBLISHED = [
    {"source": "DroPE (arXiv 2512.12167), Table 2", "setting": "SmolLM-360M (L = 2,048), NIAH at 2x, zero-shot",
     "published": {"yarn": 48.25, "ntk": 29.84, "linear": 0.0, "none": 0.0}},
    {"source": "STRING (arXiv 2410.18745), Table 1",
     "setting": "4-needle NIAH at each model's L, at least 2 of 4 found, mean of 7 models",
     "published": {"string": 85.7, "dca": 73.1, "yarn": 70.5, "selfextend": 69.6, "none": 67.8, "ntk": 67.6,
                   "rerope": 67.3}},
    {"source": "Lu et al. (arXiv 2409.12181), Table 1", "setting": "Llama-2-7B, 4k -> 32k, needle at 32k, frozen",
     "published": {"selfextend": 25.8, "lm_infinite": 23.9, "ntk": 18.8}},
]


def needle_shares(cells: list[dict], length: int, task: str | None = None) -> dict[str, float]:
    """method -> the share of needle samples answered in full at `length`: of `task` alone, or (None) the mean over
    the niah tasks that every method with a niah cell there has (so that no method's share mixes in a task the
    others were not asked)."""
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
    """Spearman's rank correlation, with its permutation p-value, of each reading of RULER (method -> share) against
    each summary of use (USE_SUMMARIES), over the methods with both (none under three); `holm`: whether it survives
    Holm's correction over every pair of readings tested, one-sided at 5%."""
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
    for entry in PUBLISHED:
        methods = [m for m in entry["published"] if m in shares]
        if len(methods) < 2:
            continue
        ours = {m: shares[m] for m in methods}
        alike, opposite, tied = concordance({m: entry["published"][m] for m in methods}, ours)
        rows.append({**entry, "methods": methods, "ours": ours, "alike": alike, "opposite": opposite, "tied": tied})
    return rows


def write_report(out: Path, use_results: Path | None = None, length: int | None = None,
                 trained: int = 0) -> dict[str, Any]:
    cells = [c for c in load_cells(out) if c["method"] not in PARITY]
    parity = parity_rows(load_cells(out))
    lines = ["# RULER through lm-evaluation-harness (experiments.ruler)", ""]
    if cells:
        first = cells[0]
        lines += [f"Machine: {machine()}. Methods set for {first['set_for']:,} tokens; {first['dtype']}; RULER's "
                  "own task files (lm-eval's), samples generated from the checkpoint's tokenizer (the same for every "
                  "method). Score: samples answered in full, k of n, Wilson 95% interval; for a task with several answers "
                  "a sample (vt), also RULER's own score (the share of its answers found, mean over the samples), "
                  "with the Wilson interval on the summed score; seconds per cell.", ""]
        columns = sorted({(c["task"], c["length"]) for c in cells}, key=lambda key: (key[1], key[0]))
        by = {(c["method"], c["task"], c["length"]): c for c in cells}
        lines += ["| method | " + " | ".join(f"{task} @ {length:,}" for task, length in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for method in dict.fromkeys(c["method"] for c in cells):
            lines.append(f"| {name(method)} | " + " | ".join(
                f"{score_text(by[(method, *col)])} ({seconds_text(by[(method, *col)])})" if (method, *col) in by
                else "" for col in columns) + " |")
        lines.append("")
        lines += by_distance(cells, trained)
        lines += value_lines(cells)
    forced = [{"method": path.parent.name, **json.loads(path.read_text())}
              for path in sorted(out.glob("forced*/*/*@*.json"))]
    lines += forced_lines(forced, cells, trained)
    if parity:
        lines += ["## Parity with lm-eval's hf model on the same weights", "",
                  "| method | task | length | samples compared | identical responses | pelab | hf | seconds pelab / hf |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in parity:
            lines.append(f"| {name(row['method'])} | {row['task']} | {row['length']:,} | {row['compared']} | "
                         f"{row['identical']} | {row['pelab']} | {row['hf']} | {row['seconds']['pelab']} / "
                         f"{row['seconds']['hf']} |")
        for row in parity:
            for sample in row["differing"]:
                lines.append(f"- {row['method']} {row['task']}@{row['length']} sample {sample['doc_id']}: pelab "
                             f"{sample['pelab']!r}, hf {sample['hf']!r}")
        lines.append("")
    longest = length or max((c["length"] for c in cells), default=0)
    readings = ruler_readings(cells, longest)
    correlation = correlate(readings, use_by_method(use_results))
    if correlation:
        lines += ["## RULER against same-weights use", "",
                  f"Across the {len(correlation[0]['methods'])} methods with both: the share of needle samples "
                  f"answered in full at {longest:,} tokens (the mean over the niah tasks every method was asked, and "
                  "where that is more than one, each alone) against use in the windows of experiments.method_grid "
                  "(mean over its texts), read two ways. Spearman's rank correlation, how often a random pairing of "
                  "the methods gives one as large (one-sided; every order of up to 9 methods, else "
                  f"{PERMUTATION_DRAWS:,} random orders), and whether it survives Holm's correction over the "
                  f"{len(correlation)} pairs of readings at 5%:", "",
                  "| RULER read as | use read as | Spearman | p | Holm |", "|---|---|---:|---:|---|"]
        lines += [f"| {row['ruler_reading']} | {row['use']} | " + (
            "undefined (one of them constant) | | |" if row["spearman"] is None else
            f"{row['spearman']:+.2f} | {p_text(row['p']).removeprefix('= ')} | {'survives' if row['holm'] else 'does not'} |")
            for row in correlation]
        columns = [row for row in correlation if row["use"] == correlation[0]["use"]]
        methods = correlation[0]["methods"]
        lines += ["", "| method | " + " | ".join(f"RULER: {row['ruler_reading']}" for row in columns) + " | " +
                  " | ".join(f"use {summary} (nats)" for summary in USE_SUMMARIES) + " |",
                  "|---|" + "---:|" * (len(columns) + len(USE_SUMMARIES))]
        for index, method in enumerate(methods):
            ruler = [readings[row["ruler_reading"]].get(method) for row in columns]
            lines.append(f"| {name(method)} | " + " | ".join("" if r is None else f"{r:.2f}" for r in ruler) + " | "
                         + " | ".join(f"{row['reading'][index]:+.3f}" for row in correlation
                                      if row["ruler_reading"] == correlation[0]["ruler_reading"]) + " |")
        lines.append("")
    published = [{**row, "ruler_reading": reading} for reading, reading_shares in readings.items()
                 for row in published_rows(reading_shares)]
    if published:
        lines += ["## Published orderings beside the lab's", "",
                  f"Each source's scores (as its paper reports them) beside the lab's share of needle samples answered "
                  f"in full at {longest:,} tokens (read as in the correlation above), for the methods both have; pairs "
                  "of methods the two order alike, oppositely, or tie in either.", "",
                  "| source | setting | published | RULER read as | the lab | pairs alike / opposite / tied |",
                  "|---|---|---|---|---|---:|"]
        for row in sorted(published, key=lambda row: row["source"]):
            ours = {m: round(share, 2) for m, share in row["ours"].items()}
            lines.append(f"| {row['source']} | {row['setting']} | {ordering(row['published'], row['methods'])} | "
                         f"{row['ruler_reading']} | {ordering(ours, row['methods'])} | {row['alike']} / "
                         f"{row['opposite']} / {row['tied']} |")
        lines.append("")
    results = {"cells": cells, "forced": forced, "parity": parity, "correlation": correlation,
               "published": published}
    (out / "results.json").write_text(results_json(results))
    (out / "report.md").write_text("\n".join(lines))
    return results
