"""The scale ladder: does what a small comparison shows hold for a bigger or longer-trained model? One comparison
(experiments.compare) per rung, its cells named RUNG/NAME, all on one data set (OUT/work/data), its report in OUT/RUNG/;
the ladder's: each variant's penalty at the longest length and 1x perplexity at every kept model (compare.snapshots),
whether the penalty grows with training and with size, and whether the smallest and largest rung order the variants
alike. `python -m experiments.ladder --config configs/ladder.toml ['--every_rung.compare.seeds=[1, 2]']`
"""
from __future__ import annotations

import json
import math
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from errors import ConfigError
from eval import figures
from eval.verdicts import ORDERING_WORDS, movement, order_chain, ordering_pairs, ordering_verdict
from experiments import compare, compare_report
from experiments.engine import Records, Study, key, option, resolve_settings
from experiments.render import bands, cell, estimate_of, provenance, saved, write
from model.fields import toml_value


@dataclass
class Settings:
    compare_config: str = option("configs/compare.toml", "the compare config every rung starts from")
    compare_preset: str = option("quick", "its [presets.NAME] every rung starts from")
    rungs: dict = option({}, 'name -> {"section.key" = value}: what makes the rung differ (smallest first)')
    every_rung: dict = option({}, '{"section.key" = value}: what every rung changes in the preset')
    out: str = option("runs/ladder", "the study's folder")


def flat(table: dict) -> dict:
    """{"model": {"dim": 64}} (an override on the command line nests) and {"model.dim": 64} alike -> {"model.dim": 64}."""
    return {f"{name}.{inner}" if inner else name: value for name, one in table.items()
            for inner, value in (one.items() if isinstance(one, dict) and "." not in name else [("", one)])}


def rung_settings(settings: Settings, rung: str) -> compare.Settings:
    """The compare config's preset, then every_rung's and the rung's settings, as experiments.compare's flags."""
    text = lambda dotted, value: value if dotted.startswith("compare.") and isinstance(value, str) else (  # noqa: E731
        ",".join(map(toml_value, value)) if dotted.startswith("compare.") and isinstance(value, list) else toml_value(value))
    flags = [f"--{dotted}={text(dotted, value)}" for dotted, value in
             {**flat(settings.every_rung), **flat(settings.rungs[rung])}.items()] + [f"--compare.out={settings.out}/{rung}"]
    return resolve_settings(compare.STUDY, Namespace(config=Path(settings.compare_config), preset=settings.compare_preset),
                            flags)


def prepare(settings: Settings, context) -> None:
    rungs = [rung_settings(settings, rung) for rung in settings.rungs]
    if len({(s.source, s.vocab_size, s.val_fraction, s.max_documents) for s in rungs}) > 1 or any(s.tasks for s in rungs):
        raise ConfigError("ladder: the rungs share one data set (OUT/work/data) and run no compare.tasks (one folder)")
    for one in rungs:
        compare.prepare(one, context)


def cells(settings: Settings, context) -> list[dict]:
    return [{**one, "name": f"{rung}/{one['name']}"} for rung in settings.rungs
            for one in compare.cells(rung_settings(settings, rung), context)]


def summary(rung: Records) -> dict:
    """What the ladder reads of a rung (a migrated record holds it): per variant, [fraction, tokens, penalty, 1x ppl]."""
    c, s = compare_report.Comparison(rung), rung.settings
    return {"longest_multiple": c.longest / c.trained,
            "parameters": {model["encoding"]: record["training"]["parameters"] for model, record in c.models},
            "points": {name: [[f, round(f * c.max_steps) * c.tokens_per_step, saved(penalty), saved(short)]
                              for f, penalty, short, _ in rows] for name, rows in c.snapshots.items()},
            "setup": {"source": s.source, "encodings": s.encodings, "methods": s.methods, "seeds": s.seeds,
                      "snapshot_methods": s.snapshot_methods, "trained": c.trained, "model": s.model, "train": s.train}}


