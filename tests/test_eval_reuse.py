"""What an evaluation computes once: the reference scores only what it keeps and takes the windows it shares with
the L cell from it; the probe's offset 0 is the L cell; a method that scores as the checkpoint does at a length
takes that cell. Each shortcut is checked against scoring the same thing directly."""
import numpy as np
import pytest
import torch

from errors import ConfigError
from eval.extrapolation import PROBE_MULTIPLES, evaluate_checkpoint, key_for, make_plan
from eval.scoring import score_incremental, score_windows
from eval.segments import (
    Segments,
    reference_in_tiling,
    reference_layout,
    reference_windows,
    tiled_layout,
    tiled_windows,
)
from model.methods import METHODS, NONE, applies, method_spec
from model.transformer import Transformer
from tests.conftest import micro_config

ENCODINGS = ["rope", "alibi", "t5", "shaw", "sinusoidal", "learned", "none", "kerple", "fire", "cope", "xpos"]


def sharp_model(**overrides) -> Transformer:
    """A random model with large weights, so that positions and context change its predictions visibly."""
    torch.manual_seed(0)
    return Transformer(micro_config(init_std=0.2, **overrides)).eval()


@pytest.mark.parametrize("position", ENCODINGS)
def test_logits_to_keep_gives_the_last_positions_of_a_full_forward(position):
    model = sharp_model(position=position)
    idx = torch.randint(0, 97, (3, 24))
    targets = torch.randint(0, 97, (3, 24))
    with torch.no_grad():
        logits, loss = model(idx, targets, loss_reduction="none")
        kept_logits, kept_loss = model(idx, targets, loss_reduction="none", logits_to_keep=5)
        _, kept_mean = model(idx, targets[:, -5:], logits_to_keep=5)  # targets for the kept positions only
    assert kept_logits.shape == (3, 5, 97) and kept_loss.shape == (3, 5)
    assert torch.allclose(kept_logits, logits[:, -5:], atol=1e-5)
    assert torch.allclose(kept_loss, loss[:, -5:], atol=1e-5)
    assert torch.allclose(kept_mean, loss[:, -5:].mean(), atol=1e-5)


def test_logits_to_keep_out_of_range_is_refused():
    model = sharp_model()
    with pytest.raises(ConfigError, match="logits_to_keep"):
        model(torch.randint(0, 97, (1, 8)), logits_to_keep=9)


def test_scoring_only_the_last_targets_equals_scoring_all():
    model = sharp_model(position="rope")
    windows = np.random.default_rng(0).integers(0, 97, (7, 17))
    assert np.abs(score_windows(model, windows, last=4) - score_windows(model, windows)[:, -4:]).max() < 1e-5


@pytest.mark.parametrize("length,context,stride", [(64, 16, 4), (60, 16, 4), (64, 16, 16), (48, 16, 8)])
def test_the_reference_windows_in_the_tiling_are_its_windows_and_no_others_are(length, context, stride):
    ids = np.arange(10_000)  # every window is named by its tokens
    segments = Segments(np.array([20, 200, 900]), length)
    reference = reference_windows(ids, segments, context, stride)
    tiled = tiled_windows(ids, segments, context)
    shared, cell = reference_in_tiling(segments, context, stride)
    assert len(cell) == len(tiled) and np.array_equal(reference[shared], tiled[cell])
    tiled_set = {tuple(window) for window in tiled}
    assert not any(tuple(window) in tiled_set for window in np.delete(reference, shared, axis=0))


def claims(position: str, trained: int) -> dict[str, list[int]]:
    """Method -> the lengths (of L / 2, L, 2L) at which it claims to score as the checkpoint as trained."""
    own = micro_config(position=position, max_seq_len=trained).to_dict()
    return {name: [length for length in (trained // 2, trained, 2 * trained)
                   if METHODS[name].as_trained_at(own, length, trained)]
            for name in METHODS if name != NONE and applies(name, position)}


@pytest.mark.parametrize("position", ["rope", "learned", "alibi", "none"])
def test_a_method_that_claims_to_score_as_trained_does(position):
    """Every claim of every registered method, checked by scoring: the method set up for the length against
    the checkpoint as it is, on the same windows."""
    model = sharp_model(position=position, max_seq_len=8)
    windows = {length: np.random.default_rng(length).integers(0, 97, (4, length + 1)) for length in (4, 8, 16)}
    checked = []
    for name, lengths in claims(position, 8).items():
        assert 16 not in lengths  # past L every method changes something
        spec = method_spec(name)
        for length in lengths:
            as_trained = score_windows(model.under(METHODS[NONE], length, 8), windows[length])
            view = model.under(spec, length, 8)
            scored = score_incremental(view, windows[length], 8) if spec.incremental else \
                score_windows(view, windows[length])
            assert np.abs(scored - as_trained).max() < 1e-5, (name, length)
            checked.append(name)
    expected = {"rope": {"linear", "ntk", "yarn", "llama3", "dynamic"}, "learned": {"clamp"}}.get(position, set())
    assert expected <= set(checked)


def test_no_claim_for_a_checkpoint_with_a_scaling_of_its_own():
    own = micro_config(position="rope", max_seq_len=16,
                       rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                     "original_max_position_embeddings": 8}).to_dict()
    assert not any(METHODS[name].as_trained_at(own, 8, 16) for name in ("linear", "ntk", "yarn", "dynamic"))
    assert method_spec("yarn+logn").as_trained_at(own, 8, 16) is False


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_an_evaluation_equals_scoring_every_cell_directly(position):
    """evaluate_checkpoint with every shortcut against the plain recipe: the full reference windows, each method
    set up and scored at each length, each probe offset scored."""
    model = sharp_model(position=position, max_seq_len=8)
    own = model.config.to_dict()
    ids = np.random.default_rng(3).integers(0, 97, 3000)
    plan = make_plan(len(ids), 8, ["0.5x", "1x", "2x", "4x"], 256, reference_stride=2)
    methods = ["linear", "ntk", "dynamic", "yarn", "clamp"]
    evaluation = evaluate_checkpoint(model, ids, plan, methods)

    reference = score_windows(model, reference_windows(ids, plan.segments, 8, 2))
    assert np.abs(evaluation.reference - reference_layout(reference, plan.segments, 2)).max() < 1e-5
    chosen = [NONE] + [m for m in methods if applies(m, position)]
    for method in chosen:
        spec = method_spec(method)
        for length in plan.lengths:
            view = model.under(spec, length, 8)
            windows = tiled_windows(ids, plan.segments, length)
            try:
                losses = score_incremental(view, windows, 8) if spec.incremental else score_windows(view, windows)
            except Exception:
                assert key_for(method, length) in evaluation.errors
                continue
            direct = tiled_layout(losses, plan.segments, length)
            assert np.allclose(evaluation.losses[key_for(method, length)], direct, atol=1e-5, equal_nan=True)
        if spec.shift_probe:
            view = model.under(spec, 8, 8)
            for multiple in PROBE_MULTIPLES:
                try:
                    probe = score_windows(view, tiled_windows(ids, plan.segments, 8), position_offset=8 * multiple)
                except Exception:
                    continue
                assert np.abs(evaluation.probe[key_for(method, 8 * multiple)] - probe.mean(axis=1)).max() < 1e-5
    assert model.config.to_dict() == own  # the caller's model never changed
