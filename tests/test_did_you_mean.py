"""Mistakes a newcomer makes, each refused with the nearest right name (exit 2, one line): a flag typed the argparse
way or with underscores, a misspelled key on the command line or in a TOML file (which is named), a misspelled data
or checkpoint folder, source or preset. A typo in a training command's flag or key is refused before torch loads."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from commands import did_you_mean, nearby_folder, nearest
from data.prepare import main as prepare_main
from errors import ConfigError
from scripts.generate import main as generate
from tests.conftest import ROOT, train_micro_run
from train.args import config_keys
from train.config import SECTION_CLASSES, load_run_config
from train.pretrain import main as pretrain
from train.sft import main as sft


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "".join(lines), lines
    return lines[-1]


def test_the_nearest_name_is_suggested_only_when_one_is_close(tmp_path):
    assert nearest("max_step", ["max_steps", "lr"]) == "max_steps"
    assert nearest("learning_rate", ["max_steps", "lr"]) is None
    assert did_you_mean("stdlb", ["stdlib", "pg19"]) == "; did you mean stdlib?"
    assert did_you_mean("xyz", ["stdlib", "pg19"]) == ""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.json").write_text("{}")
    (tmp_path / "demo2").mkdir()  # close, but not a checkpoint folder
    assert nearby_folder(tmp_path / "demoo", lambda folder: (folder / "config.json").exists()) == tmp_path / "demo"
    assert nearby_folder(tmp_path / "demo3", lambda folder: (folder / "config.json").exists()) == tmp_path / "demo"
    assert nearby_folder(tmp_path / "elsewhere", lambda folder: True) is None
    assert nearby_folder(tmp_path / "nowhere" / "demo", lambda folder: True) is None


def test_a_flag_typed_the_argparse_way_names_the_override(capsys):
    assert pretrain(["--max-steps", "100"]) == 2
    assert error_line(capsys).endswith("did you mean --train.max_steps=100?")
    assert pretrain(["--train.max_steps", "100"]) == 2  # a space for "="
    assert error_line(capsys).endswith("did you mean --train.max_steps=100?")
    assert pretrain(["--overwite"]) == 2  # a flag of the command itself
    assert error_line(capsys).endswith("did you mean --overwrite?")
    assert pretrain(["configs/tiny.toml"]) == 2  # the config without its flag
    assert error_line(capsys).endswith("did you mean --config configs/tiny.toml?")


def test_an_unknown_flag_of_a_plain_command_names_the_nearest(capsys):
    with pytest.raises(SystemExit) as stop:
        generate(["--checkpoint", "runs/demo", "--prompt", "def ", "--max_new_tokens", "5"])
    assert stop.value.code == 2
    assert error_line(capsys).endswith("unrecognized arguments: --max_new_tokens 5; did you mean --max-new-tokens?")


def test_a_misspelled_key_names_the_nearest_key(capsys):
    assert pretrain(["--train.max_step=100"]) == 2
    assert error_line(capsys) == ("error: override '--train.max_step=100': unknown key train.max_step; did you mean "
                                  "train.max_steps?")
    assert pretrain(["--model.postion=alibi"]) == 2
    assert error_line(capsys).endswith("did you mean model.position?")
    assert pretrain(["--model.max_steps=3"]) == 2  # the key of another section
    assert error_line(capsys).endswith("did you mean train.max_steps?")
    assert pretrain(["--trian.max_steps=3"]) == 2
    assert error_line(capsys).endswith("unknown section [trian]; did you mean [train]?")
    with pytest.raises(ConfigError, match=r"valid keys of \[train\] are seed, batch_size"):  # nothing close: the list
        load_run_config(None, ["--train.learning_rate=1e-3"])


def test_a_former_encoding_key_still_names_its_new_spelling_not_a_near_miss():
    """rope_fraction is close to rope_scaling by spelling, but it is an encoding setting of older configs."""
    with pytest.raises(ConfigError, match=r"model.rope_fraction is now model.position_args.rope.fraction"):
        load_run_config(None, ["--model.rope_fraction=0.5"])


def test_a_misspelled_key_in_a_toml_file_names_the_file(tmp_path, capsys):
    config = tmp_path / "mine.toml"
    config.write_text("[train]\nmax_step = 3\n")
    assert pretrain(["--config", str(config)]) == 2  # the command, before torch
    assert error_line(capsys) == f"error: {config}: unknown key train.max_step; did you mean train.max_steps?"
    config.write_text('[model]\npostion = "alibi"\n')  # [model]: checked with the encodings' former keys
    with pytest.raises(ConfigError, match=rf"^{config}: unknown key model.postion; did you mean model.position\?$"):
        load_run_config(config)
    config.write_text("[trian]\nlr = 1\n")
    with pytest.raises(ConfigError, match=rf"^{config}: unknown section \[trian\]; did you mean \[train\]\?$"):
        load_run_config(config)


def test_a_misspelled_data_folder_names_the_prepared_one_beside_it(prepared_data, tmp_path, capsys):
    typo = prepared_data.parent / (prepared_data.name[:-1] + "x")  # code -> codx
    assert pretrain([f"--data.dir={typo}", f"--out.dir={tmp_path / 'out'}", "--train.max_steps=1"]) == 2
    line = error_line(capsys)
    assert line.endswith(f"{typo} is not a prepared data folder; did you mean {prepared_data}?"), line
    assert "data.prepare" not in line  # the fix is the folder that exists, not preparing the typo


def test_a_misspelled_checkpoint_folder_names_the_one_beside_it(prepared_data, tmp_path, capsys):
    run = train_micro_run(prepared_data, tmp_path / "demo")
    capsys.readouterr()
    assert generate(["--checkpoint", str(tmp_path / "demoo"), "--prompt", "def "]) == 2
    assert error_line(capsys) == f"error: {tmp_path / 'demoo'}: no such checkpoint folder; did you mean {run}?"
    assert sft([f"--checkpoint={tmp_path / 'dem'}", f"--out.dir={tmp_path / 'sft'}"]) == 2
    assert error_line(capsys).endswith(f"did you mean {run}?")


def test_a_misspelled_source_names_the_named_source(tmp_path, capsys):
    assert prepare_main(["--data", "stdlb", "--out", str(tmp_path / "data")]) == 2
    assert error_line(capsys).endswith("did you mean stdlib?")


def test_a_misspelled_preset_and_flag_of_an_experiment_name_the_nearest(capsys):
    from experiments.engine import main

    assert main("experiments.compare", ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quik"]) == 2
    assert error_line(capsys).endswith("did you mean quick?")
    assert main("experiments.compare", ["--presets", "quick"]) == 2
    assert error_line(capsys).endswith("did you mean --preset?")


def test_the_names_checked_before_torch_are_the_config_dataclasses_fields():
    """train/args.py takes every section's keys from the run config's dataclasses, section by section, in the run
    config's order; importing it loads no torch (test_a_typo_in_a_training_flag_or_key_is_refused_before_torch_loads)."""
    assert list(config_keys()) == list(SECTION_CLASSES)
    for section, cls in SECTION_CLASSES.items():
        assert config_keys()[section] == tuple(field.name for field in dataclasses.fields(cls)), section


@pytest.mark.parametrize("command, argv", [
    ("train.pretrain", ["--max-steps", "100"]),
    ("train.pretrain", ["--train.max_step=100"]),
    ("train.pretrain", ["--model.postion=alibi"]),
    ("train.sft", ["--trian.lr=1"]),
])
def test_a_typo_in_a_training_flag_or_key_is_refused_before_torch_loads(command, argv):
    """What makes the refusal fast (well under a second, against seconds for torch and the model's registries):
    the command line is checked before the first import of torch."""
    script = (f"import sys\nfrom {command} import main\nrc = main({argv!r})\n"
              "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules)))\n"
              "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", "import json\n" + script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "did you mean" in done.stderr, done.stderr
    assert json.loads(done.stdout) == [], done.stdout
