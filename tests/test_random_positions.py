"""Randomized positions (model.random_positions, model/random_positions.py; Ruoss et al. 2023): each sequence's
positions are a sorted random subset of [0, N), every subset equally likely; the forward uses them in training and
evaluation; evaluation is a function of the tokens (repeatable, batch = rows alone); a KV cache's decoding equals the
full forward at the same positions; models it cannot change are refused."""
import math
from collections import Counter

import pytest
import torch

from errors import ConfigError, PositionRangeError
from model.config import ModelConfig
from model.kv_cache import KVCache, StaticKVCache
from model.random_positions import sample_positions, sorted_subset
from model.transformer import Transformer
from tests.conftest import decode_in_steps

SHAPE = dict(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


def model_with(position: str = "rope", limit: int = 64, **settings) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**SHAPE, position=position, random_positions=limit, **settings)).eval()


def test_every_sorted_subset_is_equally_likely():
    """count 2 of [0, 5): the 10 subsets, 20,000 draws; each frequency within 5 standard errors of 1/10."""
    generator = torch.Generator().manual_seed(1)
    draws = Counter(tuple(sorted_subset(2, 5, generator, torch.device("cpu")).tolist()) for _ in range(20_000))
    assert len(draws) == 10 and all(a < b for a, b in draws)
    error = math.sqrt(0.1 * 0.9 / 20_000)
    assert all(abs(n / 20_000 - 0.1) < 5 * error for n in draws.values()), draws


def test_the_first_position_has_the_closed_form_mean():
    """The smallest of T distinct draws from [0, N) has mean (N - T) / (T + 1)."""
    generator = torch.Generator().manual_seed(2)
    count, limit, n = 16, 256, 4000
    first = torch.tensor([float(sorted_subset(count, limit, generator, torch.device("cpu"))[0]) for _ in range(n)])
    expected = (limit - count) / (count + 1)
    assert abs(first.mean().item() - expected) < 5 * first.std().item() / math.sqrt(n)


def test_evaluation_positions_are_a_function_of_each_rows_tokens():
    idx = torch.randint(0, 61, (3, 12), generator=torch.Generator().manual_seed(3))
    positions = sample_positions(idx, 12, 64, training=False)
    assert positions.shape == (3, 12) and (positions.diff(dim=-1) > 0).all()
    assert int(positions.min()) >= 0 and int(positions.max()) < 64
    assert torch.equal(positions, sample_positions(idx, 12, 64, training=False))  # repeatable
    for row in range(3):  # each row's as it would be alone
        assert torch.equal(positions[row], sample_positions(idx[row : row + 1], 12, 64, training=False)[0])
    assert not torch.equal(positions[0], positions[1])


def test_training_positions_come_from_the_global_generator():
    idx = torch.zeros(2, 10, dtype=torch.long)  # the same tokens: training draws differ anyway
    torch.manual_seed(5)
    first = sample_positions(idx, 10, 100, training=True)
    torch.manual_seed(5)
    assert torch.equal(first, sample_positions(idx, 10, 100, training=True))
    assert not torch.equal(first[0], first[1])


@pytest.mark.parametrize("position,settings", [("rope", {}), ("alibi", {}), ("sinusoidal", {}),
                                               ("learned", {"position_args": {"learned": {"max_positions": 64}}})])
def test_the_forward_uses_the_sampled_positions(position, settings):
    model = model_with(position, **settings)
    idx = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(4))
    logits, _ = model(idx)
    explicit, _ = model(idx, positions=sample_positions(idx, 24, 64, training=False))
    ordinary, _ = model(idx, positions=torch.arange(24)[None, :])
    assert torch.equal(logits, explicit)
    assert (logits - ordinary).abs().max() > 1e-5  # the positions matter (small at initialisation)


def test_at_n_tokens_the_subset_is_every_position_and_the_model_is_the_plain_one():
    randomized = model_with("rope", limit=32)
    plain = Transformer(ModelConfig(**SHAPE, position="rope"))
    plain.load_state_dict(randomized.state_dict())
    plain.eval()
    idx = torch.randint(0, 61, (2, 32), generator=torch.Generator().manual_seed(6))
    assert torch.allclose(randomized(idx)[0], plain(idx)[0], atol=0, rtol=0)


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_equals_the_full_forward_at_the_same_positions(cache_type, position):
    model = model_with(position)
    idx = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(7))
    cache = cache_type.for_model(model.config, batch_size=2, max_len=24)
    with torch.no_grad():
        steps = decode_in_steps(model, idx, (8,), cache)
        full, _ = model(idx, positions=cache.position_plan[:, :20])
    plan = cache.position_plan
    assert plan.shape == (2, 24) and (plan.diff(dim=-1) > 0).all() and int(plan.max()) < 64
    assert torch.allclose(steps, full, atol=1e-5)


