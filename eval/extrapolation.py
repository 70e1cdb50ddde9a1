"""Length extrapolation: perplexity vs evaluation length for one or more checkpoints.

    python -m eval.extrapolation --checkpoint runs/tiny --lengths 1x,2x,4x,8x,16x --out runs/extrap
    python -m eval.extrapolation --checkpoint runs/cmp/rope runs/cmp/alibi --lengths 256,1024,4096 \\
        --scalings none,linear,ntk,dynamic,yarn --data ../shared/data/books --out runs/extrap

Lengths are multiples of each checkpoint's trained context (1x, 2x, ...) or absolute token counts.
RoPE checkpoints are evaluated under each scaling in --scalings with factor = length / trained length
("none" = the checkpoint as it is); other checkpoints as they are. Every length scores the first
--tokens tokens of the same text (floored to whole windows), so all models and lengths see the same
tokens when they share a tokenizer. Windows are nonoverlapping, as in the ALiBi paper.
Writes OUT/results.json, OUT/table.md and OUT/plot.png.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data.sources import SourceError
from data.tokenizer import load_tokenizer, token_byte_lengths
from eval.perplexity import evaluate_stream, load_eval_tokens
from model.checkpoint import CheckpointError, load_model, load_trainer_state
from model.config import ConfigError
from model.position import PositionRangeError
from model.runtime import autocast_dtype, resolve_device

DEFAULT_SCALINGS = "none,linear,ntk,dynamic,yarn"


@dataclass
class Variant:
    checkpoint: str
    name: str
    position: str
    scaling: str  # "none" for the checkpoint as it is

    @property
    def label(self) -> str:
        return self.name if self.position != "rope" or self.scaling == "none" else f"{self.name}+{self.scaling}"


def trained_length(checkpoint: str | Path, max_seq_len: int) -> int:
    try:
        return int(load_trainer_state(checkpoint).get("trained_seq_len", max_seq_len))
    except CheckpointError:
        return max_seq_len


def parse_lengths(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        number = item[:-1] if item.endswith("x") else item
        try:
            valid = float(number) > 0
        except ValueError:
            valid = False
        if not valid:
            raise ValueError(f"--lengths item {item!r} must be a multiple like 4x or a token count like 1024")
    return items


def resolve_length(item: str, trained: int) -> int:
    return int(round(float(item[:-1]) * trained)) if item.endswith("x") else int(item)


def evaluate_checkpoints(
    checkpoints: list[str],
    lengths: list[str],
    scalings: list[str],
    data: str | None,
    tokens: int,
    device_name: str = "auto",
    dtype: str = "float32",
    names: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per checkpoint x scaling x length: ppl, bpb, nll, tokens (or the error that stopped it)."""
    device = resolve_device(device_name)
    amp = autocast_dtype(device, dtype)
    rows: list[dict[str, Any]] = []
    streams: dict[str, np.ndarray] = {}  # tokenizer file contents -> eval ids, so equal tokenizers share tokens
    for index, checkpoint in enumerate(checkpoints):
        model = load_model(checkpoint, device)
        own_scaling = model.config.rope_scaling
        trained = trained_length(checkpoint, model.config.max_seq_len)
        tokenizer = load_tokenizer(checkpoint)
        byte_lengths = token_byte_lengths(tokenizer)
        source = data or load_trainer_state(checkpoint)["run_config"]["data"]["dir"]
        key = (Path(checkpoint) / "tokenizer.json").read_text() + "\0" + source
        if key not in streams:
            streams[key] = load_eval_tokens(source, tokenizer, tokens)
        ids = streams[key]
        name = names[index] if names else Path(checkpoint).name
        variant_scalings = scalings if model.config.position == "rope" else ["none"]
        for scaling in variant_scalings:
            variant = Variant(str(checkpoint), name, model.config.position, scaling)
            for item in lengths:
                length = resolve_length(item, trained)
                factor = max(1.0, length / trained)
                row = {"checkpoint": variant.checkpoint, "name": name, "label": variant.label,
                       "position": variant.position, "scaling": scaling, "factor": factor if scaling != "none" else None,
                       "trained_length": trained, "length": length, "multiple": length / trained}
                try:
                    if model.config.position == "rope":
                        model.set_rope_scaling(own_scaling if scaling == "none" else {"rope_type": scaling, "factor": factor})
                    windows = min(len(ids) - 1, tokens) // length
                    if windows < 1:
                        raise ValueError(f"the eval text has {len(ids) - 1} tokens, fewer than one window of {length}")
                    result = evaluate_stream(model, ids[: windows * length + 1], byte_lengths, length, amp=amp)
                    row.update(ppl=result.ppl, nll=result.nll, bpb=result.bpb, tokens=result.tokens,
                               position_loss=result.position_loss)
                except (PositionRangeError, ValueError, RuntimeError) as error:
                    row.update(ppl=None, error=str(error).split(";")[0])
                rows.append(row)
                shown = f"ppl {row['ppl']:.3f}" if row["ppl"] is not None else f"n/a ({row['error']})"
                print(f"{variant.label:24s} @ {length:6d} ({row['multiple']:g}x): {shown}")
    return rows


