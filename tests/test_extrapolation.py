"""Context-matched extrapolation: what is scored, how, and the invariants the numbers must satisfy."""
import math

import numpy as np
import pytest
import torch

from errors import ConfigError, DataError, PositionRangeError
from eval.extrapolation import (
    PROBE_MULTIPLES,
    CheckpointEvaluation,
    evaluate_checkpoint,
    make_plan,
    summary_rows,
)
from eval.scoring import score_incremental, score_prefixes, score_windows
from eval.segments import (
    choose_segments,
    reference_layout,
    reference_windows,
    tiled_layout,
    tiled_windows,
    window_positions,
)
from model.methods import METHODS, applies, check_methods, label
from model.transformer import Transformer
from tests.conftest import micro_config

ENCODINGS = ["rope", "alibi", "t5", "shaw", "sinusoidal", "learned", "none"]


def sharp_model(**overrides) -> Transformer:
    """A random model with large weights, so that positions and context change its predictions visibly."""
    torch.manual_seed(0)
    return Transformer(micro_config(init_std=0.2, **overrides)).eval()


def test_dynamic_ntk_scores_each_token_under_the_base_of_its_own_prefix():
    """One layer: every cached step equals a fresh full forward of its prefix, token for token, past L."""
    model = sharp_model(position="rope", max_seq_len=8, n_layers=1, rope_scaling={"rope_type": "dynamic", "factor": 1.0})
    windows = np.random.default_rng(0).integers(0, 97, (3, 33))
    incremental = score_incremental(model, windows, prefill=8)
    fresh = score_prefixes(model, windows, start=0)
    assert np.abs(incremental - fresh).max() < 1e-5
    # One forward over the whole window applies the largest base to every token: a different (static) method.
    one_forward = score_windows(model, windows)
    assert np.abs(one_forward - fresh)[:, 8:].max() > 1e-2
    assert np.abs(one_forward - fresh)[:, :8].max() > 1e-3  # even tokens inside L get the enlarged base


def test_dynamic_ntk_cached_steps_keep_earlier_hidden_states():
    """Deeper layers: the keys and values of earlier tokens come from hidden states computed under the base of
    their own time, so cached decoding is not a fresh forward of the prefix past L (it is inside L)."""
    model = sharp_model(position="rope", max_seq_len=8, n_layers=2, rope_scaling={"rope_type": "dynamic", "factor": 1.0})
    windows = np.random.default_rng(0).integers(0, 97, (3, 33))
    difference = np.abs(score_incremental(model, windows, prefill=8) - score_prefixes(model, windows, start=0))
    assert difference[:, :8].max() < 1e-5 and difference[:, 8:].max() > 1e-2


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal"])
def test_incremental_scoring_equals_full_forward_for_static_encodings(position):
    model = sharp_model(position=position, max_seq_len=8)
    windows = np.random.default_rng(1).integers(0, 97, (2, 25))
    assert np.abs(score_incremental(model, windows, prefill=5) - score_windows(model, windows)).max() < 2e-5


@pytest.mark.parametrize("step", [3, 7])
def test_chunked_incremental_scoring_equals_full_forward_for_static_encodings(step):
    model = sharp_model(position="rope", max_seq_len=8)
    windows = np.random.default_rng(1).integers(0, 97, (2, 25))
    chunked = score_incremental(model, windows, prefill=5, step=step)
    assert np.abs(chunked - score_windows(model, windows)).max() < 2e-5


def test_chunked_dynamic_ntk_gives_each_chunk_the_base_of_its_end():
    """One layer: a chunk's tokens equal a fresh full forward of the prefix that ends with the chunk (one base per
    chunk, as a chunked prefill sets it); step 1 is token by token."""
    model = sharp_model(position="rope", max_seq_len=8, n_layers=1, rope_scaling={"rope_type": "dynamic", "factor": 1.0})
    windows = np.random.default_rng(0).integers(0, 97, (2, 29))
    chunked = score_incremental(model, windows, prefill=8, step=5)
    for end in range(13, 29, 5):  # chunks [8, 13), [13, 18), ...: each scored under the base of its end
        prefix = score_windows(model, windows[:, : end + 1])
        assert np.abs(chunked[:, end - 5 : end] - prefix[:, end - 5 : end]).max() < 1e-5
    token_by_token = score_incremental(model, windows, prefill=8)
    assert np.abs(chunked - token_by_token)[:, 8:].max() > 1e-3  # a different base inside a chunk


