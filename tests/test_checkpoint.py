"""Checkpoint round trip, atomic saving, and errors for broken folders."""
import json

import pytest
import torch

from model import Transformer
from model.checkpoint import READY, STAGING, CheckpointError, load_model, save_checkpoint, write_atomically
from tests.conftest import micro_config


def test_round_trip_is_bit_exact(tmp_path):
    for tied in (True, False):
        model = Transformer(micro_config(tie_word_embeddings=tied, rope_layout="interleaved"))
        save_checkpoint(tmp_path / str(tied), model)
        loaded = load_model(tmp_path / str(tied))
        assert loaded.config == model.config
        original, restored = model.state_dict(), loaded.state_dict()
        assert original.keys() == restored.keys()
        for name in original:
            assert torch.equal(original[name], restored[name]), name
        idx = torch.randint(0, model.config.vocab_size, (1, 9))
        assert torch.equal(model.eval()(idx)[0], loaded.eval()(idx)[0])
        assert (loaded.lm_head.weight.data_ptr() == loaded.tok_embeddings.weight.data_ptr()) == tied


def test_interrupted_save_keeps_previous_checkpoint(tmp_path):
    model = Transformer(micro_config())
    save_checkpoint(tmp_path, model)
    before = (tmp_path / "model.safetensors").read_bytes()

    def crash(path):
        path.write_text("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(tmp_path, {"model.safetensors": crash})
    assert (tmp_path / "model.safetensors").read_bytes() == before
    load_model(tmp_path)  # cleans up the staging folder and loads the old checkpoint
    assert not (tmp_path / STAGING).exists()


def test_committed_save_is_rolled_forward(tmp_path):
    """A save killed after its commit point (staging renamed to .ready) is completed by the next load."""
    old, new = Transformer(micro_config()), Transformer(micro_config(init_std=0.05))
    save_checkpoint(tmp_path, old)
    save_checkpoint(tmp_path / "other", new)
    (tmp_path / READY).mkdir()
    (tmp_path / "other" / "model.safetensors").rename(tmp_path / READY / "model.safetensors")
    (tmp_path / "other" / "config.json").rename(tmp_path / READY / "config.json")
    loaded = load_model(tmp_path)
    assert torch.equal(loaded.layers[0].attention.q_proj.weight, new.layers[0].attention.q_proj.weight)
    assert not (tmp_path / READY).exists()


def test_broken_folders_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        load_model(tmp_path / "missing")
    model = Transformer(micro_config())
    save_checkpoint(tmp_path, model)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(tmp_path)
    weights.write_bytes(data)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "dim": 128}))
    with pytest.raises(CheckpointError, match="config.json implies"):
        load_model(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing config.json"):
        load_model(tmp_path)