def format_cell(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def tables_markdown(rows: list[dict[str, Any]]) -> str:
    """Perplexity, and perplexity relative to each variant's own 1x, by variant (rows) and multiple (columns)."""
    multiples = sorted({row["multiple"] for row in rows})
    labels = list(dict.fromkeys(row["label"] for row in rows))
    by_key = {(row["label"], row["multiple"]): row for row in rows}
    header = "| variant | " + " | ".join(f"{m:g}x" for m in multiples) + " |\n|---|" + "---:|" * len(multiples)
    ppl_lines, relative_lines = [header], [header]
    for label in labels:
        base = by_key.get((label, 1.0), {}).get("ppl")
        cells, relative = [], []
        for multiple in multiples:
            ppl = by_key.get((label, multiple), {}).get("ppl")
            cells.append(format_cell(ppl))
            relative.append(format_cell(ppl / base if ppl is not None and base else None))
        ppl_lines.append(f"| {label} | " + " | ".join(cells) + " |")
        relative_lines.append(f"| {label} | " + " | ".join(relative) + " |")
    tokens = sorted({row["tokens"] for row in rows if row.get("tokens")})
    lengths = sorted({(row["multiple"], row["length"]) for row in rows})
    note = (
        f"Lengths: {', '.join(f'{m:g}x = {n}' for m, n in lengths)} tokens. "
        f"Scored tokens per cell: {', '.join(str(t) for t in tokens)} (nonoverlapping windows)."
    )
    return (
        "### Perplexity\n\n" + "\n".join(ppl_lines) + "\n\n"
        "### Perplexity relative to the same variant at 1x\n\n" + "\n".join(relative_lines) + "\n\n" + note + "\n"
    )


def plot_results(rows: list[dict[str, Any]], path: Path, title: str = "Perplexity vs evaluation length") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for label in dict.fromkeys(row["label"] for row in rows):
        points = sorted((row["length"], row["ppl"]) for row in rows if row["label"] == label and row["ppl"] is not None)
        if points:
            style = "--" if "+" in label else "-"
            axis.plot(*zip(*points), style, marker="o", markersize=3, label=label)
    for trained in sorted({row["trained_length"] for row in rows}):
        axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
        axis.text(trained, axis.get_ylim()[1] if axis.lines else 1, f" trained {trained}", color="grey", va="top", fontsize=8)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("evaluation length (tokens, log scale)")
    axis.set_ylabel("perplexity (log scale)")
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_outputs(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "table.md").write_text(tables_markdown(rows))
    plot_results(rows, out / "plot.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", nargs="+", required=True, help="one or more checkpoint folders")
    parser.add_argument("--lengths", default="1x,2x,4x,8x,16x", help="multiples (4x) or token counts (1024)")
    parser.add_argument("--scalings", default=DEFAULT_SCALINGS, help=f"for RoPE checkpoints (default {DEFAULT_SCALINGS})")
    parser.add_argument("--data", help="prepared folder, source or path (default: each checkpoint's training data val.bin)")
    parser.add_argument("--tokens", type=int, default=65536, help="tokens scored per length (default 65536)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        lengths = parse_lengths(args.lengths)
        scalings = [item.strip() for item in args.scalings.split(",") if item.strip()]
        valid = {"none", "linear", "ntk", "dynamic", "yarn", "llama3"}
        if not scalings or set(scalings) - valid:
            raise ValueError(f"--scalings: unknown {sorted(set(scalings) - valid)}; valid names are {sorted(valid)}")
        rows = evaluate_checkpoints(args.checkpoint, lengths, scalings, args.data, args.tokens, args.device, args.dtype)
    except (CheckpointError, ConfigError, SourceError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_outputs(rows, args.out)
    print(tables_markdown(rows))
    print(f"wrote {args.out / 'results.json'}, {args.out / 'table.md'}, {args.out / 'plot.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