def labels(series: dict, at_1x: bool = False) -> list[str]:
    """The variants; at_1x: those whose 1x perplexity is not their base model's (rope+yarn repeats rope at 1x)."""
    ppl = lambda name: [(rung, [(row[0], row[3] and row[3].mean) for row in rows])  # noqa: E731
                        for (rung, n), rows in series.items() if n == name]
    return [n for n in dict.fromkeys(n for _, n in series) if not at_1x or "+" not in n or ppl(n) != ppl(n.split("+")[0])]


def findings(series: dict, rungs: list[str], multiple: float) -> list[str]:
    small, large, names = rungs[0], rungs[-1], labels(series)
    trend = lambda a, b: "n/a" if a is None or b is None else movement(a, b, "grows", "shrinks")  # noqa: E731
    ends = [{n: next((row[2] for row in series.get((rung, n), []) if math.isclose(row[0], 1)), None) for n in names}
            for rung in (small, large)]  # the penalty at the full budget
    lines = [f"- **With training** (penalty at {multiple:g}x, the first kept model against the final one, at each "
             "rung) and **with size** (the final models, smallest rung against the largest):", ""]
    for name in names:
        trends = {rung: trend(kept[0], kept[-1]) for rung in rungs
                  if len(kept := [row[2] for row in series.get((rung, name), []) if row[2]]) >= 2}
        words, last = set(trends.values()), [ends[0][name], ends[1][name]]
        trained = (f"{words.pop()} at every rung" if len(words) == 1 and len(trends) == len(rungs)
                   else ", ".join(f"{word} ({rung})" for rung, word in trends.items()) or "n/a")
        lines.append(f"  - {name}: with training {trained}; with size {trend(*last) if small != large else 'n/a'} "
                     f"({' -> '.join(f'{e.mean:+.3f}' for e in last if e)} nats, {small} -> {large})")
    kinds, order = ordering_pairs(names, *ends, (small, large)), [order_chain(
        [(e, n) for n, e in end.items() if e], "+.3f") or "n/a" for end in ends]
    return lines if small == large else lines + [
        "", f"- **Order of the variants by their {multiple:g}x penalty** at the full budget ('<' where the 95% "
        f"intervals separate): {small}: {order[0]}; {large}: {order[1]}. Between the smallest and the largest rung: "
        f"{ordering_verdict(kinds)}."] + [f"  - {words.format(small=small, large=large)}: {'; '.join(kinds[kind])}"
                                          for kind, words in ORDERING_WORDS.items() if kinds[kind]]


def ladder_table(series: dict, rungs: list[str], index: int) -> list[str]:  # index 2: the penalty; 3: 1x perplexity
    fractions, digits = sorted({row[0] for rows in series.values() for row in rows}), 3 if index == 2 else 2
    return ["| variant | rung | " + " | ".join(f"{f:g} of training" for f in fractions) + " |",
            "|---|---|" + "---:|" * len(fractions)] + [
        f"| {name} | {rung} | " + " | ".join(f"{cell(row[index], digits, index == 2)} ({row[1] / 1e6:.2g}M)"
                                             if row and row[index] else "n/a" for row in map(found.get, fractions)) + " |"
        for name in labels(series, index == 3) for rung in rungs
        if (found := {row[0]: row for row in series.get((rung, name), [])})]


