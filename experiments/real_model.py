"""The long-context methods on a pretrained model nobody here trained: mean NLL by position at 1x, 2x and 4x of its
context L, passkey retrieval past it, its use of the text (eval/use.py), and what each cell cost.

    make real-model && python -m experiments.real_model --checkpoint runs/smollm2 --texts stdlib,path/to/book.txt

Texts ("stdlib": this machine's standard library, or text files) are read whole, in --windows windows of 4L tokens.
An NLL cell (text, window, method, length) scores a window's first `length` tokens under the method set for that
length (eval.scoring.score_under) and keeps its mean NLL by position (eval.extrapolation.by_position); a (method,
length) set as a longer cell of the same method or of plain RoPE is no cell: the report reads it there.
"""
from __future__ import annotations

import functools
import hashlib
import json
import resource
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.tokenizer import ENDOFTEXT, load_tokenizer
from eval import figures
from eval.extrapolation import by_position, position_rows, resolve_length
from eval.heldout import text_tokens
from eval.passkey import passkey_under
from eval.scoring import score_under
from eval.segments import choose_segments
from eval.stats import Estimate, log_scale_interval
from eval.use import DEFAULT_MARGIN, default_span, distances_at, fitting_count, measure_use, text_section
from experiments.engine import Context, Records, Study, option
from experiments.render import bands, provenance, write
from model.checkpoint import load_config, load_model, load_trainer_state, trained_length, weights_digest
from model.methods import NONE, check_methods, method_spec
from model.runtime import autocast_dtype, resolve_device

METHODS = ["none", "linear", "ntk", "dynamic", "yarn", "selfextend", "rerope", "sinks", "logn"]
MIN_PASSKEY_TRIALS = 10  # a passkey cell with fewer trials is left out of the report


@dataclass
class Settings:
    checkpoint: str = option("runs/smollm2", "an imported checkpoint (scripts.import_hf, `make real-model`)")
    texts: list = option(["stdlib"], "stdlib (this machine's standard library) and local text files, read whole")
    methods: list = option(METHODS, "inference-time methods of the NLL cells (none: plain RoPE)")
    lengths: list = option(["1x", "2x", "4x"], "window lengths of the NLL cells: multiples of L or token counts")
    windows: int = option(2, "windows per text")
    dynamic_tail: int = option(128, "positions before 2L and 4L that dynamic NTK scores token by token")
    passkey_methods: list = option(["none", "yarn", "selfextend"], "methods of the passkey cells past L")
    passkey_lengths: list = option(["1x", "2x"], "passkey prompt lengths")
    depths: list = option([0.1, 0.5, 0.9], "passkey key depths")
    trials: int = option(MIN_PASSKEY_TRIALS, f"passkey keys per cell (fewer than {MIN_PASSKEY_TRIALS}: not reported)")
    use_methods: list = option(METHODS, "methods whose use of the text is measured past L (eval/use.py)")
    use_lengths: list = option(["1x", "2x"], "window lengths of the use cells (one of at most L: the positive control)")
    use_distances: list = option(["0.25x", "0.75x", "1.25x", "1.75x"], "distances between the repeated passages")
    use_windows: int = option(1, "windows per use cell")
    use_passages: int = option(8, "passages per distance in each use window")
    dtype: str = option("auto", "auto (bfloat16 where the device computes it natively) | bfloat16 | float32")
    out: str = option("runs/real_model", "the study's folder")


@functools.lru_cache(maxsize=4)
def tokens(checkpoint: str, text: str) -> np.ndarray:
    return text_tokens(text, load_tokenizer(checkpoint))


