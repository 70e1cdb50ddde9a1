"""Run configs: TOML + overrides, strict keys and types, round trip."""
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from errors import ConfigError
from model.config import ModelConfig
from train.config import build_run_config, load_run_config, parse_override_value, to_toml

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    from tests.test_compare import settings_of

    paths = sorted((ROOT / "configs").glob("*.toml"))
    assert {"tiny.toml", "compare.toml", "sft_stdlib.toml", "passkey_finetune.toml"} <= {path.name for path in paths}
    for path in paths:
        if path.name == "compare.toml":
            for preset in ("quick", "full", "newer", "frontier", "frontier2", "gpu"):
                compare = settings_of("--config", str(path), "--preset", preset)
                assert compare.encodings and compare.model["max_seq_len"] > 0
        elif path.name.startswith(("ladder", "ruler")):
            from experiments import ladder, ruler
            from experiments.engine import build_parser, resolve_settings

            study = (ladder if path.name.startswith("ladder") else ruler).STUDY
            args, overrides = build_parser(study).parse_known_args(["--config", str(path)])
            assert resolve_settings(study, args, overrides), path
        else:
            assert load_run_config(path).train.max_steps > 0, path


def test_the_gpu_preset_is_the_small_grid_at_ten_times_the_full_budget_on_workers_sharing_a_gpu():
    from tests.test_compare import settings_of

    path = ROOT / "configs" / "compare.toml"
    tokens = {}
    for preset in ("full", "gpu"):
        compare = settings_of("--config", str(path), "--preset", preset)
        train = build_run_config({"model": compare.model, "train": compare.train}).train
        tokens[preset] = train.max_steps * train.batch_size * compare.model["max_seq_len"]
    model = compare.model
    assert (model["n_layers"], model["dim"], model["n_heads"], model["max_seq_len"]) == (6, 384, 6, 128)
    assert tokens["gpu"] >= 10 * tokens["full"]
    assert compare.lengths[-1] == "16x" and len(compare.seeds) == 5 and compare.workers > 1
    assert set(compare.encodings) == {"none", "sinusoidal", "alibi", "t5", "rope"}
    assert set(compare.methods) == {"ntk", "yarn"}


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
        (["--train.learning_rate=1e-3"], r"unknown key train.learning_rate; valid keys of \[train\] are"),
        (["--train.max_steps=ten"], "train.max_steps: expected int, got str 'ten'"),
        (["--train.batch_size=2.5"], "train.batch_size: expected int, got float"),
        (["--train.compile=1"], "train.compile: expected bool, got int"),
        (["--optim.lr=1"], r"unknown section \[optim\]"),
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
    with pytest.raises(ConfigError, match=r"bad.toml: unknown section \[trian\]; did you mean \[train\]\?"):
        load_run_config(path)


def test_override_values_are_parsed_as_toml():
    assert parse_override_value("3e-4") == 3e-4
    assert parse_override_value("true") is True
    assert parse_override_value("runs/x") == "runs/x"
    assert parse_override_value('"12"') == "12"


def test_an_encodings_settings_are_a_table_of_its_own_set_by_dotted_overrides_and_saved_whole(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nposition = "t5"\nposition_args = { t5 = { num_buckets = 16 } }\n')
    config = load_run_config(path, ["--model.position_args.t5.max_distance=64"])
    assert config.model.position_args == {"t5": {"num_buckets": 16, "max_distance": 64}}
    assert build_run_config(tomllib.loads(to_toml(config))) == config
    fire = load_run_config(None, ["--model.position=fire", "--model.max_seq_len=48"]).model
    assert fire.position_args == {"fire": {"mlp_width": 32, "threshold": 48}}  # every setting, derived ones as numbers
    hybrid = load_run_config(None, ['--model.position_layers=["rope", "t5"]', "--model.n_layers=2"]).model
    assert set(hybrid.position_args) == {"rope", "t5"}  # each encoding the layers use, rope's first


def test_a_saved_config_with_the_flat_encoding_keys_reads_as_the_position_args_it_was():
    """Checkpoints and runs saved before model.position_args spell the encodings' settings as flat keys, every one
    of them, used or not: the keys of the encodings the model uses become its position_args, the rest had no
    effect and are dropped; user input spelled that way is refused with the new name."""
    from model.config import ModelConfig

    flat = dict(position="rope", position_layers=["rope", "t5"], n_layers=2, rope_fraction=0.5, rope_p=1.0,
                t5_num_buckets=8, t5_max_distance=16, shaw_max_distance=3, learned_clamp=False, fire_threshold=0,
                cope_positions=0, xpos_scale_base=512.0, sinusoidal_embedding="fairseq")
    config = ModelConfig.from_saved(flat)
    assert config.position_args == {"rope": {"fraction": 0.5, "p": 1.0}, "t5": {"num_buckets": 8, "max_distance": 16}}
    assert ModelConfig.from_saved(config.to_dict()) == config  # today's form is read as it is
    with pytest.raises(ConfigError, match="model.rope_fraction is now model.position_args.rope.fraction or "
                                          "model.position_args.xpos.fraction"):
        ModelConfig.from_dict({"rope_fraction": 0.5})


def test_each_former_key_names_a_setting_of_an_encoding_that_has_it():
    """model/legacy_keys.py's table is kept apart from the registry (so that reading it loads no torch): every
    (encoding, setting) it names is a field of that registered encoding's Settings."""
    import dataclasses

    from model.encodings import POSITION_ENCODINGS
    from model.legacy_keys import LEGACY_KEYS

    for old, targets in LEGACY_KEYS.items():
        for name, setting in targets:
            assert name in POSITION_ENCODINGS and POSITION_ENCODINGS[name].Settings is not None, (old, name)
            assert setting in {field.name for field in dataclasses.fields(POSITION_ENCODINGS[name].Settings)}, old


def test_model_config_names_no_encoding_and_imports_the_three_front_checks_inside_its_check():
    """model/config.py imports the field checks and the table of former keys at its top, and the plug-ins' three
    front checks (encodings, inference-time methods, attention backends) inside ModelConfig.check_plugins only; it
    names no registered encoding."""
    import ast

    from model.encodings import POSITION_ENCODINGS

    source = (ROOT / "model" / "config.py").read_text()
    tree = ast.parse(source)
    top = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)} | \
        {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    assert {name for name in top if name.startswith("model")} == {"model.fields", "model.legacy_keys"}, top
    inner = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} - top
    assert inner == {"model.encodings", "model.methods", "model.attention.registry"}, inner
    strings = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)}
    assert not [name for name in POSITION_ENCODINGS if name in strings and name != "rope"], strings
    assert strings & {"rope"} == {"rope"}  # the one default: model.position = "rope"