def test_every_length_and_the_reference_score_the_same_tokens():
    ids = np.arange(10_000)  # a token's id is its index, so a target names its own position in the stream
    segments = choose_segments(len(ids), 64, wanted_tokens=640, margin=16)
    assert len(segments.starts) == 10 and segments.starts[0] == 16
    assert np.all(np.diff(segments.starts) >= 64) and segments.starts[-1] + 64 <= len(ids) - 1
    expected = segments.starts[:, None] + 1 + np.arange(64)[None, :]
    for window in (16, 32, 64):
        windows = tiled_windows(ids, segments, window)
        assert np.array_equal(tiled_layout(windows[:, 1:].astype(np.float32), segments, window), expected)
        assert np.array_equal(window_positions(segments, window), np.arange(64) % window)
    reference = reference_windows(ids, segments, context=16, stride=4)
    assert np.array_equal(reference_layout(reference[:, 1:].astype(np.float32), segments, 4), expected)
    # Every reference target is predicted with between context - stride + 1 and context tokens of context.
    assert np.all(reference[:, 0] == reference[:, -1] - 16)


def test_segments_are_spread_over_the_whole_stream_and_refuse_too_little_text():
    segments = choose_segments(100_000, 1000, wanted_tokens=5000, margin=100)
    assert segments.starts[0] == 100 and segments.starts[-1] > 90_000
    assert len(choose_segments(3000, 1000, wanted_tokens=50_000, margin=100).starts) == 2  # as many as fit
    with pytest.raises(DataError, match="fewer than one segment"):
        choose_segments(1000, 1000, wanted_tokens=1000, margin=100)


@pytest.mark.parametrize("position", ENCODINGS)
def test_shift_probe_is_invariant_exactly_for_relative_encodings(position):
    model = sharp_model(position=position, max_seq_len=8)
    ids = np.random.default_rng(2).integers(0, 97, 2000)
    plan = make_plan(len(ids), 8, ["1x", "2x"], 256)
    evaluation = evaluate_checkpoint(model, ids, plan, ["clamp"])
    offsets = [multiple * 8 for multiple in PROBE_MULTIPLES]
    if position == "learned":
        assert all(f"probe:none@{offset}" in evaluation.errors for offset in offsets[1:])
        probe = [evaluation.probe_nll("clamp", offset) for offset in offsets]
        assert probe[1] == pytest.approx(probe[3], abs=1e-6)  # every offset >= L clamps to the same last row
        return
    probe = [evaluation.probe_nll("none", offset) for offset in offsets]
    assert probe[0] == pytest.approx(evaluation.nll("none", 8), abs=1e-6)  # offset 0 is the 1x cell
    spread = max(probe) - min(probe)
    if position == "sinusoidal":
        assert spread > 1e-2
    else:
        assert spread < 1e-4


def test_penalty_is_zero_when_the_model_ignores_context_and_positions():
    """With attention and MLP outputs zeroed, a NoPE model predicts from the current token alone: the window
    loss and the reference loss of every token must agree exactly."""
    model = sharp_model(position="none", max_seq_len=8)
    for block in model.layers:
        block.attention.o_proj.weight.data.zero_()
        block.ffn.down_proj.weight.data.zero_()
    ids = np.random.default_rng(3).integers(0, 97, 3000)
    evaluation = evaluate_checkpoint(model, ids, make_plan(len(ids), 8, ["1x", "4x"], 512), [])
    assert np.abs(evaluation.penalty_windows("none", 32)).max() < 1e-6
    assert np.abs(evaluation.losses["none@32"] - evaluation.reference).max() < 1e-5


