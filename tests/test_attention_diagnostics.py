"""eval.attention_diagnostics: the statistics against their closed forms, the observer path against the normal
forward."""
import math

import numpy as np
import pytest
import torch

from eval.attention_diagnostics import attention_statistics, main, pattern_statistics, summarise
from model import Transformer
from tests.conftest import micro_config

T, L, SINKS = 12, 5, 2


def closed_forms(kind: str, i: int) -> dict[str, float]:
    if kind == "uniform":  # over keys 0..i
        return {"entropy": math.log(i + 1), "distance": i / 2, "sink": min(SINKS, i + 1) / (i + 1),
                "far": max(0, i - L + 1) / (i + 1)}
    if kind == "first":
        return {"entropy": 0.0, "distance": float(i), "sink": 1.0, "far": float(i >= L)}
    previous = max(i - 1, 0)  # the previous token (the first token attends to itself)
    return {"entropy": 0.0, "distance": float(i - previous), "sink": float(previous < SINKS),
            "far": float(i - previous >= L)}


def pattern(kind: str) -> torch.Tensor:
    probs = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        if kind == "uniform":
            probs[i, : i + 1] = 1 / (i + 1)
        elif kind == "first":
            probs[i, 0] = 1.0
        else:
            probs[i, max(i - 1, 0)] = 1.0
    return probs


@pytest.mark.parametrize("kind", ["uniform", "first", "previous"])
@pytest.mark.parametrize("chunk", [T, 5])
def test_statistics_of_hand_built_patterns_equal_their_closed_forms(kind, chunk):
    """Also when the rows arrive in chunks and each chunk sees only its causal prefix of keys."""
    probs = pattern(kind)
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        keys = slice(0, stop)
        got = pattern_statistics(probs[start:stop, :stop], start, keys, L, SINKS)
        for offset, i in enumerate(range(start, stop)):
            for name, expected in closed_forms(kind, i).items():
                assert abs(got[name][offset].item() - expected) < 1e-9, (kind, name, i)


def test_a_model_with_zero_queries_attends_uniformly_and_the_observer_changes_nothing():
    """With q = 0 every score is 0, so a NoPE (or RoPE) model attends uniformly over its prefix: its statistics are
    the uniform closed forms in every layer and head. The diagnostic forward gives the same logits as the normal
    one."""
    for position in ("none", "rope"):
        model = Transformer(micro_config(position=position, max_seq_len=L)).eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.attention.q_proj.weight.zero_()
        ids = np.random.default_rng(0).integers(0, 97, 10 * T)
        means = attention_statistics(model, ids, T, 10 * T, SINKS)
        for name in ("entropy", "distance", "sink", "far"):
            expected = np.array([closed_forms("uniform", i)[name] for i in range(T)])
            assert np.allclose(means[name], expected[None, None, :], atol=1e-6), (position, name)
    model = Transformer(micro_config(position="alibi")).eval()
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        plain = model(idx)[0]
        attention_statistics(model, idx.flatten().numpy(), 20, 40, SINKS)
        assert model.observer is None and model(idx)[0].equal(plain)  # the model itself is not observed
        view = model.with_observer(lambda *args: None)
        observed = view(idx)[0]
        assert {path.split(":")[0] for path in view.attention_paths().values()} == {"explicit"}
    assert (plain - observed).abs().max() < 1e-5


def test_the_command_writes_results_and_a_plot(prepared_data, tmp_path):
    from tests.conftest import train_micro_run

    run = train_micro_run(prepared_data, tmp_path / "run")
    out = tmp_path / "attention"
    assert main(["--checkpoint", str(run), "--lengths", "1x,4x", "--tokens", "512", "--out", str(out)]) == 0
    import json

    results = json.loads((out / "results.json").read_text())
    row = results["run"]["lengths"]["4x"]
    assert len(row["entropy"]["by_position"][0]) == 64 and row["far"]["beyond_L"] is not None
    assert results["run"]["lengths"]["1x"]["far"]["beyond_L"] is None
    assert (out / "attention.png").stat().st_size > 0


def test_the_summary_keeps_the_means_from_every_position_and_the_curves_in_bins():
    """results.json is a summary: the means within and beyond L come from every position, the curves by position
    are binned to at most BINS (a 1,000-position curve to 63 bins of 16, the last of 8), and a summary written
    before binning (one value per position) is binned when read, to the same curve."""
    import json

    from commands import results_json
    from eval.attention_diagnostics import BINS, binned, curve

    rng = np.random.default_rng(0)
    means = {name: rng.random((2, 3, 1000)) for name in ("entropy", "far")}
    summary = summarise(means, trained=250)
    entropy = summary["entropy"]
    assert np.allclose(entropy["within_L"], means["entropy"][:, :, :250].mean(axis=2), atol=1e-6)
    assert np.allclose(entropy["beyond_L"], means["entropy"][:, :, 250:].mean(axis=2), atol=1e-6)
    assert len(entropy["by_position"][0]) == len(entropy["positions"]) == 63 <= BINS
    assert entropy["positions"][:2] == [7.5, 23.5] and entropy["positions"][-1] == 995.5
    by_head = means["entropy"].mean(axis=1)
    assert np.allclose(entropy["by_position"][1][-1], by_head[1, 992:].mean(), atol=1e-6)
    old = {"by_position": by_head.tolist()}  # the per-position arrays of a summary written before
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(curve(old), curve(entropy)))
    assert binned(np.arange(64.0))[0].tolist() == list(range(64))  # 64 positions or fewer: one bin each
    written = results_json(summary)
    assert written.count("\n") < 40  # a row per line
    assert np.allclose(json.loads(written)["entropy"]["by_position"], entropy["by_position"], rtol=1e-8, atol=0)
