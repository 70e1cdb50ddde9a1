"""Sweep one training setting (the learning rate, by default) for every encoding of a comparison, and choose each
encoding's value on its held-out loss at the trained length, never at longer lengths.

    python -m experiments.sweep --preset quick --values 1e-3,3e-3,1e-2,3e-2 --compare.seeds=1,2
    python -m experiments.sweep --preset frontier --key train.lr --values 1e-3,3e-3,1e-2,3e-2 --compare.seeds=1,2

One comparison (experiments.compare) per value, each in OUT/KEY=VALUE with every other setting of the preset (and
the overrides), on the data prepared once in OUT/data, evaluated at 1x only: its held-out perplexity, on the same tokens for every encoding, value and seed.
Re-running resumes, as a comparison does. Writes OUT/sweep.md and OUT/sweep.json: per encoding and value the 1x loss
(nats, mean [95% t interval] over seeds), the value with the lowest mean, and that value against the preset's own,
paired by seed (the same seed is the same initialisation and data order for every value): "better" where the
interval of the difference lies below 0, else "within noise" (the preset's value serves). The choice goes into a
preset as [compare.train_settings] (docs/baselines.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path

from commands import add_out, comma_list, command_parser, results_json
from errors import ConfigError, cli_command
from eval.stats import Estimate, bounded_t_interval, t_interval
from experiments.compare.cli import experiment_arguments, run_comparison
from experiments.compare.config import load_compare_config
from experiments.compare.layout import invocations, record_invocation
from experiments.compare.running import prepared_data
from experiments.jobs import machine_description
from model.fields import parse_override_value, toml_value
from model.folder_lock import FolderLock


def value_folder(key: str, value: object) -> str:
    return f"{key.split('.')[-1]}={value}"


def losses_at_1x(folder: Path) -> dict[str, dict[int, float]]:
    """label -> seed -> held-out loss (nats) at 1x, from a comparison's results.json (the variants as trained)."""
    results = json.loads((folder / "results.json").read_text())
    found: dict[str, dict[int, float]] = {}
    for cell in results["cells"]:
        if cell["method"] == "none" and math.isclose(cell["multiple"], 1.0):
            found[cell["label"]] = {int(seed): math.log(ppl) for seed, ppl in cell["ppl_per_seed"].items()}
    return found


def choose(by_value: dict[str, dict[int, float]], default: str) -> dict:
    """For one encoding (value -> seed -> loss): the value with the lowest mean loss, and its loss less the
    default's, paired by seed, with the verdict."""
    means = {value: sum(seeds.values()) / len(seeds) for value, seeds in by_value.items() if seeds}
    best = min(means, key=means.get)
    common = sorted(set(by_value[best]) & set(by_value.get(default, {})))
    difference = t_interval([by_value[best][seed] - by_value[default][seed] for seed in common])
    if best == default:
        verdict = "the preset's value is best"
    elif difference is not None and difference.high is not None and difference.high < 0:
        verdict = "better than the preset's value"
    else:
        verdict = "within noise of the preset's value"
    return {"best": best, "difference": difference, "verdict": verdict,
            "chosen": best if verdict == "better than the preset's value" else default}


