"""Passkey retrieval on any checkpoint under every inference-time method at every length and depth.

    python -m experiments.passkey_grid --checkpoint runs/smollm2 --lengths 1x,2x,4x --trials 20 --out runs/passkey_grid

A cell (method, length, depth): --trials keys, answered greedily under the method set for the length (eval.passkey.
passkey_under), for each method that applies to the checkpoint. Report: k of n correct [Wilson 95%] per method and
length, pooled over depths, and per depth; a heatmap (passkey.png).
"""
from __future__ import annotations

from dataclasses import dataclass

from data.tokenizer import load_tokenizer
from eval.extrapolation import resolve_length
from eval.passkey import passkey_under, plot_heatmap
from eval.stats import wilson_interval
from experiments.engine import Context, Records, Study, option
from experiments.render import provenance, table, write
from model.checkpoint import load_config, load_model, trained_length, weights_digest
from model.methods import applies, check_methods
from model.runtime import autocast_dtype, resolve_device


@dataclass
class Settings:
    checkpoint: str = option("runs/smollm2", "a checkpoint: `make real-model`'s runs/smollm2, or a run trained here")
    methods: list = option(["none", "yarn", "selfextend", "sinks"], "inference-time methods (model/methods/)")
    lengths: list = option(["1x", "2x", "4x"], "prompt lengths: multiples of the trained length L or token counts")
    depths: list = option([0.0, 0.5, 1.0], "key depths: 0 the start of the filler, 1 its end")
    trials: int = option(20, "keys per (method, length, depth)")
    dtype: str = option("auto", "auto (bfloat16 where the device computes it natively) | bfloat16 | float32")
    out: str = option("runs/passkey_grid", "the study's folder")


def cells(settings: Settings, context: Context) -> list[dict]:
    path, config, trained = settings.checkpoint, load_config(settings.checkpoint), trained_length(settings.checkpoint)
    base = {"checkpoint": weights_digest(path), "trained": trained, "trials": settings.trials, "dtype": settings.dtype}
    return [{**base, "name": f"{method}@{length}/d{depth:g}", "method": method, "length": length, "depth": float(depth),
             "local": {"checkpoint": path}} for method in check_methods(settings.methods)
            if applies(method, config.position, config.layer_encodings)
            for length in sorted({resolve_length(str(item), trained) for item in settings.lengths})
            for depth in settings.depths]


def measure(cell: dict, context: Context) -> dict:
    model = load_model(cell["local"]["checkpoint"], resolve_device(context.device)).eval()
    return passkey_under(model, load_tokenizer(cell["local"]["checkpoint"]), cell["method"], cell["length"],
                         cell["depth"], cell["trials"], cell["trained"],
                         autocast_dtype(next(model.parameters()).device, cell["dtype"]))


def report(records: Records) -> None:
    done, s = records.done(), records.settings
    methods, lengths, depths = ({c[name]: None for c, _ in done} for name in ("method", "length", "depth"))

    def rate(method: str, length: int, depth: float | None = None) -> str:  # k of n and the Wilson interval, pooled
        rows = [r for c, r in done if (c["method"], c["length"]) == (method, length) and depth in (None, c["depth"])]
        found = wilson_interval(sum(round(r["accuracy"] * r["trials"]) for r in rows), sum(r["trials"] for r in rows))
        return f"{round(found.mean * found.n)} of {found.n}, {found.format(2)}"
    titles, per_depth = [f"{n:,}" for n in lengths], {f"{m}, depth {d:g}": (m, d) for m in methods for d in depths}
    write(records.out, "report.md", "\n".join([
        f"# Passkey retrieval on {s.checkpoint} (L = {done[0][0]['trained']:,})", "",
        f"Greedy, {s.trials} keys per (method, length, depth) (eval/passkey.py); k of n correct, rate [Wilson 95%].",
        "", "## Per method and prompt length, pooled over depths", "",
        *table({m: m for m in methods}, lengths, titles, lambda m, n: rate(m, n), "method"), "", "## Per depth", "",
        *table(per_depth, lengths, titles, lambda md, n: rate(md[0], n, md[1]), "method, depth"), "",
        "![passkey rate per method, depth and length](passkey.png)", "",
        provenance(records.invocations, [records.seconds(c) for c, _ in done]), ""]))
    plot_heatmap([r for _, r in done], records.out / "passkey.png", f"Passkey retrieval: {s.checkpoint}",
                 lambda r: f"{r['method']}, depth {r['depth']:g}", "method, key depth")


STUDY = Study("experiments.passkey_grid", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.passkey_grid"))
