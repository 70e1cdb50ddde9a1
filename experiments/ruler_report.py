"""The report of experiments.ruler from its records: the grid as k of n with Wilson intervals (and RULER's own score
for vt), by how far back the needle stands, what the responses give, the parity with lm-eval's hf model, the ranking
held against same-weights use (an experiments.use_grid study) by Spearman's rank correlation with Holm over the
readings, and published orderings beside the lab's (experiments/published/ruler_orderings.toml)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from eval.ruler import first_number
from eval.stats import (
    PERMUTATION_DRAWS,
    Estimate,
    holm,
    mcnemar_exact,
    poisson_binomial_sf,
    spearman,
    spearman_p,
    wilson_interval,
)
from eval.verdicts import separated_by_samples
from experiments.engine import Records, key, load_records
from experiments.render import p_text, provenance, published, write
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


# ------------------------------------------------------------------------ pairs of methods on the same samples

def reading_tasks(reading: str, cells: list[dict], length: int) -> list[str]:
    """The tasks a RULER reading pools ("mean over A and B", or one task's name)."""
    asked = {c["task"] for c in cells if c["length"] == length}
    return sorted(t for t in asked if t in reading.removeprefix("mean over ").split(" and ")) or \
        sorted(t for t in asked if t.startswith("niah"))


def pair_lines(cells: list[dict]) -> list[str]:
    """Per (task, length) with two or more methods: the pairs with a discordant sample, McNemar and Holm."""
    columns = sorted({(c["task"], c["length"]) for c in cells}, key=lambda column: (column[1], column[0]))
    lines = ["## Which methods the samples separate", "",
             "The methods answer the same samples, so two are compared sample by sample: of the samples one answered in "
             "full and the other did not, how many favour each; the exact McNemar test (two-sided), Holm over every "
             "pair of methods of that task and length at 5%. An order between two methods is claimed only where they "
             "are separated; otherwise they are within noise of each other. Shown: at the longest length every pair "
             "with a discordant sample, at the others the pairs that separate or have p < 0.05 before the correction; "
             "the rest are counted below the table.", "",
             "| task @ length | A - B | samples | only A | only B | p | separated |", "|---|---|---:|---:|---:|---:|---|"]
    rest, longest = [], max(length for _, length in columns)
    for task, length in columns:
        methods = list(dict.fromkeys(c["method"] for c in cells if (c["task"], c["length"]) == (task, length)))
        if len(methods) < 2:
            continue
        pairs = sample_pairs(cells, methods, [task], length)
        for (a, b), pair in pairs.items():
            if pair["separated"] or pair["p"] < 0.05 or (length == longest and pair["a"] + pair["b"]):
                first, second = (a, b) if pair["a"] >= pair["b"] else (b, a)
                lines.append(f"| {task} @ {length:,} | {name(first)} - {name(second)} | {pair['n']} | "
                             f"{max(pair['a'], pair['b'])} | {min(pair['a'], pair['b'])} | {pair['p']:.2g} | "
                             f"{'yes' if pair['separated'] else 'no'} |")
        left = [pair for pair in pairs.values()
                if not (pair["separated"] or pair["p"] < 0.05 or (length == longest and pair["a"] + pair["b"]))]
        if left:
            rest.append(f"{task} @ {length:,}: {len(left)} of {len(pairs)} pairs, each with at most "
                        f"{max(max(pair['a'], pair['b']) for pair in left)} sample(s) one answered and the other not")
    return lines + ["", "Not separated, p >= 0.05 before the correction: " + "; ".join(rest) + ".", ""] if rest \
        else lines + [""]


# What a wrong number holds of its needle, digit by digit: response digit i against the answer's digit i ("the same
# position") and against its digit 2i - 1 ("every other digit": 1, 3, 5, 7, a reading that skips one digit in two);
# counted from 0 below, i and 2i.
ALIGNMENTS = {"the same position": lambda i: i, "every other digit": lambda i: 2 * i}
DIGIT_POSITIONS = 5  # response digits scored
MIN_WRONG = 10  # wrong numbers a needle cell needs to be read digit by digit


def wrong_numbers(cell: dict) -> list[tuple[str, str]]:
    """(answer, the response's first number) of each sample that gives a number and not the answer."""
    found = []
    for sample in cell["samples"]:
        answer = sample["target"][0] if isinstance(sample.get("target"), list) else sample.get("target")
        number = first_number(sample["response"])
        if answer and number and sample["score"] < 1.0 and number != answer:
            found.append((str(answer), number))
    return found


def digit_rows(pairs: list[tuple[str, str]]) -> list[dict]:
    """Per alignment and response position: the responses whose digit there equals the answer's digit at the
    aligned position (k of n, the responses long enough on both sides), the count expected under a within-answer
    permutation null (each answer's digits shuffled: the aligned digit is then any of the answer's digits, so a
    response digit matches with chance (its count among the answer's digits) / (answer length)), and the exact
    one-sided p of that null (Poisson-binomial)."""
    rows = []
    for alignment, at in ALIGNMENTS.items():
        for i in range(DIGIT_POSITIONS):
            used = [(a, r) for a, r in pairs if i < len(r) and at(i) < len(a)]
            if not used:
                continue
            matches = sum(r[i] == a[at(i)] for a, r in used)
            chances = [a.count(r[i]) / len(a) for a, r in used]
            rows.append({"alignment": alignment, "position": i + 1, "answer_position": at(i) + 1, "k": matches,
                         "n": len(used), "expected": sum(chances), "p": poisson_binomial_sf(matches, chances)})
    return rows


def right_by_doc(cells: list[dict], method: str, tasks: list[str], length: int) -> dict[tuple[str, int], bool]:
    """(task, doc_id) -> whether `method` answered that sample in full, over `tasks` at `length`."""
    return {(c["task"], s["doc_id"]): s["score"] == 1.0 for c in cells
            if c["method"] == method and c["task"] in tasks and c["length"] == length for s in c["samples"]}


def sample_pairs(cells: list[dict], methods: list[str], tasks: list[str], length: int) -> dict[tuple[str, str], dict]:
    """Every pair of `methods` on the samples both answered (of `tasks` at `length`): the samples compared, the
    samples only the first answered in full and only the second, the exact McNemar p and whether Holm over every
    pair of the family at 5% separates them (eval/verdicts.py separated_by_samples)."""
    right = {m: right_by_doc(cells, m, tasks, length) for m in methods}
    pairs = {}
    for a, b in itertools.combinations(methods, 2):
        shared = [doc for doc in right[a] if doc in right[b]]
        pairs[(a, b)] = {"n": len(shared), "a": sum(right[a][d] and not right[b][d] for d in shared),
                         "b": sum(right[b][d] and not right[a][d] for d in shared)}
    for pair, separated in zip(pairs.values(), separated_by_samples([(p["a"], p["b"]) for p in pairs.values()])):
        pair["p"], pair["separated"] = mcnemar_exact(pair["a"], pair["b"]), separated
    return pairs


# ------------------------------------------------------------------------------------- published orderings

def concordance(published: dict[str, float], ours: dict[str, float],
                separated: dict[tuple[str, str], dict]) -> tuple[int, int, int]:
    """(pairs of methods ordered alike, ordered oppositely, not counted) over the methods both score: a pair is counted
    only where the lab's samples separate it (sample_pairs) and the paper's scores differ."""
    alike = opposite = left = 0
    for first, second in itertools.combinations([m for m in published if m in ours], 2):
        pair = separated.get((first, second)) or separated.get((second, first))
        sign = np.sign(published[first] - published[second]) * np.sign(ours[first] - ours[second])
        if pair is None or not pair["separated"] or sign == 0:
            left += 1
            continue
        alike, opposite = alike + int(sign > 0), opposite + int(sign < 0)
    return alike, opposite, left


def ordering(scores: dict[str, float], methods: list[str]) -> str:
    """`methods` from the highest score down, "A 3 > B 2 = C 2"."""
    ranked = sorted(methods, key=lambda m: -scores[m])
    text = f"{name(ranked[0])} {scores[ranked[0]]:g}"
    for before, method in zip(ranked, ranked[1:]):
        text += (" = " if scores[method] == scores[before] else " > ") + f"{name(method)} {scores[method]:g}"
    return text


def published_rows(shares: dict[str, float], separated: dict[tuple[str, str], dict]) -> list[dict]:
    """Each published ordering over the methods the lab has scored too (at least two), with the separated pairs
    ordered alike and oppositely; an entry marked `counted = false` (a test of another kind) is shown, not counted."""
    rows = []
    for entry in published("ruler_orderings"):
        methods = [m for m in entry["published"] if m in shares]
        if len(methods) >= 2:
            ours = {m: shares[m] for m in methods}
            alike, opposite, left = concordance({m: entry["published"][m] for m in methods}, ours, separated)
            rows.append({**entry, "methods": methods, "ours": ours, "alike": alike, "opposite": opposite,
                         "left": left})
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


def digit_lines(cells: list[dict]) -> list[str]:
    """The needle cells with at least MIN_WRONG wrong numbers, read digit by digit against the permutation null, per
    length and pooled over lengths with each needle counted once (lengths share needles); Holm over every test of
    the table at 5%."""
    chosen = sorted([c for c in cells if c["task"] == "niah_single_1" and len(wrong_numbers(c)) >= MIN_WRONG],
                    key=lambda c: (name(c["method"]), c["length"]))
    if not chosen:
        return []
    tables = []
    for method in dict.fromkeys(c["method"] for c in chosen):
        mine = [c for c in chosen if c["method"] == method]
        for c in mine:
            tables.append((f"{name(method)} @ {c['length']:,}", digit_rows(wrong_numbers(c))))
        if len(mine) > 1:
            seen, pooled = set(), []
            for c in mine:  # the shortest length's response to a needle, each needle once
                for answer, number in wrong_numbers(c):
                    if answer not in seen:
                        seen.add(answer)
                        pooled.append((answer, number))
            tables.append((f"{name(method)}, pooled over lengths, each needle once", digit_rows(pooled)))
    rows = [row for _, found in tables for row in found]
    for row, survives in zip(rows, holm([row["p"] for row in rows], alpha=0.05)):
        row["holm"] = survives
    lines = ["## What a wrong number holds of its needle, digit by digit", "",
             f"For each needle cell with at least {MIN_WRONG} wrong numbers (a number given, not the answer): response "
             "digit i against the answer's digit i (the same position) and against its digit 2i - 1 (every other digit: "
             "1, 3, 5, 7), "
             "k of n responses long enough for both; the count a within-answer permutation null expects (the answer's "
             "digits shuffled, so digit i matches with chance its count among the answer's digits over their number) "
             "and the exact one-sided p of that null; Holm over every test of the table at 5%. Lengths share needles: "
             "the pooled rows count each needle once (its response at the shortest length).", "",
             "| cell | alignment | response digit | answer digit | k of n | expected | p | Holm |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {title} | {row['alignment']} | {row['position']} | {row['answer_position']} | {row['k']} of "
              f"{row['n']} | {row['expected']:.1f} | {row['p']:.2g} | {'survives' if row['holm'] else 'no'} |"
              for title, found in tables for row in found]
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


def published_lines(readings: dict[str, dict[str, float]], cells: list[dict], longest: int) -> list[str]:
    rows = []
    for reading, shares in readings.items():
        separated = sample_pairs(cells, list(shares), reading_tasks(reading, cells, longest), longest)
        rows += [{**row, "ruler_reading": reading} for row in published_rows(shares, separated)]
    if not rows:
        return []
    lines = ["## Published orderings beside the lab's", "",
             "Each source's scores (as its paper reports them) beside the lab's share of needle samples answered in full "
             f"at {longest:,} tokens (read as in the correlation above), for the methods both have. A pair is counted "
             "only where the lab's samples separate it (exact McNemar on the samples of the reading's tasks, Holm over "
             "every pair of the reading's methods at 5%) and the paper's scores differ: ordered alike or oppositely; "
             "the other pairs are not counted. A source marked not counted measures something else (its note says "
             "what).", "",
             "| source | setting | published | RULER read as | the lab | pairs alike / opposite / not counted |",
             "|---|---|---|---|---|---:|"]
    for row in sorted(rows, key=lambda row: row["source"]):
        ours = {m: round(share, 2) for m, share in row["ours"].items()}
        counts = f"{row['alike']} / {row['opposite']} / {row['left']}" if row.get("counted", True) else \
            f"not counted: {row['why']}"
        lines.append(f"| {row['source']} | {row['setting']} | {ordering(row['published'], row['methods'])} | "
                     f"{row['ruler_reading']} | {ordering(ours, row['methods'])} | {counts} |")
    return lines + [""]


def pooled(records: Records) -> list[dict]:
    """One entry per (model, task, length) with records: its cells' samples together in doc_id order (a sample two
    cells hold is counted once, from the cell declared first), their seconds and cached responses summed."""
    found: dict[tuple, dict] = {}
    for cell, record in records.done():
        entry = found.setdefault((cell["model"], cell["task"], cell["length"]), {
            **record, "samples": [], "seconds": 0.0, "from_cache": 0, "method": cell["model"], "task": cell["task"],
            "length": cell["length"], "set_for": cell["set_for"], "trained": cell["trained"]})
        held = {sample["doc_id"] for sample in entry["samples"]}
        entry["samples"] = sorted(entry["samples"] + [s for s in record["samples"] if s["doc_id"] not in held],
                                  key=lambda sample: sample["doc_id"])
        entry["seconds"] += record["seconds"]
        entry["from_cache"] += record.get("from_cache", 0)
    return list(found.values())


def report(records: Records) -> None:
    """OUT/report.md from whatever cells have records."""
    found = pooled(records)
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
        lines += ["", *pair_lines(cells), *by_distance(cells, cells[0]["trained"]), *value_lines(cells),
                  *digit_lines(cells)]
    lines += parity_lines(found)
    longest = max((c["length"] for c in cells), default=0)
    readings = ruler_readings(cells, longest)
    lines += correlation_lines(readings, correlate(readings, use_of(records.settings.use_results)), longest)
    lines += published_lines(readings, cells, longest)
    if records.missing():
        lines += [f"Not measured yet ({len(records.missing())} cells): "
                  + ", ".join(cell["name"] for cell in records.missing()) + ".", ""]
    seconds = [records.seconds(cell) for cell, _ in records.done()]
    write(records.out, "report.md", "\n".join([*lines, provenance(records.invocations, seconds), ""]))
