"""The runtime switches ([runtime] in a run config, model/runtime.py): saved with each run, given by the
trainer to its model and the process, refused with the key's name when not a boolean; each path they choose computes the same numbers (the
compiled-rope tests compare the two sides). The switches the model's attention backend replaced are dropped from a
saved run and refused, naming their replacement, in user input."""
import pytest

from errors import ConfigError
from model.runtime import RuntimeConfig
from train.config import load_run_config, to_toml


def test_runtime_keys_round_trip_through_run_config_toml(tmp_path):
    config = load_run_config(None, ["--runtime.compiled_rope=false"])
    assert config.runtime == RuntimeConfig(compiled_rope=False, keep_freed_memory=True)
    text = to_toml(config)
    assert "[runtime]\ncompiled_rope = false\nkeep_freed_memory = true" in text
    saved = tmp_path / "run_config.toml"
    saved.write_text(text)
    assert load_run_config(saved).runtime == config.runtime
    assert load_run_config(None).runtime == RuntimeConfig()  # defaults: every fast path on


def test_a_runtime_switch_that_is_not_a_boolean_names_the_key():
    with pytest.raises(ConfigError, match="runtime.compiled_rope must be true or false"):
        load_run_config(None, ["--runtime.compiled_rope=0"])
    with pytest.raises(ConfigError, match="unknown key.*flex"):
        load_run_config(None, ["--runtime.flex=false"])


def test_the_trainer_gives_the_runs_switches_to_its_model(tmp_path, prepared_data):
    from data.batches import PretrainBatches
    from train.loop import Trainer, Training, model_factory

    config = load_run_config(None, [f"--data.dir={prepared_data}", f"--out.dir={tmp_path / 'run'}",
                                    "--runtime.compiled_rope=false",
                                    "--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1",
                                    "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=16"])
    batches = PretrainBatches(prepared_data, 16, 2, 0, 1)
    trainer = Trainer(Training(config, model_factory(config, None), batches, tokenizer=None))
    assert not trainer.model.runtime.compiled_rope and not trainer.model.position.compiled_rope  # taken when built
    assert "[runtime]\ncompiled_rope = false" in (tmp_path / "run" / "run_config.toml").read_text()


def test_the_retired_flex_switches_load_from_a_saved_run_and_are_refused_with_their_replacement(tmp_path):
    from train.config import build_run_config

    saved = {"runtime": {"flex_attention": False, "compiled_rope": True, "keep_freed_memory": True,
                         "flex_cuda": False}}
    assert build_run_config(saved, "saved", saved=True).runtime == RuntimeConfig()
    with pytest.raises(ConfigError, match=r"runtime.flex_attention is retired; use model.attention_backend"):
        build_run_config(saved, "config")
    path = tmp_path / "run.toml"
    path.write_text("[runtime]\nflex_cuda = true\n")
    with pytest.raises(ConfigError, match=r'runtime.flex_cuda is retired; use model.attention_backend = "flex"'):
        load_run_config(path)
