"""PoSE (train.extend --method pose): windows of the original length whose position ids cover the target length."""
import json

import numpy as np
import pytest
import torch

from data.batches import PoseBatches, pose_positions_and_spans
from errors import DataError
from model.checkpoint import load_model, load_trainer_state


@pytest.fixture()
def counting_data(tmp_path):
    """A data folder whose token i is i % 4000, so every token tells where in the stream it came from."""
    folder = tmp_path / "data"
    folder.mkdir()
    tokens = (np.arange(50_000) % 4000).astype(np.uint16)
    tokens.tofile(folder / "train.bin")
    tokens[:5000].tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 4096}))
    return folder


def test_rows_keep_the_window_and_positions_stay_below_the_target():
    rng = np.random.default_rng(0)
    window, target = 32, 128
    largest = []
    for _ in range(400):
        positions, cut, second, span = pose_positions_and_spans(rng, window, target)
        assert positions.shape == (window,) and positions[0] == 0
        assert 1 <= cut <= (window + 1) // 2
        assert np.all(np.diff(positions) >= 1)  # increasing; one jump (the skip) at the cut
        assert np.all(np.diff(positions)[np.arange(window - 1) != cut - 1] == 1)
        assert positions[-1] < target and second >= cut and second + window - cut <= span
        largest.append(positions[-1])
    assert max(largest) >= 0.95 * target and min(largest) <= window + 2  # the skips cover 0 .. target - window


def test_batches_pair_each_token_with_its_own_next_token_and_position(counting_data):
    batches = PoseBatches(counting_data, window=16, target=64, batch_size=8, seed=3, val_batches=1)
    inputs, targets, positions = batches.train_batch(step=5)
    assert inputs.shape == targets.shape == positions.shape == (8, 16)
    assert torch.equal(targets, (inputs + 1) % 4000)  # the true continuation, also at the end of the first chunk
    assert positions.max() < 64
    for row in range(8):
        gaps = torch.diff(positions[row])
        text_gaps = torch.diff(inputs[row]) % 4000
        cut = int(torch.nonzero(gaps > 1)[0]) + 1 if (gaps > 1).any() else None
        # Within a chunk positions advance with the text; across the cut both the text and the positions jump.
        for t in range(15):
            if cut is None or t != cut - 1:
                assert gaps[t] == 1 and text_gaps[t] == 1
    again = batches.train_batch(step=5)
    assert all(torch.equal(a, b) for a, b in zip(again, (inputs, targets, positions)))  # a function of seed and step
    val_inputs, _ = next(batches.val_batches_iter())
    assert val_inputs.shape[1] == 64  # validation at the target length


def test_pose_refuses_a_window_not_below_the_target(counting_data):
    with pytest.raises(DataError, match="PoSE needs"):
        PoseBatches(counting_data, window=64, target=64, batch_size=2, seed=0, val_batches=1)


def test_extend_with_pose_trains_short_windows_for_the_target_length(prepared_data, tmp_path):
    from train.extend import main as extend
    from train.pretrain import main as pretrain

    base = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
            "--model.n_kv_heads=2", "--model.max_seq_len=16", "--train.batch_size=4", "--train.eval_batches=2",
            "--train.dtype=float32", f"--data.dir={prepared_data}"]
    assert pretrain([*base, "--train.max_steps=4", f"--out.dir={tmp_path / 'short'}"]) == 0
    out = tmp_path / "pose"
    assert extend(["--checkpoint", str(tmp_path / "short"), "--rope-scaling", "yarn", "--rope-factor", "4",
                   "--method", "pose", "--train.max_steps=3", "--train.dtype=float32", "--train.eval_batches=1",
                   f"--out.dir={out}"]) == 0
    state = load_trainer_state(out)
    assert state["extension_method"] == "pose" and state["training_window"] == 16
    assert state["tokens_seen"] == 3 * 4 * 16  # windows of the original length
    model = load_model(out)
    assert model.config.max_seq_len == 64 and model.config.rope_scaling["original_max_position_embeddings"] == 16
