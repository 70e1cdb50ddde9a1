"""The runtime switches ([runtime] in a run config, model/runtime.py): saved with each run, put in effect by the
trainer, refused with the key's name when not a boolean; each path they choose computes the same numbers (the
flex and compiled-rope tests compare the two sides)."""
import pytest

from errors import ConfigError
from model.runtime import RuntimeConfig, configure_runtime, runtime_config
from train.config import load_run_config, to_toml


@pytest.fixture
def restore_runtime():
    saved = dict(vars(runtime_config()))
    yield
    configure_runtime(RuntimeConfig(**saved))


def test_runtime_keys_round_trip_through_run_config_toml(tmp_path):
    config = load_run_config(None, ["--runtime.flex_attention=false", "--runtime.compiled_rope=false"])
    assert config.runtime == RuntimeConfig(flex_attention=False, compiled_rope=False, keep_freed_memory=True)
    text = to_toml(config)
    assert "[runtime]\nflex_attention = false\ncompiled_rope = false\nkeep_freed_memory = true" in text
    saved = tmp_path / "run_config.toml"
    saved.write_text(text)
    assert load_run_config(saved).runtime == config.runtime
    assert load_run_config(None).runtime == RuntimeConfig()  # defaults: every fast path on


def test_a_runtime_switch_that_is_not_a_boolean_names_the_key():
    with pytest.raises(ConfigError, match="runtime.flex_attention must be true or false"):
        load_run_config(None, ["--runtime.flex_attention=0"])
    with pytest.raises(ConfigError, match="unknown key.*flex"):
        load_run_config(None, ["--runtime.flex=false"])


def test_the_trainer_puts_the_runs_switches_in_effect(tmp_path, prepared_data, restore_runtime):
    from data.batches import PretrainBatches
    from model.transformer import Transformer
    from train.loop import Trainer, Training

    config = load_run_config(None, [f"--data.dir={prepared_data}", f"--out.dir={tmp_path / 'run'}",
                                    "--runtime.flex_attention=false", "--runtime.compiled_rope=false",
                                    "--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1",
                                    "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=16"])
    assert runtime_config().flex_attention and runtime_config().compiled_rope
    batches = PretrainBatches(prepared_data, 16, 2, 0, 1)
    Trainer(Training(config, lambda: Transformer(config.model), batches, tokenizer=None))
    assert not runtime_config().flex_attention and not runtime_config().compiled_rope
    assert "[runtime]\nflex_attention = false" in (tmp_path / "run" / "run_config.toml").read_text()
