"""What the training entry points share once their command line is checked (train/args.py): --resume and the
vocabulary check."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

from errors import ConfigError
from model.checkpoint import has_checkpoint, load_trainer_state
from train.config import RunConfig, build_run_config

# What --resume may change in a run, each with what it means.
RESUME_CHANGEABLE = {
    "train.max_steps": "the run goes on to the new end; its learning-rate schedule is stretched to it from here on",
    "train.log_interval": "", "train.eval_interval": "", "train.save_interval": "", "train.device": "",
    "train.compile": "", "train.fused_loss": "", "train.nonfinite": "", "train.max_nonfinite_skips": "", "out.overwrite": "",
    "train.report_to": "", "train.tracker_group": "",
}


def resolve_resume(requested: RunConfig, overrides: list[str], resume: bool) -> tuple[RunConfig, bool]:
    """--resume continues the run saved in out.dir with the run's own settings: a key set on the command line
    (--section.key=value) that differs is applied if --resume may change it (RESUME_CHANGEABLE, with a note) and
    refused otherwise; values from a --config file or the defaults never override the run's. A folder with no
    checkpoint yet (a run killed before its first save) starts from the beginning, with a note.

    Returns the config to run and whether to resume."""
    if not resume:
        return requested, False
    out = Path(requested.out.dir)
    if not has_checkpoint(out):
        print(f"note: --resume: {out} holds no checkpoint yet (the run stopped before its first save); "
              "starting it from the beginning", file=sys.stderr)
        return requested, False
    saved = build_run_config(copy.deepcopy(load_trainer_state(out).get("run_config", {})), f"{out} (saved run)",
                             saved=True)
    values, wanted = saved.to_dict(), requested.to_dict()
    values["out"]["dir"] = wanted["out"]["dir"]  # the folder resumed is the run, wherever it was first written
    explicit = dict.fromkeys(override[2:].split("=", 1)[0] for override in overrides if override.startswith("--"))
    refused, applied = [], []
    for dotted in explicit:
        section, key = dotted.split(".")[:2]  # a key of a table (model.position_args.t5.max_distance): the table
        if section not in values or key not in values[section] or values[section][key] == wanted[section][key]:
            continue
        if dotted in RESUME_CHANGEABLE:
            values[section][key] = wanted[section][key]
            applied.append(f"{dotted} = {wanted[section][key]!r}" + (f" ({RESUME_CHANGEABLE[dotted]})"
                                                                    if RESUME_CHANGEABLE[dotted] else ""))
        else:
            refused.append(f"{dotted} ({values[section][key]!r} in the run, {wanted[section][key]!r} asked)")
    if refused:
        raise ConfigError(f"--resume continues the run in {out} with its own settings, and these cannot change in a "
                          f"run: {'; '.join(refused)}; start a new run in another --out.dir to change them")
    ignored = sorted(f"{section}.{key}" for section, keys in wanted.items() for key, value in keys.items()
                     if f"{section}.{key}" not in explicit and values[section].get(key) != value)
    if ignored:
        print(f"note: --resume keeps the run's own settings for {', '.join(ignored)} (from the config file or the "
              "defaults); set one on the command line to change it where --resume allows", file=sys.stderr)
    for line in applied:
        print(f"note: --resume changes {line}", file=sys.stderr)
    return build_run_config(values, str(out)), True


def check_vocab(config: RunConfig, tokenizer_vocab: int, where: str) -> None:
    if tokenizer_vocab > config.model.vocab_size:
        raise ConfigError(
            f"the tokenizer in {where} has {tokenizer_vocab} tokens but model.vocab_size is "
            f"{config.model.vocab_size}; set --model.vocab_size={tokenizer_vocab} or larger"
        )
