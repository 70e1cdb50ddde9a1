"""Sweep one setting (train.lr by default) for every encoding of a comparison, and choose each encoding's value on its
held-out loss at the trained length, never longer: its lowest mean where that, less the preset's value's loss paired by
seed, lies below 0 (eval/verdicts.py sweep_choice). The sweep's [compare], [model], [train] and [runtime] tables (a
compare config and preset) set one comparison per value, at 1x only, its cells named KEY=VALUE/NAME, on one data set
(OUT/work/data), without the encodings' own values of the key (compare.train_settings). Writes OUT/sweep.md.
    python -m experiments.sweep --config configs/compare.toml --preset quick --values 1.5e-3,3e-3,6e-3 '--compare.seeds=[1, 2]'
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from errors import ConfigError
from eval.stats import bounded_t_interval, t_interval
from eval.verdicts import sweep_choice
from experiments import compare
from experiments.engine import Records, Study, option
from experiments.render import cell, provenance, write
from model.fields import check_keys, parse_override_value, set_dotted
from model.methods import NONE


@dataclass
class Settings:
    key: str = option("train.lr", "the setting swept: a key of [model] or [train]")
    values: list = option([], "its values, at least two, one of them the preset's own (the baseline of the choice)")
    compare: dict = option({}, "[compare]: the comparison's settings (--config configs/compare.toml --preset NAME)")
    model: dict = option({}, "[model]: the model settings of every value")
    train: dict = option({}, "[train]: the training settings of every value")
    runtime: dict = option({}, "[runtime]: how every run computes")
    out: str = option("runs/sweep", "the study's folder")

    def __post_init__(self) -> None:
        section, _, name = self.key.partition(".")
        own = getattr(self, section, {}).get(name) if section in ("model", "train") else None
        if len(self.values) < 2 or own is None or not any(value_of(value) == own for value in self.values):
            raise ConfigError(f"sweep: --values needs at least two values, one of them the preset's own {self.key} "
                              f"({own}), and --key a [model] or [train] setting the preset sets, such as train.lr")
        self.default = next(str(value) for value in self.values if value_of(value) == own)


def value_of(value):
    return parse_override_value(value) if isinstance(value, str) else value  # "3e-3" as a sweep config may keep it


def comparison(settings: Settings, value) -> compare.Settings:
    values = copy.deepcopy({**settings.compare, "model": settings.model, "train": settings.train,
                            "runtime": settings.runtime})
    set_dotted(values, settings.key, value_of(value), "sweep.key")
    values["train_settings"] = {name: {k: v for k, v in own.items() if f"train.{k}" != settings.key}
                                for name, own in values.get("train_settings", {}).items()}
    return compare.Settings(**check_keys(compare.Settings, {**values, "lengths": ["1x"], "methods": [], "snapshots": [],
                                                            "probes": [], "snapshot_probes": [], "tasks": [],
                                                            "out": settings.out}, "compare"))


def report(records: Records) -> None:
    settings, losses = records.settings, {}
    for one, record in records.done():  # the comparison's one length is 1x
        loss = next(v for k, v in record["evaluation"]["nll"].items() if k.split("@")[0] == NONE)
        value = one["name"].split("/")[0].split("=", 1)[1]
        losses.setdefault(one["encoding"], {}).setdefault(value, {})[one["seed"]] = loss
    values = [str(value) for value in settings.values]
    lines = [f"# Sweep of {settings.key}", "", provenance(records.invocations, [
        s for s in map(records.seconds, records.cells) if s is not None]), "", f"Held-out loss at 1x (nats; mean [95% t "
        f"interval] over seeds) of every encoding trained with each value of {settings.key}, all else as the preset. The"
        f" choice is the lowest mean where its difference from the preset's value ({settings.default}), paired by seed, "
        "lies below 0; otherwise the preset's value (within noise).", "", "| encoding | " + " | ".join(
            f"{settings.key} = {value}" + (" (preset)" if value == settings.default else "") for value in values)
        + " | lowest | lowest - preset (paired) | choice |", "|---|" + "---:|" * len(values) + "---|---:|---|"]
    for encoding, by_value in losses.items():
        estimates = {value: bounded_t_interval(list(seeds.values()), low=0.0) for value, seeds in by_value.items()}
        best = min(estimates, key=lambda value: estimates[value].mean)
        difference = t_interval([by_value[best][seed] - by_value[settings.default][seed] for seed in by_value[best]
                                 if seed in by_value.get(settings.default, {})])  # paired by seed
        lines.append(f"| {encoding} | " + " | ".join(cell(estimates.get(value), 3) for value in values) + f" | {best} | "
                     f"{cell(difference, 3, signed=True)} | " + "{} ({}) |".format(*sweep_choice(best, settings.default,
                                                                                                difference)))
    write(records.out, "sweep.md", "\n".join(lines + differences(losses, values, settings.key)) + "\n")


def differences(losses: dict[str, dict[str, dict]], values: list[str], key: str) -> list[str]:
    """Each encoding less the reference (RoPE where swept, else the first encoding), paired by seed: at every value,
    and each at its own lowest-mean value against the reference at its own (is an ordering the rate's?)."""
    reference = "rope" if "rope" in losses else next(iter(losses))
    if len(losses) < 2:
        return []

    def lowest(encoding: str) -> str:
        return min(losses[encoding], key=lambda value: t_interval(list(losses[encoding][value].values())).mean)

    def paired(encoding: str, value: str, reference_value: str) -> str:
        own, base = losses[encoding].get(value, {}), losses[reference].get(reference_value, {})
        return cell(t_interval([own[seed] - base[seed] for seed in own if seed in base]) if own and base else None, 3,
                    signed=True)

    lines = ["", f"## Each encoding less {reference}, paired by seed", "", f"The difference in held-out loss at 1x "
             f"from {reference}, paired by seed, nats (mean [95% t interval] over seeds): at each value of {key}, and "
             f"each at its own lowest-mean value against {reference} at its own ({lowest(reference)}).", "",
             "| encoding | " + " | ".join(f"{key} = {value}" for value in values) + " | each at its lowest |",
             "|---|" + "---:|" * (len(values) + 1)]
    for encoding in losses:
        if encoding != reference:
            lines.append(f"| {encoding} | " + " | ".join(paired(encoding, value, value) for value in values)
                         + f" | {paired(encoding, lowest(encoding), lowest(reference))} ({lowest(encoding)}) |")
    return lines


STUDY = Study("experiments.sweep", Settings, lambda settings, context: [
    {**one, "name": f"{settings.key}={value}/{one['name']}"} for value in settings.values
    for one in compare.cells(comparison(settings, value), context)], compare.measure, report,
    lambda settings, context: compare.prepare(comparison(settings, settings.values[0]), context), __doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.sweep"))
