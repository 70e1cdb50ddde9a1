"""Run configs: TOML + overrides, strict keys and types, round trip."""
import tomllib
from pathlib import Path

import pytest

from errors import ConfigError
from train.config import build_run_config, load_run_config, parse_override_value, to_toml

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    from eval.compare.config import load_compare_config

    paths = sorted((ROOT / "configs").glob("*.toml"))
    assert {"tiny.toml", "compare.toml", "sft_stdlib.toml", "passkey_finetune.toml"} <= {path.name for path in paths}
    for path in paths:
        if path.name == "compare.toml":
            for preset in ("quick", "full", "newer"):
                compare, shared, _ = load_compare_config(path, preset, [])
                assert compare.encodings and shared["model"]["max_seq_len"] > 0
        elif path.name == "ladder.toml":
            from eval.ladder import load_ladder_config

            assert len(load_ladder_config(path).rungs) >= 3
        else:
            assert load_run_config(path).train.max_steps > 0, path


def test_overrides_take_precedence_over_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nlr = 0.01\nmax_steps = 5\n[model]\ndim = 128\n')
    config = load_run_config(path, ["--train.lr=2e-4", "--out.dir=runs/x", "--train.compile=true"])
    assert config.train.lr == 2e-4
    assert config.train.max_steps == 5
    assert config.model.dim == 128
    assert config.out.dir == "runs/x"
    assert config.train.compile is True


def test_resolved_config_round_trips_through_toml():
    config = load_run_config(None, ["--model.position=none", "--train.batch_size=3"])
    assert build_run_config(tomllib.loads(to_toml(config))) == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--train.learning_rate=1e-3"], r"train: unknown key\(s\) \['learning_rate'\]; valid keys are"),
        (["--train.max_steps=ten"], "train.max_steps: expected int, got str 'ten'"),
        (["--train.batch_size=2.5"], "train.batch_size: expected int, got float"),
        (["--train.compile=1"], "train.compile: expected bool, got int"),
        (["--optim.lr=1"], "unknown section 'optim'"),
        (["--train.dtype=fp8"], "train.dtype must be"),
        (["train.lr=1"], "must look like --section.key=value"),
    ],
)
def test_config_errors_are_clear(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


def test_unknown_key_in_file_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[trian]\nlr = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: unknown section\(s\) \['trian'\]"):
        load_run_config(path)


def test_override_values_are_parsed_as_toml():
    assert parse_override_value("3e-4") == 3e-4
    assert parse_override_value("true") is True
    assert parse_override_value("runs/x") == "runs/x"
    assert parse_override_value('"12"') == "12"