def cells(settings: Settings, context: Context) -> list[dict]:
    """The checkpoint's facts, the NLL cells window by window (longest length first), the passkey and the use cells."""
    path, trained = settings.checkpoint, trained_length(settings.checkpoint)
    own, at = load_config(path).to_dict(), lambda items: sorted({resolve_length(str(i), trained) for i in items})
    base = {"checkpoint": weights_digest(path), "trained": trained, "dtype": settings.dtype, "local": {"checkpoint": path}}
    found, texts, lengths = [{"name": "checkpoint", "kind": "checkpoint", **base}], [], at(settings.lengths)[::-1]
    for text in settings.texts:
        ids, layout, local = tokens(path, text), max([*lengths, 4 * trained]) + 1, {"checkpoint": path, "text": text}
        digest = hashlib.sha256(ids.tobytes() if text == "stdlib" else Path(text).read_bytes()).hexdigest()[:16]
        texts.append(({**base, "text": Path(text).stem, "text_tokens": len(ids), "text_sha256": digest, "local": local},
                      choose_segments(len(ids), layout, settings.windows * layout, 0).starts))
    for window, (facts, starts) in ((window, text) for window in range(settings.windows) for text in texts):
        declared: list[tuple[str, int, dict]] = []
        for method in dict.fromkeys([NONE, *check_methods(settings.methods)]):
            spec = method_spec(method)
            for length in lengths:
                changes = {} if spec.as_trained_at(own, length, trained) else spec.changes(own, length, trained)
                if length <= trained if spec.incremental else any(
                        m in (method, NONE) and n >= length and c == changes for m, n, c in declared):
                    continue  # dynamic NTK acts past L; a prefix of a longer cell is read there
                declared.append((method, length, changes))
                found.append({**facts, "name": f"nll/{facts['text']}/w{window}/{method}@{length}", "kind": "nll",
                              "window": window, "start": int(starts[window]), "method": method, "length": length,
                              "tail": settings.dynamic_tail})
    for length in at(settings.passkey_lengths):
        found += [{**base, "name": f"passkey/{method}@{length}/d{depth:g}", "kind": "passkey", "method": method,
                   "length": length, "depth": float(depth), "trials": settings.trials}
                  for method in (check_methods(settings.passkey_methods) if length > trained else [NONE])
                  for depth in settings.depths]
    span, lengths = default_span(trained), at(settings.use_lengths)
    for facts, length in ((facts, length) for facts, _ in texts for length in lengths):
        distances = distances_at([str(d) for d in settings.use_distances], trained, length, lengths[-1], span,
                                 settings.use_passages)
        count = fitting_count(length, span, distances, settings.use_passages) if distances else 0
        found += [{**facts, "name": f"use/{facts['text']}/{method}@{length}", "kind": "use", "method": method,
                   "length": length, "distances": distances, "span": span, "passages": count, "windows":
                   settings.use_windows} for method in ([NONE] if length <= trained else dict.fromkeys(
                       [NONE, *check_methods(settings.use_methods)])) if count]
    return found


