"""Train one model per position encoding with identical budgets, evaluate them at 1x..16x the trained
context, and write a report with tables and plots.

    python -m eval.compare --config configs/compare.toml --preset quick
    python -m eval.compare --config configs/compare.toml --preset full --out runs/compare_full

Every variant shares the data, token budget, seed, shape and context length L; only model.position
differs. RoPE is also evaluated under each inference-time scaling in compare.scalings. Re-running skips
variants that finished (and resumes interrupted ones); a variant that fails is reported, not fatal.
Writes OUT/report.md, results.json, table.md, plot.png, train_curves.png and position_loss.png.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import shlex
import statistics
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.batches import PretrainBatches, read_meta
from data.prepare import prepare
from data.tokenizer import load_tokenizer
from eval.extrapolation import evaluate_checkpoints, parse_lengths, plot_results, tables_markdown
from model.checkpoint import has_checkpoint, load_trainer_state
from model.config import ConfigError, build_dataclass, check_field_types
from model.transformer import Transformer
from train.config import RunConfig, build_run_config, parse_override_value
from train.loop import METRICS, run_training


@dataclass
class CompareConfig:
    source: str = "stdlib"
    vocab_size: int = 4096
    val_fraction: float = 0.05
    encodings: list = field(default_factory=lambda: ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"])
    scalings: list = field(default_factory=lambda: ["linear", "ntk", "dynamic", "yarn"])
    lengths: list = field(default_factory=lambda: ["1x", "2x", "4x", "8x", "16x"])
    eval_tokens: int = 16384
    out: str = "runs/compare"

    def __post_init__(self) -> None:
        check_field_types(self, "compare")
        parse_lengths(",".join(self.lengths))
        if self.eval_tokens <= 0 or not 0 < self.val_fraction < 1:
            raise ConfigError("compare.eval_tokens must be positive and compare.val_fraction in (0, 1)")


def set_dotted(values: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    if "." not in dotted:
        raise ConfigError(f"{where}: {dotted!r} must look like section.key")
    section, key = dotted.split(".", 1)
    values.setdefault(section, {})[key] = value


def load_compare_config(path: Path, preset: str | None, overrides: list[str]) -> tuple[CompareConfig, dict, str]:
    """The compare settings, the shared [model]/[train] values for every variant, and the preset used."""
    if not path.exists():
        raise ConfigError(f"config file {path} not found")
    values = tomllib.loads(path.read_text())
    presets = values.pop("presets", {})
    if preset is not None:
        if preset not in presets:
            raise ConfigError(f"--preset {preset!r} is not in {path}; available: {sorted(presets)}")
        for dotted, value in presets[preset].items():
            set_dotted(values, dotted, value, f"{path} [presets.{preset}]")
    for override in overrides:
        if not override.startswith("--") or "=" not in override:
            raise ConfigError(f"override {override!r} must look like --section.key=value")
        dotted, text = override[2:].split("=", 1)
        set_dotted(values, dotted, parse_override_value(text), "override")
    compare = build_dataclass(CompareConfig, values.pop("compare", {}), "compare")
    for section in ("data", "out"):
        if section in values:
            raise ConfigError(f"{path}: [{section}] is set by eval.compare itself; use [compare] source/out instead")
    build_run_config(copy.deepcopy(values), str(path))  # validate the shared sections once, up front
    return compare, values, preset or "default"


def prepared_data(compare: CompareConfig) -> Path:
    """OUT/data, prepared from compare.source unless an identical preparation is already there."""
    data_dir = Path(compare.out) / "data"
    if (data_dir / "meta.json").exists():
        meta = read_meta(data_dir)
        same = (meta.get("source"), meta.get("val_fraction"), meta.get("tokenizer")) == (
            compare.source, compare.val_fraction, "trained here")
        if same and (meta.get("vocab_size") <= compare.vocab_size):
            return data_dir
    prepare(compare.source, data_dir, vocab_size=compare.vocab_size, val_fraction=compare.val_fraction)
    return data_dir


def variant_config(shared: dict, encoding: str, data_dir: Path, compare: CompareConfig) -> RunConfig:
    values = copy.deepcopy(shared)
    values.setdefault("model", {})["position"] = encoding
    values["model"]["vocab_size"] = int(read_meta(data_dir)["vocab_size"])
    values["data"] = {"dir": str(data_dir)}
    values["out"] = {"dir": str(Path(compare.out) / "runs" / encoding)}
    return build_run_config(values, f"variant {encoding}")


def train_variant(config: RunConfig) -> str:
    """Train (or skip, or resume) one variant; returns what happened."""
    out = Path(config.out.dir)
    resume = False
    if has_checkpoint(out):
        state = load_trainer_state(out)
        if state.get("run_config") != config.to_dict():
            raise ConfigError(f"{out} holds a run with other settings; delete it or set another compare.out")
        if int(state["step"]) >= config.train.max_steps:
            return "skipped (already trained)"
        resume = True
    batches = PretrainBatches(config.data.dir, config.model.max_seq_len, config.train.batch_size, config.train.seed,
                              config.train.eval_batches)
    run_training(config, lambda: Transformer(config.model), batches, load_tokenizer(config.data.dir), resume=resume,
                 task="compare")
    return "resumed" if resume else "trained"


def training_summary(config: RunConfig) -> dict[str, Any]:
    out = Path(config.out.dir)
    state = load_trainer_state(out)
    records = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    speeds = [record["tok_per_s"] for record in records if "tok_per_s" in record][1:]  # first interval warms up
    params = Transformer(config.model).num_parameters()
    return {
        "params": params,
        "tokens": int(state["tokens_seen"]),
        "wall_s": float(state["elapsed_s"]),
        "tok_per_s": statistics.median(speeds) if speeds else None,
        "val_loss": state.get("val_loss"),
        "initial_val_loss": state.get("initial_val_loss"),
        "curve": [(r["step"], r["loss"]) for r in records if "loss" in r],
        "val_curve": [(r["step"], r["val_loss"]) for r in records if "val_loss" in r],
    }


def ratio(rows: list[dict], label: str, multiple: float) -> float | None:
    by_multiple = {row["multiple"]: row["ppl"] for row in rows if row["label"] == label}
    base, value = by_multiple.get(1.0), by_multiple.get(multiple)
    return value / base if base and value else None


def findings(rows: list[dict]) -> list[str]:
    """Plain statements computed from the numbers, including checks against the ALiBi paper's orderings."""
    if not rows:
        return ["No variant could be evaluated; see the status column above."]
    labels = list(dict.fromkeys(row["label"] for row in rows))
    multiples = sorted({row["multiple"] for row in rows})
    longest = max(multiples)
    probe = max((m for m in multiples if m <= 8), default=longest)
    lines = []
    held = [f"{label} ({ratio(rows, label, probe):.2f}x)" for label in labels
            if ratio(rows, label, probe) is not None and ratio(rows, label, probe) <= 1.10]
    lost = [f"{label} ({ratio(rows, label, probe):.2f}x)" for label in labels
            if ratio(rows, label, probe) is not None and ratio(rows, label, probe) > 1.10]
    missing = [label for label in labels if ratio(rows, label, probe) is None]
    lines.append(f"Within 10% of their own 1x perplexity at {probe:g}x: {', '.join(held) or 'none'}.")
    if lost:
        lines.append(f"Degraded by more than 10% at {probe:g}x: {', '.join(lost)}.")
    if missing:
        lines.append(f"Not measurable at {probe:g}x: {', '.join(missing)} (see the table; a learned table has no rows "
                     "past its size).")
    at_longest = sorted((row["ppl"], row["label"]) for row in rows if row["multiple"] == longest and row["ppl"])
    if at_longest:
        order = " < ".join(f"{label} ({ppl:.1f})" for ppl, label in at_longest)
        lines.append(f"Perplexity at {longest:g}x, best to worst: {order}.")
    checks = [
        ("sinusoidal", 2.0, lambda r: r > 2.0, "sinusoidal perplexity more than doubles by 2x"),
        ("t5", 4.0, lambda r: r <= 1.25, "T5 bias holds (within 25%) to 4x"),
        ("alibi", longest, lambda r: r <= 1.10, f"ALiBi stays flat (within 10%) out to {longest:g}x"),
    ]
    lines.append("Against the ALiBi paper's orderings (WikiText-103, 247M parameters, L = 512):")
    for label, multiple, holds, claim in checks:
        value = ratio(rows, label, multiple)
        if value is None:
            lines.append(f"- {claim}: not measured here.")
        else:
            verdict = "reproduced" if holds(value) else "not reproduced"
            lines.append(f"- {claim}: {verdict} ({label} at {multiple:g}x = {value:.2f}x its 1x perplexity).")
    rope = [ratio(rows, "rope", m) for m in multiples if m >= 1]
    if all(value is not None for value in rope) and len(rope) > 2:
        steady = all(b >= a for a, b in zip(rope, rope[1:])) and rope[-1] > 1.10
        verdict = "reproduced" if steady else "not reproduced"
        lines.append(f"- rotary degrades steadily with length: {verdict} (rope: "
                     + ", ".join(f"{m:g}x {v:.2f}" for m, v in zip(multiples, rope)) + ").")
    return lines


