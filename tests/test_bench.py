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


def test_eval_memory_reports_each_variant_in_its_own_process(capsys):
    import json

    from scripts.eval_memory import main

    assert main(["--length", "64", "--variants", '[{"position": "fire"}, {"position": "rope", "rope_p": 2}]']) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["settings"] == {"position": "fire"} and lines[0]["peak_rss_mib"] > 0 and lines[0]["length"] == 64
    assert "rope_p" in lines[1]["error"][0]  # a bad variant is reported, the others still run
    assert main(["--variants", "[1, 2]"]) == 2
