"""model/attention/registry.py: the one place that chooses a layer's attention backend, once per model view and mode;
its decision for every encoding in the three situations the project runs (scripts.performance.attention_paths),
each rule firing, a named backend, and the trainer and the evaluation recording what their forwards took. That each
backend computes the same numbers is tested where each lives (tests/test_flex.py, tests/test_shared_bias.py,
tests/test_pass_merge.py, tests/test_position.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import model.attention.flex as flex
from errors import ConfigError
from model.attention.registry import (
    BACKENDS,
    DECODE,
    EVALUATE,
    EXPLICIT,
    FLEX,
    MERGED,
    SDPA,
    SDPA_MASK,
    TRAIN,
    Inputs,
    Workload,
    choose,
    describe,
)
from model.encodings import POSITION_ENCODINGS
from model.transformer import Transformer
from scripts.performance.attention_paths import SITUATIONS, paths_of
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
    "decoupled": (SDPA, SDPA, SDPA),  # queries and keys widened by a rotary part (DeepSeek's MLA), no bias
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


def workload(**changes) -> Workload:
    return Workload(**{**dict(mode=EVALUATE, device="cpu", dtype=torch.float32), **changes})


def inputs(batch=1, length=1024, consecutive=True, kv_cache=None) -> Inputs:
    """What Flex.why_not_now reads of a forward: the shapes, the cache and the positions (its state's)."""
    positions = torch.arange(length)[None, :] * (1 if consecutive else 2)
    state = type("State", (), {"queries": positions, "keys": positions})()
    q = torch.zeros(batch, 1, length, 1)
    encoding = type("Encoding", (), {"flex_kind": "distance"})()
    return Inputs(q, q, q, encoding, state, kv_cache)


def test_each_rule_decides_and_says_why():
    alibi = Transformer(micro_config(position="alibi")).position
    t5 = Transformer(micro_config(position="t5")).position
    rope = Transformer(micro_config(position="rope")).position
    flex = choose(alibi, workload())
    assert flex.name == FLEX and flex.fallback.name == SDPA_MASK
    # per forward, FlexAttention's conditions send a forward to the fallback chosen beside it, saying why
    assert flex.why_not_now(inputs()) is None
    assert flex.why_not_now(inputs(consecutive=False)) == "positions that are not consecutive"
    assert "several sequences" in flex.why_not_now(inputs(batch=2))
    assert "shorter than 512" in flex.why_not_now(inputs(length=256))
    assert "bfloat16" in choose(alibi, workload(dtype=torch.bfloat16)).reason
    assert choose(alibi, workload(device="cuda")).name == SDPA_MASK
    assert choose(alibi, workload(observed=True)).name == EXPLICIT
    assert choose(rope, workload(passes=True, methods=True)).name == MERGED
    assert choose(rope, workload(passes=True, methods=True, mode=TRAIN)).reason.endswith("gradients are wanted")
    assert choose(rope, workload(passes=True, methods=True, device="cuda")).name == EXPLICIT
    assert choose(rope, workload(passes=True, methods=True, observed=True)).name == EXPLICIT
    assert choose(rope, workload(window=8)).name == SDPA_MASK  # a window: chunks, even without a bias
    assert choose(rope, workload(visibility=True, methods=True)).name == SDPA_MASK
    assert choose(rope, workload()).name == SDPA
    assert choose(t5, workload(mode=TRAIN)).name == EXPLICIT
    assert choose(t5, workload(mode=TRAIN, device="cuda")).name == SDPA_MASK
    assert choose(alibi, workload(mode=DECODE)).reason.endswith("a KV cache")


def test_whether_positions_are_consecutive_is_computed_once_per_state(monkeypatch):
    """Every layer of a forward asks about the same encoding state: the first computes the answer, the others read
    it; another state (the next forward's, or one with other positions) is asked again."""
    compared = []
    equal = torch.equal
    monkeypatch.setattr(flex.torch, "equal", lambda a, b: compared.append(1) or equal(a, b))
    forward, other = inputs().state, inputs(consecutive=False).state
    assert [flex.consecutive(forward) for _ in range(4)] == [True] * 4 and len(compared) == 1
    assert not flex.consecutive(other) and flex.consecutive(forward) and len(compared) == 3
    forward.queries = forward.keys = forward.queries * 2  # other positions in the same state: asked again
    assert not flex.consecutive(forward) and len(compared) == 4


def test_a_named_backend_is_taken_where_it_serves_and_the_rules_elsewhere_say_why():
    alibi = Transformer(micro_config(position="alibi")).position
    cope = Transformer(micro_config(position="cope")).position
    rope = Transformer(micro_config(position="rope")).position
    chosen = choose(alibi, workload(preference="explicit"))
    assert chosen.name == EXPLICIT and chosen.reason == "model.attention_backend = 'explicit'"
    assert choose(alibi, workload(preference="sdpa_mask")).name == SDPA_MASK  # off FlexAttention
    refused = choose(cope, workload(preference="sdpa_mask"))  # CoPE's bias reads the scores: a mask cannot hold it
    assert refused.name == EXPLICIT and "sdpa_mask cannot serve it: a bias that reads the scores" in refused.reason
    assert choose(rope, workload(preference="flex")).name == SDPA  # no bias for FlexAttention to compute
    assert choose(rope, workload(preference="merged")).name == SDPA  # no passes to merge
    with pytest.raises(ConfigError, match="unknown attention backend 'fast'.*'sdpa_mask'"):
        Transformer(micro_config(position="rope", attention_backend="fast"))
    for name in BACKENDS:  # every backend computes what it says it can: the same logits as the rules' choice
        model = Transformer(micro_config(position="alibi", max_seq_len=16)).eval()
        idx = torch.randint(0, 97, (1, 40))
        with torch.no_grad():
            expected = model(idx)[0]
            view = model.with_settings(attention_backend=name)
            assert (view(idx)[0] - expected).abs().max() < 1e-5, name


def test_on_cuda_flex_waits_to_be_named_then_serves_training_bf16_batches_and_windows():
    """model.attention_backend = "flex" (not chosen by "auto" on CUDA: nothing is measured there yet) lets CUDA
    forwards take FlexAttention, training and bf16 included; the CPU's rules do not change with it."""
    by_name = {name: Transformer(micro_config(position=name)).position
               for name in ("alibi", "t5", "kerple", "shaw", "fox", "fire", "rope")}
    training = dict(device="cuda", mode=TRAIN, dtype=torch.bfloat16)
    off = choose(by_name["t5"], workload(**training))
    assert off.name == SDPA_MASK and 'model.attention_backend = \"flex\"' in off.reason
    for name in ("alibi", "t5", "kerple", "shaw", "fox"):
        assert choose(by_name[name], workload(**training, preference="flex")).name == FLEX, name
        assert choose(by_name[name], workload(device="cuda", preference="flex")).name == FLEX, name
    on = dict(training, preference="flex")
    assert choose(by_name["alibi"], workload(**on, window=32)).name == FLEX
    assert "window with a clipped bias" in choose(by_name["shaw"], workload(**on, window=32)).reason
    for changes, why in (({"mode": DECODE}, "KV cache"), ({"compiling": True}, "compiled graph"),
                         ({"dtype": torch.float16}, "float16"), ({"methods": True}, "attention method")):
        chosen = choose(by_name["alibi"], workload(**{**on, **changes}))
        assert chosen.name != FLEX and why in chosen.reason, (changes, chosen.reason)
    assert "distance alone" in choose(by_name["fire"], workload(**on)).reason  # FIRE's bias reads the query position
    assert choose(by_name["rope"], workload(**on)).name == SDPA
    # on the CPU, naming it changes nothing where "auto" takes it, and cannot make it train (no CPU backward)
    assert choose(by_name["alibi"], workload(preference="flex")).name == FLEX == choose(by_name["alibi"], workload()).name
    trained = choose(by_name["t5"], workload(mode=TRAIN, preference="flex"))
    assert trained.name == EXPLICIT and "no FlexAttention backward on the CPU" in trained.reason


def test_the_choice_is_made_once_per_view_and_mode_and_views_choose_their_own():
    model = Transformer(micro_config(position="alibi", max_seq_len=32)).eval()
    ids = torch.zeros(1, 512, dtype=torch.long)
    with torch.no_grad():
        model(ids)
        first = model.backends[model.latest_backends]
        model(ids)
        assert model.backends[model.latest_backends] is first and len(model.backends) == 1  # kept, not chosen again
        assert all(path.startswith(FLEX) for path in model.attention_paths().values())
        chunked = model.with_settings(attention_backend="sdpa_mask")
        chunked(ids)
        assert all(path.startswith(SDPA_MASK) for path in chunked.attention_paths().values())
        assert all(path.startswith(FLEX) for path in model.attention_paths().values())  # the model's own: unchanged
    model.train()
    model(ids[:, :32])
    assert len(model.backends) == 2 and all(path.startswith(SDPA_MASK) for path in model.attention_paths().values())


@pytest.mark.parametrize("name", sorted(POSITION_ENCODINGS))
def test_each_encodings_path_follows_from_its_capabilities(name):
    """`attention` and `flex_kind` are derived from an encoding's capabilities (model/encodings/__init__.py); these
    are the paths each encoding declared by hand before they were derived, which the rule must give again. An
    encoding that needs the explicit steps says why."""
    from model.encodings import BIAS, FUSED
    from model.encodings import EXPLICIT as NEEDS_EXPLICIT

    declared = {"alibi": (BIAS, "distance"), "t5": (BIAS, "distance"), "kerple": (BIAS, "distance"),
                "fox": (BIAS, "separable"), "shaw": (NEEDS_EXPLICIT, "clipped"), "fire": (BIAS, None),
                "cope": (NEEDS_EXPLICIT, None), "dape": (NEEDS_EXPLICIT, None), "path": (NEEDS_EXPLICIT, None),
                "asentmax": (NEEDS_EXPLICIT, None), "stickbreaking": (NEEDS_EXPLICIT, None)}
    encoding = Transformer(micro_config(position=name)).position
    assert (encoding.attention, encoding.flex_kind) == declared.get(name, (FUSED, None))
    assert (encoding.attention == NEEDS_EXPLICIT) == bool(encoding.why_explicit)


def test_layers_with_the_same_path_are_merged_in_the_description():
    a, b = "sdpa: x", "explicit: y"
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