def plot_training_curves(summaries: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for encoding, summary in summaries.items():
        if summary.get("curve"):
            line, = axis.plot(*zip(*summary["curve"]), label=f"{encoding} (train)", linewidth=1)
            if summary.get("val_curve"):
                axis.plot(*zip(*summary["val_curve"]), "o--", color=line.get_color(), markersize=3, linewidth=0.8)
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats/token); dashed = validation")
    axis.set_title("Training curves (same data, budget, seed, shape)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_position_loss(rows: list[dict], path: Path) -> None:
    """Mean loss at each position of the longest windows: where inside the window does a model break?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = max(row["multiple"] for row in rows)
    figure, axis = plt.subplots(figsize=(8, 5))
    for row in rows:
        if row["multiple"] != longest or not row.get("position_loss"):
            continue
        curve = row["position_loss"]
        bucket = max(1, len(curve) // 64)
        xs = [bucket * (i + 0.5) for i in range(len(curve) // bucket)]
        ys = [sum(curve[i * bucket : (i + 1) * bucket]) / bucket for i in range(len(curve) // bucket)]
        axis.plot(xs, ys, "--" if "+" in row["label"] else "-", label=row["label"], linewidth=1)
    for trained in sorted({row["trained_length"] for row in rows}):
        axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
    axis.set_xlabel(f"position in a {longest:g}x window (tokens); dotted = trained length")
    axis.set_ylabel("mean loss (nats/token)")
    axis.set_title("Loss by position at the longest evaluation length")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(out: Path, compare: CompareConfig, shared: dict, data_dir: Path, summaries: dict, status: dict,
                 rows: list[dict], command: str, wall_s: float, preset: str) -> None:
    meta = read_meta(data_dir)
    first = next(iter(summaries.values()), {})
    model, train = shared.get("model", {}), shared.get("train", {})
    lines = [
        f"# Position-encoding extrapolation ({preset} preset)",
        "",
        f"Reproduce: `{command}` ({wall_s / 60:.1f} min wall on this machine, including data preparation "
        "and evaluation; re-running skips trained variants).",
        "",
        "## Setup",
        "",
        f"- Data: `{compare.source}`: {meta['train_documents']} training documents ({meta['train_tokens']:,} tokens), "
        f"{meta['val_documents']} held-out documents ({meta['val_tokens']:,} tokens) never trained on; byte-level "
        f"BPE with {meta['vocab_size']} tokens."
        + (f" Held out: {', '.join(meta['val_names'][:12])}." if meta.get("val_names") else ""),
        f"- Every variant: {json.dumps(model)}; training {json.dumps(train)}; "
        f"{first.get('tokens', 0):,} training tokens each; only `model.position` differs.",
        f"- Evaluation: the first {compare.eval_tokens:,} held-out tokens at each length "
        f"({', '.join(compare.lengths)} of L = {model.get('max_seq_len')}), nonoverlapping windows; RoPE also "
        f"with inference-time {', '.join(compare.scalings)} (factor = length / L).",
        "",
        "| encoding | parameters | training tokens | wall time | tokens/s | val loss (step 0 -> end) | status |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for encoding in compare.encodings:
        summary = summaries.get(encoding)
        if summary:
            speed = f"{summary['tok_per_s']:,.0f}" if summary["tok_per_s"] else "n/a"
            lines.append(
                f"| {encoding} | {summary['params']:,} | {summary['tokens']:,} | {summary['wall_s']:.0f} s | {speed} | "
                f"{summary['initial_val_loss']:.3f} -> {summary['val_loss']:.3f} | {status[encoding]} |"
            )
        else:
            lines.append(f"| {encoding} | | | | | | {status[encoding]} |")
    lines += ["", "## Results", "", tables_markdown(rows), "![perplexity vs length](plot.png)", "",
              "## Training curves", "", "![training curves](train_curves.png)", "",
              "## Loss by position at the longest length", "",
              "Evidence for where each variant breaks: a curve that rises after the dotted line (the trained "
              "length) is failing to use or to ignore positions it never saw.", "",
              "![loss by position](position_loss.png)", "", "## What this shows", ""]
    lines += findings(rows)
    lines += ["", "The paper's setting differs (word-level WikiText-103, 247M parameters, L = 512, 16k+ tokens of "
              "context); these are tiny models trained for minutes, so treat differences in size of effect with care."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Overrides: --compare.key=value, --model.key=value, --train.key=value")
    parser.add_argument("--config", type=Path, default=Path("configs/compare.toml"))
    parser.add_argument("--preset", help="a [presets.NAME] table of the config: quick or full")
    parser.add_argument("--out", help="output folder (default: compare.out of the config)")
    args, overrides = parser.parse_known_args(argv)
    command = " ".join(["python -m eval.compare", *map(shlex.quote, (argv if argv is not None else sys.argv[1:]))])
    if args.out:
        overrides.append(f"--compare.out={args.out}")
    started = time.perf_counter()
    try:
        compare, shared, preset = load_compare_config(args.config, args.preset, overrides)
        out = Path(compare.out)
        out.mkdir(parents=True, exist_ok=True)
        data_dir = prepared_data(compare)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    status: dict[str, str] = {}
    summaries: dict[str, dict] = {}
    for encoding in compare.encodings:
        print(f"\n=== {encoding} ===", flush=True)
        try:
            config = variant_config(shared, encoding, data_dir, compare)
            status[encoding] = train_variant(config)
            summaries[encoding] = training_summary(config)
        except Exception as error:  # a failed variant is reported, not fatal to the others
            traceback.print_exc()
            status[encoding] = f"failed: {type(error).__name__}: {error}".replace("|", "/")[:200]
    trained = [encoding for encoding in compare.encodings if encoding in summaries]
    checkpoints = [str(out / "runs" / encoding) for encoding in trained]
    rows = evaluate_checkpoints(checkpoints, compare.lengths, ["none", *compare.scalings], str(data_dir),
                                compare.eval_tokens, names=trained) if checkpoints else []
    (out / "results.json").write_text(json.dumps({"rows": rows, "training": summaries, "status": status}, indent=1))
    if rows:
        (out / "table.md").write_text(tables_markdown(rows))
        plot_results(rows, out / "plot.png", "Perplexity vs evaluation length (same budget for every encoding)")
        plot_position_loss(rows, out / "position_loss.png")
    plot_training_curves(summaries, out / "train_curves.png")
    wall = time.perf_counter() - started
    write_report(out, compare, shared, data_dir, summaries, status, rows, command, wall, preset)
    print(f"\nwrote {out / 'report.md'} ({wall / 60:.1f} min)")
    return 0 if all(not s.startswith("failed") for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