def measure(cell: dict, context: Context) -> dict:
    path, trained, kind = cell["local"]["checkpoint"], cell["trained"], cell["kind"]
    if kind == "checkpoint":
        parity = Path(path) / "parity.json"
        return {**{k: v for k, v in load_trainer_state(path).items() if k in ("imported_from", "weights")},
                "parity": json.loads(parity.read_text())["table"] if parity.exists() else ""}
    model, tokenizer = load_model(path, resolve_device(context.device)).eval(), load_tokenizer(path)
    amp = autocast_dtype(next(model.parameters()).device, cell["dtype"])
    ids = tokens(path, cell["local"]["text"]) if "text" in cell else None
    if kind == "passkey":
        record = passkey_under(model, tokenizer, cell["method"], cell["length"], cell["depth"], cell["trials"], trained,
                               amp)
    elif kind == "nll":
        losses, paths = score_under(model, cell["method"], ids[None, cell["start"]:cell["start"] + cell["length"] + 1],
                                    trained, amp, cell["tail"])
        record = {**by_position(losses[0], cell["length"], trained, cell["tail"], method_spec(cell["method"]).incremental),
                  "paths": {cell["method"]: sorted({p.split(":")[0] for p in paths.values()})}}
    else:
        [use] = measure_use(model, ids, trained, cell["length"], cell["distances"], cell["span"], cell["passages"],
                            cell["windows"], 0, (cell["method"],), amp, separator=tokenizer.convert_tokens_to_ids(ENDOFTEXT))
        record = {"rows": [{**use.row(i, trained, DEFAULT_MARGIN), "passages": use.passages[:, i].tolist(),
                            "seconds": use.seconds} for i in range(len(cell["distances"]))]}
    return {**record, "dtype": "float32" if amp is None else "bfloat16",
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def interval(row: dict, name: str, signed: bool = False) -> str:
    """'mean [low, high]', or below 3 windows the windows' own values and no interval."""
    values, sign, plural = row.get(f"{name}_values" if name != "nll" else "values"), "+" if signed else "", "s"
    if row[f"{name}_low"] is None and values:
        return " / ".join(f"{v:{sign}.3f}" for v in values) + f" ({len(values)} window{plural[len(values) < 2:]}: no interval)"
    if name == "nll":  # a level, not a difference: its interval on the log scale, or none where no values were kept
        return log_scale_interval(values).format(3) if values else f"{row['nll']:.3f}"
    return "" if row[name] is None else Estimate(row[name], row[f"{name}_low"], row[f"{name}_high"], 1).format(3, signed)


def plot(nll: list[tuple[dict, dict]], trained: int, path: Path) -> None:
    """Mean NLL in bins of L / 8 positions, a line per (method, length) cell, a panel per text: the mean over the
    windows every line of the text has (each line over its own where none is common); dotted: L."""
    texts, panels, width = {}, [], max(1, trained // 8)
    for c, r in nll:
        if r.get("bins"):
            texts.setdefault(c["text"], {}).setdefault((c["method"], c["length"]), {})[c["window"]] = r["bins"]
    for text, lines in texts.items():
        common = sorted(set.intersection(*(set(bins) for bins in lines.values())))
        panels.append((f"{text} (windows {common})", [(f"{m} ({n / trained:g}x)", {
            "color": figures.method_colour(m), "linestyle": {4: "-", 2: "--", 1: ":"}.get(round(n / trained), "-.")},
            [((i + 0.5) * width / 1024, Estimate(float(b), None, None, 1)) for i, b in enumerate(np.mean(
                [bins[w] for w in common or bins], axis=0))]) for (m, n), bins in lines.items()]))
    if panels:
        bands(panels, path, f"position (thousands of tokens; bins of {width:,})", "mean NLL (nats)",
              "Mean NLL by position" + (f": {panels[0][0]}" if len(panels) == 1 else ""), vline=trained / 1024)


def report(records: Records) -> None:
    """report.md and nll_by_position.png from the records (a migrated NLL record keeps its rows as they were)."""
    s, done = records.settings, records.done()
    kinds = {kind: [(c, r) for c, r in done if c["kind"] == kind] for kind in ("checkpoint", "nll", "passkey", "use")}
    trained, state, nll, texts, paths = done[0][0]["trained"], (kinds["checkpoint"] or [({}, {})])[0][1], kinds["nll"], {}, {}
    for c, r in nll + kinds["use"]:
        texts.update(c.get("texts") or {c["text"]: c["text_tokens"]})
        for method, found in r.get("paths", {}).items():
            paths.setdefault(method, set()).update(found)
    rows = [row for _, r in nll for row in r.get("rows", [])] + position_rows(
        {(c["text"], c["window"], c["method"], c["length"]): r["spans"] for c, r in nll if "spans" in r}, trained)
    note = (f"imported from {Path(state['imported_from']).name}: its quantized weights dequantized to float, so "
            "absolute losses are those of the quantized model (higher than the original's); methods compared on the "
            "same weights stay comparable" if state.get("weights") == "dequantized from GGUF" else
            f"from {state.get('imported_from', 'training here')}")
    lines = [f"# Long-context methods on {Path(s.checkpoint).name}, a model nobody here trained", "",
             f"Checkpoint `{s.checkpoint}` (L = {trained:,}), {note}. Texts: " + "; ".join(f"{name} ({count:,} tokens, "
             + ("this machine's Python standard library: its .py files and pydoc topics, concatenated)" if name ==
                "stdlib" else "a file of --texts, read whole)") for name, count in texts.items()) + f". Windows: "
             f"{s.windows} per text of up to {max((r['length'] for r in rows), default=0):,} tokens, spread evenly "
             f"(window 0 starts at the text's first token); {', '.join(sorted({r['dtype'] for _, r in nll}))}. "
             f"Dynamic NTK: token by token through the KV cache on the last {s.dynamic_tail} positions before 2L and "
             "4L, after a prefill of the rest. Intervals: Student's t 95% over windows for differences; a mean NLL (a "
             "level) has the t interval of its logs, exponentiated, where the record keeps the windows' values and no "
             "interval where it keeps only their mean; a row with fewer than 3 windows has none (its windows' own "
             "values are shown). Attention path of each method's cells "
             "(docs/internals.md): "
             + ("; ".join(f"{m}: {', '.join(sorted(k))}" for m, k in sorted(paths.items()) if k) or "not recorded")
             + ".", "", "![Mean NLL by position, bins of L / 8, a line per method and window length; dotted: L]"
             "(nll_by_position.png)", ""]
    if state.get("parity"):
        lines += ["## Parity with transformers (scripts.import_hf --parity-tokens)", "", state["parity"], ""]
    titles = {"bucket": "mean NLL by position bucket", "tail": f"the last {s.dynamic_tail} positions before 2L and 4L "
              "(dynamic NTK scored token by token)"}
    for text, (kind, title) in ((text, kind) for text in dict.fromkeys(r["text"] for r in rows) for kind in titles.items()):
        chosen = sorted((r for r in rows if (r["text"], r["kind"]) == (text, kind)),
                        key=lambda r: (r["bucket"][0], r["length"], r["method"] != NONE, r["method"]))
        if kind == "bucket" or any(method_spec(r["method"]).incremental for r in chosen):
            lines += [f"## {text}: {title}", "", "| positions | window | method | windows | mean NLL "
                      "| minus plain [paired by window] |", "|---|---:|---|---:|---:|---:|", *[
                          f"| {r['bucket'][0]:,}-{r['bucket'][1]:,} | {r['length'] / 1024:g}k ({r['length'] / trained:g}x) "
                          f"| {r['method']} | {r['windows']} | {interval(r, 'nll')} | " + ("(the reference) |" if
                          r["method"] == NONE else f"{interval(r, 'vs_plain', True)} |") for r in chosen], ""]
    passkey = [r for _, r in kinds["passkey"]]
    shown = [r for r in passkey if r["trials"] >= MIN_PASSKEY_TRIALS]
    if len(shown) < len(passkey):
        lines += [f"Passkey: {len(passkey) - len(shown)} cells with fewer than {MIN_PASSKEY_TRIALS} trials each are "
                  "left out of the report (one prompt says little about retrieval; their records keep them).", ""]
    use = sorted(({**row, "text": c["text"], "dtype": r["dtype"]} for c, r in kinds["use"] for row in r["rows"]),
                 key=lambda r: (r["text"], r["length"], r["method"], r["distance"]))
    for text in dict.fromkeys(r["text"] for r in use):
        lines += text_section(f"{text}: use of the text on the same weights (eval/use.py)",
                              [r for r in use if r["text"] == text], trained)
    if shown:
        lines += ["## Passkey retrieval (greedy, eval/passkey.py's prompt)", "", "| method | prompt length | depth | "
                  "correct | answers (key -> answer) | seconds |", "|---|---:|---:|---:|---|---:|", *[
                      f"| {r['method']} | {r['length']:,} | {r['depth']:g} | {round(r['accuracy'] * r['trials'])}/"
                      f"{r['trials']} | " + ", ".join(f"{a['key']} -> {a['answer']}" for a in r["answers"])
                      + f" | {r['seconds']:.0f} |" for r in shown], ""]
    seconds = {kind: [records.seconds(c) for c, _ in found] for kind, found in kinds.items()}
    lines += ["## Cost", "", provenance(records.invocations, sum(seconds.values(), [])) + " Of it: " + ", ".join(
        f"{kind} {sum(seconds[kind]) / 60:.1f} min ({len(seconds[kind])} cells)" for kind in ("nll", "passkey", "use"))
        + f"; peak resident memory of any cell {max(r.get('peak_rss_gib', 0) for _, r in done):.1f} GiB.", ""]
    write(records.out, "report.md", "\n".join(lines))
    plot(nll, trained, records.out / "nll_by_position.png")


STUDY = Study("experiments.real_model", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.real_model"))
