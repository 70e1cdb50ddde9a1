"""model/attention_path.py: the one place that chooses the attention path, its decision for every encoding in the
three situations the project runs (scripts.attention_paths), each rule firing, and the trainer and the evaluation
recording what their forwards took. That each path computes the same numbers is tested where each path lives
(tests/test_flex.py, tests/test_shared_bias.py, tests/test_position.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.attention_path import EXPLICIT, FLEX, MERGED, SDPA, SDPA_MASK, Forward, Path, choose, describe
from model.encodings import POSITION_ENCODINGS
from model.runtime import RuntimeConfig, configure_runtime
from model.transformer import Transformer
from scripts.attention_paths import SITUATIONS, paths_of
from tests.conftest import micro_config

# (training, 16x evaluation, cached decoding) for each encoding at the micro shape (L = 32: 16x is 512 tokens).
EXPECTED = {
    "none": (SDPA, SDPA, SDPA),
    "rope": (SDPA, SDPA, SDPA),
    "xpos": (SDPA, SDPA, SDPA),
    "sinusoidal": (SDPA, SDPA, SDPA),
    "learned": (SDPA, SDPA, SDPA),
    "alibi": (SDPA_MASK, SDPA_MASK, SDPA_MASK),  # a fixed bias; the evaluation scores two windows at once
    "t5": (EXPLICIT, SDPA_MASK, SDPA_MASK),  # learned: explicit steps when gradients are wanted on the CPU
    "kerple": (EXPLICIT, SDPA_MASK, SDPA_MASK),
    "fire": (EXPLICIT, SDPA_MASK, SDPA_MASK),
    "shaw": (EXPLICIT, FLEX, EXPLICIT),  # a value term; its clipped form takes FlexAttention for batches too
    "cope": (EXPLICIT, EXPLICIT, EXPLICIT),  # its bias reads the scores
    "ssmax": (SDPA, SDPA, SDPA),  # a factor on the queries, no bias
    "fox": (EXPLICIT, FLEX, SDPA_MASK),  # a learned bias; its separable form takes FlexAttention for batches too
    "stickbreaking": (EXPLICIT, EXPLICIT, EXPLICIT),  # weights of its own instead of softmax
    "dape": (EXPLICIT, EXPLICIT, EXPLICIT),  # its bias reads the scores
    "path": (EXPLICIT, EXPLICIT, EXPLICIT),  # scores of its own: keys transformed per query
    "asentmax": (EXPLICIT, EXPLICIT, EXPLICIT),  # weights of its own (alpha-entmax) instead of softmax
    "pope": (SDPA, SDPA, SDPA),  # queries and keys in polar form, twice as wide as the values, no bias
    "fope": (SDPA, SDPA, SDPA),  # queries and keys turned by Fourier series, no bias
}


def test_the_expectations_cover_every_registered_encoding():
    assert set(EXPECTED) == set(POSITION_ENCODINGS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_encoding_takes_its_path_in_training_evaluation_and_decoding(name):
    shape = {"vocab_size": 97, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 32}
    found = paths_of({"position": name}, torch.device("cpu"), batch=2, shape=shape)
    for situation, expected in zip(SITUATIONS, EXPECTED[name]):
        (only,) = found[situation].values()  # both layers took the same path
        assert only.split(":")[0] == expected, (situation, only)


def forward(**changes) -> Forward:
    values = dict(device="cpu", grad=False, dtype=torch.float32, batch=1, queries=1024, keys=1024)
    return Forward(**{**values, **changes})


def test_each_rule_decides_and_says_why():
    alibi = Transformer(micro_config(position="alibi")).position
    t5 = Transformer(micro_config(position="t5")).position
    rope = Transformer(micro_config(position="rope")).position
    assert choose(alibi, forward()).kind == FLEX
    assert choose(alibi, forward(), consecutive=lambda: False).reason.endswith("positions that are not consecutive")
    assert choose(alibi, forward(batch=2)).kind == SDPA_MASK
    assert "bfloat16" in choose(alibi, forward(dtype=torch.bfloat16)).reason
    assert choose(alibi, forward(queries=256, keys=256)).kind == SDPA_MASK
    assert choose(alibi, forward(device="cuda")).kind == SDPA_MASK
    assert choose(alibi, forward(observed=True)).kind == EXPLICIT
    assert choose(rope, forward(passes=True, methods=True)).kind == MERGED
    assert choose(rope, forward(passes=True, methods=True, grad=True)).reason.endswith("gradients are wanted")
    assert choose(rope, forward(passes=True, methods=True, device="cuda")).kind == EXPLICIT
    assert choose(rope, forward(passes=True, methods=True, observed=True)).kind == EXPLICIT
    assert choose(rope, forward(window=8)).kind == SDPA_MASK  # a window: chunks, even without a bias
    assert choose(rope, forward(visibility=True, methods=True)).kind == SDPA_MASK
    assert choose(rope, forward()).kind == SDPA
    assert choose(t5, forward(grad=True, batch=4, queries=64, keys=64)).kind == EXPLICIT
    assert choose(t5, forward(grad=True, device="cuda", batch=4, queries=64, keys=64)).kind == SDPA_MASK
    assert choose(alibi, forward(flex_enabled=False)).reason.endswith("runtime.flex_attention is off")


def test_on_cuda_flex_waits_for_its_switch_then_serves_training_bf16_batches_and_windows():
    """runtime.flex_cuda (off by default: nothing is measured on CUDA yet) lets CUDA forwards take FlexAttention,
    training and bf16 included; the CPU's rules do not change with it."""
    by_name = {name: Transformer(micro_config(position=name)).position
               for name in ("alibi", "t5", "kerple", "shaw", "fox", "fire", "rope")}
    training = dict(device="cuda", grad=True, dtype=torch.bfloat16, batch=8, queries=128, keys=128)
    off = choose(by_name["t5"], forward(**training))
    assert off.kind == SDPA_MASK and "runtime.flex_cuda" in off.reason
    for name in ("alibi", "t5", "kerple", "shaw", "fox"):
        assert choose(by_name[name], forward(**training, flex_cuda=True)).kind == FLEX, name
        assert choose(by_name[name], forward(device="cuda", batch=2, flex_cuda=True)).kind == FLEX, name
    on = dict(training, flex_cuda=True)
    assert choose(by_name["alibi"], forward(**on, window=32)).kind == FLEX
    assert "window with a clipped bias" in choose(by_name["shaw"], forward(**on, window=32)).reason
    for changes, why in (({"cache": "dynamic", "queries": 1}, "KV cache"), ({"compiling": True}, "compiled graph"),
                         ({"queries": 64, "keys": 64}, "shorter than 128"), ({"dtype": torch.float16}, "float16"),
                         ({"methods": True}, "attention method"), ({"flex_enabled": False}, "flex_attention is off")):
        path = choose(by_name["alibi"], forward(**{**on, **changes}))
        assert path.kind != FLEX and why in path.reason, (changes, path)
    assert "distance alone" in choose(by_name["fire"], forward(**on)).reason  # FIRE's bias reads the query position
    assert choose(by_name["rope"], forward(**on)).kind == SDPA
    for name, grad in (("t5", True), ("alibi", False)):  # the CPU's decisions, with and without the switch
        cpu = dict(grad=grad, batch=2 if grad else 1, queries=64 if grad else 1024, keys=64 if grad else 1024)
        assert choose(by_name[name], forward(**cpu, flex_cuda=True)) == choose(by_name[name], forward(**cpu))


