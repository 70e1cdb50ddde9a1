"""Checkpoint round trip, atomic saving, and errors for broken folders."""
import json

import pytest
import torch

from errors import CheckpointError
from model import Transformer
from model.checkpoint import READY, STAGING, load_model, recover, save_checkpoint, write_atomically
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
    assert not (tmp_path / STAGING).exists()  # an error (unlike a kill) removes its own staging
    (tmp_path / STAGING).mkdir()  # as a kill leaves it
    (tmp_path / STAGING / "model.safetensors").write_text("partial")
    load_model(tmp_path)  # loads the old checkpoint and leaves the folder as it is
    assert (tmp_path / STAGING).exists()
    save_checkpoint(tmp_path, model)  # the next save (the writer) drops the unfinished one
    assert not (tmp_path / STAGING).exists()


def test_committed_save_is_read_whole_and_rolled_forward_only_by_the_writer(tmp_path):
    """A save killed after its commit point (staging renamed to .ready, one file already moved): readers see the
    new save as a whole and change nothing; recover (the trainer before it resumes) completes it."""
    old = Transformer(micro_config())
    new = Transformer(micro_config(init_std=0.05, rope_theta=5000.0))
    save_checkpoint(tmp_path, old)
    save_checkpoint(tmp_path / "other", new)
    (tmp_path / READY).mkdir()
    (tmp_path / "other" / "model.safetensors").rename(tmp_path / READY / "model.safetensors")
    (tmp_path / "other" / "config.json").replace(tmp_path / "config.json")  # moved before the crash
    listing = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    loaded = load_model(tmp_path)
    assert loaded.config.rope_theta == 5000.0
    assert torch.equal(loaded.layers[0].attention.q_proj.weight, new.layers[0].attention.q_proj.weight)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == listing
    recover(tmp_path)
    assert not (tmp_path / READY).exists()
    assert torch.equal(load_model(tmp_path).layers[0].attention.q_proj.weight, new.layers[0].attention.q_proj.weight)


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


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "sinusoidal"])
def test_a_checkpoint_written_before_the_architecture_changes_loads_with_identical_logits(position):
    """tests/fixtures/checkpoint_da164b0: written by commit da164b0 (see the README there), with its logits."""
    import numpy as np

    from model.checkpoint import trained_length
    from tests.conftest import ROOT

    folder = ROOT / "tests" / "fixtures" / "checkpoint_da164b0" / position
    model = load_model(folder).eval()
    idx = torch.arange(24).remainder(97)[None] * 3 % 97
    with torch.no_grad():
        logits = model(idx)[0]
    expected = torch.from_numpy(np.load(folder / "logits.npy"))
    assert (logits - expected).abs().max() < 1e-6
    assert trained_length(folder) == 16
    if position == "rope":
        assert model.config.original_length == 16 and model.config.rope_scaling["rope_type"] == "yarn"


ROUNDING = 1e-5  # float32 rounding between CPUs' kernels of logits near 1 (at most 4.8e-7 measured on a Zen 3)
FIXTURE_5D4370C = ["rope", "xpos", "alibi", "t5", "shaw", "kerple", "fire", "cope", "sinusoidal", "learned", "none",
                   "hybrid"]


@pytest.mark.parametrize("name", FIXTURE_5D4370C)
def test_a_checkpoint_with_the_flat_encoding_settings_loads_with_identical_logits(name):
    """tests/fixtures/checkpoint_5d4370c: one micro checkpoint per encoding with non-default settings of its own,
    written by commit 5d4370c (tests/fixtures/make_checkpoint_5d4370c.py), with that commit's logits, also under an
    inference-time change (YaRN for RoPE, the clamp for the learned table) where it recorded one. Bit-identical on
    a CPU like the one that wrote them (AVX-512); another CPU's kernels round differently (at most 4.8e-7 on a Zen 3
    without AVX-512), so the check allows float rounding."""
    import numpy as np

    from model.methods import METHODS
    from tests.conftest import ROOT

    folder = ROOT / "tests" / "fixtures" / "checkpoint_5d4370c" / name
    model = load_model(folder).eval()
    ids = torch.arange(40)[None] * 7 % 97
    length = 24 if name == "learned" else 40
    with torch.no_grad():
        logits = model(ids[:, :length])[0]
    torch.testing.assert_close(logits, torch.from_numpy(np.load(folder / "logits.npy")), rtol=0, atol=ROUNDING)
    for extra, method, evaluated in (("yarn", "yarn", 64), ("clamp", "clamp", 40)):
        if (folder / f"extra_{extra}.npy").exists():
            view = model.under(METHODS[method], evaluated, 16)
            with torch.no_grad():
                logits = view(ids)[0]
            torch.testing.assert_close(logits, torch.from_numpy(np.load(folder / f"extra_{extra}.npy")), rtol=0,
                                       atol=ROUNDING)