@pytest.mark.parametrize("position", ["none", "fox", "stickbreaking", "cope", "path"])
def test_encodings_that_read_no_positions_are_refused(position):
    with pytest.raises(ConfigError, match="read no position ids"):
        ModelConfig(**SHAPE, position=position, random_positions=64)


def test_bad_settings_name_the_fix():
    with pytest.raises(ConfigError, match="must be at least model.max_seq_len"):
        ModelConfig(**SHAPE, random_positions=8)
    with pytest.raises(ConfigError, match="max_positions=64"):
        ModelConfig(**SHAPE, position="learned", random_positions=64)
    ModelConfig(**SHAPE, position="rope", position_layers=["rope", "none"], random_positions=64)  # iRoPE
    with pytest.raises(PositionRangeError, match=r"\[0, 64\).*65"):
        model_with("rope")(torch.zeros(1, 65, dtype=torch.long))


def test_a_training_step_learns_through_the_sampled_positions():
    model = model_with("rope").train()
    idx = torch.randint(0, 61, (4, 16), generator=torch.Generator().manual_seed(8))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_frontier_presets_randomized_variant_runs_and_its_claim_is_checked(small_text_file, tmp_path):
    """The frontier preset's rope-randomized variant at a micro scale: trained with random_positions, evaluated
    beyond L, and the report checks Ruoss et al.'s claim against rope."""
    import json

    from experiments.compare import run_folder
    from experiments.engine import main
    from tests.test_compare import MICRO, ROOT

    out = tmp_path / "cmp"
    assert main("experiments.compare", ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "frontier",
                                         "--out", str(out), f"--compare.source={small_text_file}",
                                         "--compare.val_fraction=0.3", *MICRO, '--compare.encodings=["rope", '
                                         '"rope-randomized"]', "--compare.seeds=[1, 2]", "--compare.methods=[]",
                                         "--compare.probes=[]", "--workers", "1", "--threads", "1"]) == 0
    from experiments.compare import STUDY
    from experiments.engine import load_records

    cells = load_records(STUDY, out).cells
    [randomized] = [cell for cell in cells if cell["name"] == "rope-randomized-seed1"]
    saved = json.loads((run_folder(out / "work", randomized) / "config.json").read_text())
    assert saved["random_positions"] == 2048 and saved["position"] == "rope"
    table = (out / "table.md").read_text().split("### Extrapolation penalty")[0]
    [row] = [line for line in table.splitlines() if line.startswith("| rope-randomized |")]
    assert row.count("[") == 3  # 1x, 2x and 4x, each with an interval over the two seeds
    assert "randomized positions lower RoPE's extrapolation penalty (Ruoss et al. 2023)" in \
        (out / "report.md").read_text()


def test_the_shift_probe_moves_the_models_own_draw():
    """With randomized positions, the probe's offset moves the positions the model draws for each row (its own
    sorted subset plus the offset), not consecutive positions: the score equals a forward at exactly those
    positions, and differs from one at consecutive positions with the same offset."""
    import numpy as np

    from eval.scoring import score_windows

    torch.manual_seed(0)
    model = model_with("rope", 256)
    windows = np.random.default_rng(0).integers(0, 61, (3, 17))
    rows = torch.from_numpy(windows)
    with torch.no_grad():
        drawn = model.default_positions(rows[:, :-1], None)
        own = model(rows[:, :-1], rows[:, 1:], positions=drawn + 64, loss_reduction="none")[1].numpy()
        consecutive = model(rows[:, :-1], rows[:, 1:], positions=torch.arange(16)[None] + 64,
                            loss_reduction="none")[1].numpy()
    probed = score_windows(model, windows, position_offset=64)
    assert np.abs(probed - own).max() < 1e-6
    assert np.abs(probed - consecutive).max() > 1e-4  # an untrained model: positions move its losses a little


def test_another_evaluation_draw_gives_other_positions_still_a_function_of_the_tokens():
    model = model_with("rope", 256)
    other = model.with_settings(random_positions_draw=1)
    idx = torch.randint(0, 61, (2, 16))
    first, again, second = model.default_positions(idx, None), model.default_positions(idx, None), \
        other.default_positions(idx, None)
    assert torch.equal(first, again) and not torch.equal(first, second)
    assert torch.equal(second, other.default_positions(idx, None))
    with pytest.raises(ConfigError, match="random_positions_draw"):
        ModelConfig(random_positions_draw=-1)