def test_the_attention_reads_the_processs_flex_switch_into_each_forward():
    """choose is a function of its arguments; the attention fills Forward.flex_enabled from the process's runtime
    switch (model/runtime.py) when it gathers each forward's inputs."""
    model = Transformer(micro_config(position="alibi", max_seq_len=32)).eval()
    ids = torch.zeros(1, 512, dtype=torch.long)
    configure_runtime(RuntimeConfig(flex_attention=False))
    try:
        with torch.no_grad():
            model(ids)
        assert all(path.endswith("runtime.flex_attention is off") for path in model.attention_paths().values())
        configure_runtime(RuntimeConfig(flex_cuda=True))  # a CUDA switch: the CPU forward takes FlexAttention as before
        with torch.no_grad():
            model(ids)
        assert all(path.startswith(FLEX) for path in model.attention_paths().values())
    finally:
        configure_runtime(RuntimeConfig())


@pytest.mark.parametrize("name", sorted(POSITION_ENCODINGS))
def test_each_encodings_named_path_agrees_with_its_capabilities(name):
    """`attention` and `flex_kind` name what an encoding's capabilities imply (the rule the path was inferred by
    before it was named): EXPLICIT for a bias that reads the scores, a value term, weights or scores of its own;
    BIAS for any other score bias; FUSED without one. FlexAttention for a separable bias, a clipped one, or a bias of
    the distance alone."""
    from model.encodings.base import BIAS, FUSED
    from model.encodings.base import EXPLICIT as NEEDS_EXPLICIT

    encoding = Transformer(micro_config(position=name)).position
    explicit = encoding.has_value_term or encoding.bias_needs_scores or encoding.own_weights or encoding.own_scores
    expected = NEEDS_EXPLICIT if explicit else BIAS if encoding.has_score_bias else FUSED
    assert encoding.attention == expected
    assert (encoding.attention == NEEDS_EXPLICIT) == bool(encoding.why_explicit)
    if encoding.separable_bias and not explicit:
        kind = "separable"
    elif not encoding.relative_only or encoding.bias_from_content or encoding.own_weights or encoding.own_scores:
        kind = None
    elif encoding.clipped_distance:
        kind = "clipped"
    else:
        kind = "distance" if encoding.has_score_bias and not explicit else None
    assert encoding.flex_kind == kind