def test_importing_model_config_loads_no_plug_in_nor_torch_and_a_typo_is_refused_before_torch_loads():
    """`import model.config` loads no registry and not torch; a config whose own fields are wrong is refused before
    the plug-ins' checks load them. Python's import-time report names what `import` statements load; the registry
    loads its encodings with importlib.import_module, which that report leaves out, so sys.modules is read too."""
    script = ("import sys, model.config\n"
              "try:\n    model.config.ModelConfig.from_dict({'n_layer': 2})\n"
              "except Exception as error:\n    print(type(error).__name__, file=sys.stderr)\n"
              "print(*sys.modules)")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ConfigError" in done.stderr
    reported = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "model.config" in reported and "model.fields" in reported, reported  # the report is read

    def heavy(names: list[str]) -> list[str]:
        return [name for name in names if name.startswith("model.encodings") or name.split(".")[0] == "torch"
                or name in ("model.rope", "model.methods")]

    assert not heavy(reported), heavy(reported)
    assert not heavy(done.stdout.split()), heavy(done.stdout.split())


def test_plug_in_settings_are_checked_once_when_a_config_is_built(tmp_path, monkeypatch):
    """ModelConfig checks its own fields, then the plug-ins' settings, when it is built: a run's config, a
    checkpoint's config.json and a config built in code refuse a bad setting by its key. Neither the model nor a
    view checks again, and a completed config built again is equal (the checks are idempotent)."""
    import model.encodings as encodings
    from model.checkpoint import load_config
    from model.transformer import Transformer
    from train.config import build_run_config

    bad = {"vocab_size": 32, "dim": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "max_seq_len": 8,
           "position": "alibi", "position_args": {"t5": {"max_distance": 64}}}
    for attempt in (lambda: ModelConfig(**bad), lambda: build_run_config({"model": bad})):
        with pytest.raises(ConfigError, match="model.position_args: settings for"):
            attempt()
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="model.position_args: settings for"):
        load_config(tmp_path)
    good = ModelConfig(**{**bad, "position": "t5"})
    completed = dict(good.position_args["t5"])
    assert completed["max_distance"] == 64 and len(completed) > 1  # the encoding's defaults filled in
    assert ModelConfig.from_dict(good.to_dict()) == good  # idempotent
    calls = []
    check = encodings.check_config
    monkeypatch.setattr(encodings, "check_config", lambda config: calls.append(config) or check(config))
    model = Transformer(good)
    model.with_settings(attention_methods=[{"method": "window", "window": 4}])
    assert len(calls) == 1  # the view's config, built once; the model's own was checked before


def test_config_json_holds_a_written_when_set_setting_only_where_it_is_set(tmp_path):
    """A checkpoint that uses none of Gemma's block settings is written as it was before they existed (its bytes key
    the cells of a study); one that sets them keeps every one, and both read back as they were."""
    plain = ModelConfig(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, vocab_size=128)
    plain.save(tmp_path / "plain.json")
    saved = json.loads((tmp_path / "plain.json").read_text())
    assert not set(ModelConfig.WRITTEN_WHEN_SET) & set(saved)
    assert set(saved) == set(plain.to_dict()) - set(ModelConfig.WRITTEN_WHEN_SET)
    assert ModelConfig.load(tmp_path / "plain.json") == plain
    hybrid = ModelConfig(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, vocab_size=128, norm_offset=1.0,
                         sandwich_norms=True, ffn_activation="gelu_tanh", embedding_scale=8.0, head_width=32,
                         attention_scale_dim=32, attention_methods_layers=[False, True])
    hybrid.save(tmp_path / "hybrid.json")
    assert set(ModelConfig.WRITTEN_WHEN_SET) <= set(json.loads((tmp_path / "hybrid.json").read_text()))
    assert ModelConfig.load(tmp_path / "hybrid.json") == hybrid