def write_sweep(out: Path, key: str, values: list[str], default: str, losses: dict[str, dict[str, dict[int, float]]],
                command: str) -> None:
    """OUT/sweep.md and sweep.json from value -> label -> seed -> loss."""
    labels = list(dict.fromkeys(label for by_label in losses.values() for label in by_label))
    table = ["| encoding | " + " | ".join(f"{key} = {value}" + (" (preset)" if value == default else "")
                                           for value in values) + " | lowest | lowest - preset (paired) | choice |",
             "|---|" + "---:|" * len(values) + "---|---:|---|"]
    record: dict = {"key": key, "values": values, "default": default, "encodings": {}}
    for label in labels:
        by_value = {value: losses[value].get(label, {}) for value in values if value in losses}
        estimates = {value: bounded_t_interval(list(seeds.values()), low=0.0)  # a loss: its t interval cut at 0
                     for value, seeds in by_value.items() if seeds}
        cells = [estimates[value].format(3) if value in estimates and estimates[value] else "n/a" for value in values]
        chosen = choose({v: s for v, s in by_value.items() if s}, default) if estimates else None
        if chosen is None:
            table.append(f"| {label} | " + " | ".join(cells) + " | n/a | n/a | n/a |")
            continue
        difference: Estimate | None = chosen["difference"]
        table.append(f"| {label} | " + " | ".join(cells) + f" | {chosen['best']} | "
                     f"{difference.format(3, signed=True) if difference else 'n/a'} | {chosen['chosen']} "
                     f"({chosen['verdict']}) |")
        record["encodings"][label] = {
            "loss": {value: {"seeds": {str(s): v for s, v in by_value[value].items()},
                             **(estimates[value].__dict__ if estimates.get(value) else {})} for value in by_value},
            "best": chosen["best"], "chosen": chosen["chosen"], "verdict": chosen["verdict"],
            "difference": difference.__dict__ if difference else None}
    records = invocations(out)
    wall = sum(r["wall_s"] for r in records)
    lines = [f"# Sweep of {key}", "",
             f"Reproduce: `{command}`. All {len(records)} invocation(s) on record: {wall / 60:.1f} min wall on "
             f"{machine_description()}.", "",
             f"Held-out loss at 1x (nats; mean [95% t interval] over seeds) of every encoding trained with each value "
             f"of {key}, all else as the preset. The choice is the lowest mean where its difference from the preset's "
             f"value ({default}), paired by seed, lies below 0; otherwise the preset's value (within noise).", "",
             *table, ""]
    (out / "sweep.md").write_text("\n".join(lines))
    (out / "sweep.json").write_text(results_json(record))


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.sweep", __doc__, epilog="Overrides for every comparison: --compare.key=value, "
                                                                 "--model.key=value, --train.key=value")
    parser.add_argument("--config", type=Path, default=Path("configs/compare.toml"), metavar="FILE",
                        help="TOML compare config")
    parser.add_argument("--preset", help="the [presets.NAME] every comparison starts from")
    parser.add_argument("--key", default="train.lr", help="the setting swept, as section.key")
    parser.add_argument("--values", required=True, help="comma-separated values of --key (at least two)")
    add_out(parser, "output folder (default: runs/sweep-PRESET)")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides, command = experiment_arguments(build_parser(), argv)
    values = comma_list(args.values)
    if len(values) < 2 or "." not in args.key or args.key.startswith("compare."):
        raise ConfigError("--values needs at least two values, and --key a [model] or [train] setting such as "
                          "train.lr")
    out = Path(args.out or f"runs/sweep-{args.preset or 'default'}")
    base = [*overrides, "--compare.lengths=1x", "--compare.methods=[]", "--compare.snapshots=[]"]
    preset_compare, shared, _ = load_compare_config(args.config, args.preset, base)
    section, name = args.key.split(".", 1)
    if section == "train":  # an encoding's own value of the swept setting would override every swept value
        kept = {label: {key: value for key, value in settings.items() if key != name}
                for label, settings in preset_compare.train_settings.items()}
        if kept != preset_compare.train_settings:
            own = {label: settings[name] for label, settings in preset_compare.train_settings.items() if name in settings}
            print(f"note: the sweep sets {args.key} for every encoding, so the preset's own values of it are left "
                  f"out: {own}", file=sys.stderr)
            base.append(f"--compare.train_settings={toml_value(kept)}")
            _, shared, _ = load_compare_config(args.config, args.preset, base)
    own = shared.get(section, {}).get(name)
    default = next((value for value in values if parse_override_value(value) == own), None)
    if default is None:
        raise ConfigError(f"--values must include the preset's own {args.key} ({own}), the baseline each choice is "
                          "measured against")
    configs = {value: load_compare_config(args.config, args.preset, [
        *base, f"--{args.key}={value}", f"--compare.out={out / value_folder(args.key, value)}"])
        for value in values}  # every value's settings are checked before anything trains
    started, status = time.perf_counter(), 0
    with FolderLock(out, "sweep"):
        # The data once, in OUT/data (a preparation already there with the same settings is kept), then a copy in
        # each value's comparison, which compare takes as its own: every value trains and scores the same tokens.
        first = next(iter(configs.values()))[0]
        data = prepared_data(dataclasses.replace(first, out=str(out)))
        for compare, _, _ in configs.values():
            if not (Path(compare.out) / "data" / "meta.json").exists():
                shutil.copytree(data, Path(compare.out) / "data", dirs_exist_ok=True)
        for value, (compare, shared_values, preset) in configs.items():
            print(f"\n=== {args.key} = {value} ===", flush=True)
            with FolderLock(Path(compare.out), "comparison"):
                status |= run_comparison(compare, shared_values, f"{preset}, {args.key} = {value}",
                                         f"{command} ({args.key} = {value})", time.perf_counter())
        wall = time.perf_counter() - started
        record_invocation(out, command, wall, values=values)
        losses = {value: losses_at_1x(out / value_folder(args.key, value)) for value in values
                  if (out / value_folder(args.key, value) / "results.json").exists()}
        write_sweep(out, args.key, values, default, losses, command)
    print(f"\nwrote {out / 'sweep.md'} ({wall / 60:.1f} min)")
    return status


if __name__ == "__main__":
    sys.exit(main())