def report(records: Records) -> None:
    settings, out, summaries, seconds = records.settings, records.out, {}, {}
    for rung in settings.rungs:
        own = [one for one in records.cells if one["name"].startswith(f"{rung}/")]
        stored = {key(one): records.stored[key(one)] for one in own if key(one) in records.stored}
        seconds[rung] = sum(found["seconds"] or 0 for found in stored.values())
        if migrated := [found["record"]["summary"] for found in stored.values() if "summary" in found["record"]]:
            summaries[rung] = migrated[0]  # a rung migrated from an aggregate without per-seed values
        elif any(one["kind"] == "model" and key(one) in stored for one in own):
            compare_report.report(part := Records(rung_settings(settings, rung), out / rung, own, stored, records.invocations))
            summaries[rung] = summary(part)  # and the rung's own report in OUT/RUNG/
    if len({one["longest_multiple"] for one in summaries.values()}) != 1:
        raise ConfigError(f"{out}: no rung has a record, or the rungs evaluate different longest lengths")
    rungs, multiple = list(summaries), next(iter(summaries.values()))["longest_multiple"]
    series = {(rung, name): sorted([(f, tokens, estimate_of(penalty), estimate_of(ppl)) for f, tokens, penalty, ppl
                                    in rows]) for rung in rungs for name, rows in summaries[rung]["points"].items()}
    same = [n for n in labels(series) if n not in labels(series, at_1x=True)]
    tables = [f"### Penalty at {multiple:g}x (nats; mean [95% interval] over seeds and windows; training tokens in "
              "brackets)", "", *ladder_table(series, rungs, 2), "", "### Perplexity at 1x (mean [95% t interval] over "
              "seeds)", "", *([f"Not repeated: {', '.join(same)} (at 1x the same numbers as the model without the "
                               "method)", ""] if same else []), *ladder_table(series, rungs, 3), ""]
    write(out, "table.md", "\n".join(tables))
    for index, name, ylabel in ((2, "penalty", f"penalty at {multiple:g}x (nats)"), (3, "ppl", "perplexity at 1x")):
        bands([(rung, [(n, figures.style(*(n.split("+") + ["none"])[:2]), [(row[1] / 1e6, row[index]) for row in
                                                                           series.get((rung, n), [])])
                       for n in labels(series, index == 3)]) for rung in rungs], out / f"{name}.png",
              "training tokens (millions, log scale)", ylabel, f"Scale ladder: {ylabel} against training tokens, one "
              "panel per rung (band: 95% interval over seeds)", log_x=True, log_y=index == 3, zero_line=index == 2)
    setup, differ = summaries[rungs[0]]["setup"], {dotted for own in settings.rungs.values() for dotted in flat(own)}
    rows = [f"| {rung} | {', '.join(f'{k} = {json.dumps(v)}' for k, v in flat(settings.rungs[rung]).items())} | "
            f"{' - '.join(f'{n:,}' for n in sorted(set(summaries[rung]['parameters'].values())))} | "
            f"{max(row[1] for (r, _), found in series.items() if r == rung for row in found):,} | "
            f"{seconds[rung] / 60:.1f} min |" for rung in rungs]
    lines = ["# Scale ladder", "", provenance(records.invocations, [f["seconds"] or 0 for f in records.stored.values()]),
             "", "## Setup", "", f"- Every rung starts from the `{settings.compare_preset}` preset of "
             f"`{settings.compare_config}`: data `{setup['source']}`, encodings {setup['encodings']}, methods "
             f"{setup['methods']} (the kept models are evaluated under {setup['snapshot_methods']}), seeds "
             f"{setup['seeds']}, L = {setup['trained']}, evaluated at {multiple:g}x; shared settings "
             f"{json.dumps({k: v for k, v in setup['model'].items() if f'model.{k}' not in differ})}, training "
             f"{json.dumps(setup['train'])}.", f"- Models kept at {sorted({r[0] for rows in series.values() for r in rows})}"
             " of training (one training per encoding, seed and rung; the earlier models are snapshots of it, taken "
             "while the learning rate was still high).", "",
             "| rung | its settings | parameters (by encoding) | training tokens | rung compute time |",
             "|---|---|---:|---:|---:|", *rows, "", "## Results", "", *tables,
             "![penalty against training tokens, one panel per rung](penalty.png)", "",
             "![1x perplexity against training tokens, one panel per rung](ppl.png)", "", "## What this shows", "",
             *findings(series, rungs, multiple), "",
             "A trend or an order is stated only where the 95% intervals separate; 'within noise' is not 'no change'."]
    write(out, "report.md", "\n".join(lines) + "\n")


STUDY = Study("experiments.ladder", Settings, cells, compare.measure, report, prepare, __doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.ladder"))
