"""scripts.bench runs end to end and writes its JSON (a smoke test at micro scale: no timing is asserted)."""
import json

import pytest

from scripts.bench import main as bench


def test_bench_writes_every_section(tmp_path, capsys):
    out = tmp_path / "bench-micro.json"
    assert bench(["--shape", "micro", "--repeats", "1", "--train-steps", "1", "--new-tokens", "4",
                  "--long-tokens", "128", "--long-positions", "rope", "--device", "cpu", "--out", str(tmp_path)]) == 0
    results = json.loads(out.read_text())
    assert set(results["training"]["modes"]) == {"ours (default)", "hf eager fp32", "hf eager bf16"}
    training, generation = results["training"]["modes"], results["generation"]["modes"]
    baseline = training["hf eager fp32"]["tokens_per_s"]
    for mode in training.values():
        assert mode["tokens_per_s"] > 0 and 0 < mode["mfu"]
        assert mode["vs_hf_eager_fp32"] == pytest.approx(mode["tokens_per_s"] / baseline)
    assert {"ours (default fp32)", "ours bf16 compiled", "hf generate fp32"} <= set(generation)
    # every contestant ran on the device the report names (on a CUDA machine, ours and transformers' alike)
    assert results["device"] == "cpu"
    assert {mode["device"] for mode in [*training.values(), *generation.values()]} == {results["device"]}
    assert results["long_eval"][0]["tokens"] == 128 and results["long_eval"][0]["peak_rss_mib"] > 0
    assert results["matmul_peak_gflops"]["fp32"] > 0
    assert "every FLOP at the bf16 peak" in capsys.readouterr().out