def test_layers_with_the_same_path_are_merged_in_the_description():
    a, b = Path("sdpa", "x"), Path("explicit", "y")
    assert describe({0: a, 1: a, 2: b, 3: a}) == {"layers 0-1": "sdpa: x", "layer 2": "explicit: y",
                                                  "layer 3": "sdpa: x"}


def test_a_hybrid_reports_each_layers_path():
    model = Transformer(micro_config(position="rope", position_layers=["rope", "alibi"], n_layers=4)).eval()
    with torch.no_grad():
        model(torch.zeros(2, 16, dtype=torch.long))
    paths = model.attention_paths()
    assert [path.split(":")[0] for path in paths.values()] == [SDPA, SDPA_MASK, SDPA, SDPA_MASK]


def test_the_evaluation_records_the_path_of_each_length():
    from eval.extrapolation import evaluate_checkpoint, make_plan

    model = Transformer(micro_config(position="alibi", max_seq_len=8)).eval()
    ids = np.random.default_rng(0).integers(0, 97, 2000)
    evaluation = evaluate_checkpoint(model, ids, make_plan(len(ids), 8, ["1x", "4x"], 256), [])
    assert set(evaluation.paths) == {"none@8", "none@32"}
    assert all(path.startswith(SDPA_MASK) for paths in evaluation.paths.values() for path in paths.values())


def test_the_trainer_says_and_keeps_the_path_of_its_training_forward(prepared_data, tmp_path, capsys):
    from model.checkpoint import load_trainer_state
    from tests.test_train import make_config, train

    out = tmp_path / "run"
    # On the CPU: a learned bias takes the explicit path there, and sdpa_mask on CUDA (tests/test_cuda.py)
    train(make_config(prepared_data, out, "--model.position=t5", "--train.max_steps=2", "--train.device=cpu"),
          prepared_data)
    paths = load_trainer_state(out)["attention_paths"]
    assert list(paths) == ["layers 0-1"] and paths["layers 0-1"].startswith(f"{EXPLICIT}: a learned bias")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("attention (")]
    assert said == [f"attention (layers 0-1): {paths['layers 0-1']}"]  # once per run