def test_penalty_is_measured_only_beyond_the_trained_length():
    model = sharp_model(position="rope", max_seq_len=8)
    ids = np.random.default_rng(4).integers(0, 97, 3000)
    evaluation = evaluate_checkpoint(model, ids, make_plan(len(ids), 8, ["1x", "4x"], 512), [])
    manual = []
    losses, reference = evaluation.losses["none@32"], evaluation.reference
    for segment in range(losses.shape[0]):
        for window in range(losses.shape[1] // 32):
            columns = slice(window * 32 + 8, (window + 1) * 32)
            manual.append(float((losses[segment, columns] - reference[segment, columns]).mean()))
    assert np.allclose(evaluation.penalty_windows("none", 32), manual, atol=1e-6)
    assert evaluation.penalty_windows("none", 8) is None


def test_evaluation_round_trips_through_its_cache_file(tmp_path):
    model = sharp_model(position="learned", max_seq_len=8)
    ids = np.random.default_rng(5).integers(0, 97, 2000)
    evaluation = evaluate_checkpoint(model, ids, make_plan(len(ids), 8, ["1x", "2x"], 256), ["clamp", "yarn"])
    evaluation.save(tmp_path / "e.npz")
    loaded = CheckpointEvaluation.load(tmp_path / "e.npz")
    assert loaded.plan == evaluation.plan and loaded.errors == evaluation.errors
    assert set(loaded.losses) == {"none@8", "clamp@8", "clamp@16"}  # yarn does not apply to a learned table
    for key, value in evaluation.losses.items():
        assert np.array_equal(loaded.losses[key], value)
    rows = summary_rows(loaded, "learned", "learned")
    by_label = {(row["label"], row["length"]): row for row in rows}
    assert by_label[("learned", 16)]["ppl"] is None and "beyond the learned table" in by_label[("learned", 16)]["error"]
    assert by_label[("learned+clamp", 16)]["penalty_low"] <= by_label[("learned+clamp", 16)]["penalty"]


def test_methods_give_a_view_of_the_model_as_used_and_apply_only_where_they_can():
    model = sharp_model(position="rope", max_seq_len=8)
    own = model.config.to_dict()
    yarn = model.under(METHODS["yarn"], 32, 8)
    assert yarn.config.rope_scaling["factor"] == 4.0 and yarn.config.rope_scaling["original_max_position_embeddings"] == 8
    assert model.under(METHODS["ntk"], 16, 8).config.rope_scaling == {"rope_type": "ntk", "factor": 2.0}
    dynamic = model.under(METHODS["dynamic"], 128, 8)
    assert dynamic.config.rope_scaling["factor"] == 1.0 and METHODS["dynamic"].incremental
    assert model.under(METHODS["none"], 128, 8) is model
    assert model.config.to_dict() == own  # each method gave a view; the model itself never changed
    assert applies("clamp", "learned") and not applies("clamp", "rope") and not applies("yarn", "alibi")
    assert label("rope", "none") == "rope" and label("learned", "clamp") == "learned+clamp"
    with pytest.raises(ConfigError, match="unknown inference-time method"):
        check_methods(["yarn", "rerope2"])


def test_attention_methods_are_set_for_the_length_and_compose():
    """selfextend's group is the smallest that keeps every position below L; leaky ReRoPE's k maps the longest
    distance below L; yarn+logn sets both; the next method starts again from the checkpoint's own settings."""
    from model.methods import method_spec

    model = sharp_model(position="rope", max_seq_len=8)
    (selfextend,) = model.under(method_spec("selfextend"), 128, 8).config.attention_methods
    group = selfextend["group"]
    assert selfextend["neighbors"] == 4 and 127 // group + 4 - 4 // group <= 7  # every distance below L
    assert 127 // (group - 1) + 4 - 4 // (group - 1) > 7  # and the smallest such group
    (leaky,) = model.under(method_spec("leaky_rerope"), 128, 8).config.attention_methods
    assert leaky["window"] == 4 and leaky["window"] + (128 - 1 - leaky["window"]) / leaky["k"] < 8
    both = model.under(method_spec("yarn+logn"), 32, 8)
    assert both.config.rope_scaling["factor"] == 4.0
    assert both.config.attention_methods == [{"method": "logn", "base_length": 8}]
    assert model.under(method_spec("yarn"), 32, 8).config.attention_methods == []
    assert applies("sinks", "alibi") and not applies("sinks", "shaw") and not applies("rerope", "alibi")
    assert not applies("temperature", "rope") and applies("temperature", "rope", ["rope", "none"])
    assert not applies("sinks", "fire") and applies("yarn+logn", "rope", ["rope", "none"])
    assert applies("yarn+logn", "rope") and not applies("yarn+logn", "alibi") and applies("logn", "cope")
    for bad, message in [("yarn+linear", "at most one RoPE scaling"), ("rerope+selfextend", "each sets positions"),
                         ("dynamic+rerope", "'dynamic' scaling"), ("clamp+rerope", "no common encoding")]:
        with pytest.raises(ConfigError, match=message):
            check_methods([bad])


def test_evaluation_with_attention_methods_scores_every_length():
    model = sharp_model(position="rope", max_seq_len=8)
    ids = np.random.default_rng(5).integers(0, 97, 2000)
    methods = ["rerope", "selfextend", "sinks", "window", "yarn+logn", "temperature", "rerope+logn"]
    evaluation = evaluate_checkpoint(model, ids, make_plan(len(ids), 8, ["1x", "4x"], 256), methods)
    evaluated = ["none", *[m for m in methods if m != "temperature"]]  # temperature needs NoPE layers
    assert set(evaluation.losses) == {f"{m}@{n}" for m in evaluated for n in (8, 32)}
    # At 1x these change nothing: the window (L) and sinks + window (4 + L - 4) see every key, yarn's factor is 1
    # and logn's factor is 1 below L.
    for method in ("window", "sinks", "yarn+logn"):
        assert np.allclose(evaluation.losses[f"{method}@8"], evaluation.losses["none@8"], atol=1e-5)
    assert model.config.attention_methods == []  # left as trained


def test_clamp_gives_a_view_that_shares_the_learned_table():
    model = sharp_model(position="learned", max_seq_len=8)
    view = model.under(METHODS["clamp"], 32, 8)
    assert view.config.position_args["learned"]["clamp"] and not model.config.position_args["learned"]["clamp"]
    assert view.position.table.weight is model.position.table.weight  # the same tensor, not a copy
    assert all(a is b for a, b in zip(view.layers.parameters(), model.layers.parameters()))
    ids = torch.arange(8)[None]
    with torch.no_grad():
        assert torch.equal(view(ids)[0], model(ids)[0])  # within the table the clamp changes nothing
        model.position.table.weight[3] += 1.0  # a change to the model's weights is the view's too
        assert torch.equal(view(ids)[0], model(ids)[0])
    with pytest.raises(PositionRangeError):
        model(torch.arange(9)[None])
    assert view(torch.arange(12)[None])[0].shape == (1, 12, 97)


def test_reference_stride_must_divide_the_trained_length():
    with pytest.raises(ConfigError, match="must divide the trained length"):
        make_plan(10_000, 8, ["1x", "2x"], 256, reference_stride=3)
    plan = make_plan(10_000, 8, ["1x", "2x", "4x"], 256)
    assert plan.segments.length == 32 and plan.reference_stride == 1 and plan.probe_offsets == (0, 8, 24, 120)
    assert math.isclose(plan.segments.tokens, 256)


def test_tables_name_each_variants_trained_length():
    """Checkpoints trained at different lengths in one table: each row states its L, the note both scales."""
    from eval.extrapolation import tables_markdown

    rows = [{"label": label, "trained_length": trained, "length": trained * multiple, "multiple": multiple,
             "ppl": 10.0 * multiple, "tokens": 64, "penalty": None if multiple == 1 else 0.01,
             "penalty_low": 0.0, "penalty_high": 0.02}
            for label, trained in (("short", 256), ("extended", 1024)) for multiple in (1, 2)]
    table = tables_markdown(rows)
    assert "| variant | L | 1x | 2x |" in table
    assert "| short | 256 |" in table and "| extended | 1024 |" in table
    assert "L = 256: 1x = 256, 2x = 512; L = 1024: 1x = 1024, 2x = 2048" in table
