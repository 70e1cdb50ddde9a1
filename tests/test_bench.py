"""scripts.bench runs end to end and writes its JSON (a smoke test at micro scale: no timing is asserted)."""
import json

import pytest

from scripts.bench import main as bench

pytestmark = pytest.mark.integration  # end-to-end benchmark runs (bf16 matmul peaks, fresh processes, compile)


def test_bench_writes_every_section(tmp_path, capsys):
    out = tmp_path / "bench-micro.json"
    assert bench(["--shape", "micro", "--repeats", "1", "--train-steps", "1", "--new-tokens", "4",
                  "--long-tokens", "128", "--long-positions", "rope", "--forward-shape", "micro", "--forward-tokens",
                  "256", "--forward-repeats", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    results = json.loads(out.read_text())
    assert set(results["training"]["modes"]) == {"ours (default)", "ours, full logits", "hf eager fp32", "hf eager bf16"}
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
    forward = results["long_forward"]
    assert set(forward["methods"]) == {"none", "selfextend"} and forward["tokens"] == 256
    assert forward["methods"]["selfextend"]["path"].startswith("merged")  # the merged path, as the grid runs it
    assert all(row["gflops"] > 0 and row["of_peak"] > 0 for row in forward["methods"].values())
    assert "every FLOP at the bf16 peak" in capsys.readouterr().out


def test_encoding_costs_measures_each_variant_in_its_own_process(tmp_path, capsys):
    """scripts.encoding_costs: a row per variant with training and evaluation tokens/s and peaks at each length,
    a failed variant reported in its row while the others run, and the table as ratios to rope."""
    import json
    import statistics

    from scripts.encoding_costs import main

    variants = '[{"position": "rope"}, {"position": "fire"}, {"position": "rope", "position_args": {"rope": {"p": 2}}}]'
    assert main(["--variants", variants, "--lengths", "1,2", "--batch", "1", "--train-steps", "1", "--repeats", "1",
                 "--rounds", "2", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "encoding_costs.json").read_text())
    rows = saved["rows"]
    assert rows[0]["rounds"] == 2 and len(saved["all_rounds"][0]) == 2  # each figure: the median over rounds
    assert rows[1]["eval_1x"]["tokens_per_s"] == round(
        statistics.median(r["eval_1x"]["tokens_per_s"] for r in saved["all_rounds"][1]))
    assert [row.get("label") for row in rows[:2]] == ["rope", "fire"]
    for row in rows[:2]:
        assert row["train"]["tokens_per_s"] > 0 and row["eval_1x"]["tokens_per_s"] > 0
        assert row["eval_2x"]["peak_rss_mib"] >= row["eval_1x"]["peak_rss_mib"] > 0  # the longer one runs second
    assert "p in [0, 1]" in rows[2]["error"]  # a bad variant is reported, the others still run
    table = (tmp_path / "encoding_costs.md").read_text()
    assert "| rope | " in table and "(1.00x)" in table and "| fire | " in table and "failed:" in table
    assert main(["--variants", "[1, 2]"]) == 2
    assert main(["--lengths", "0"]) == 2


def test_flex_costs_times_both_paths_in_fresh_processes_and_checks_they_agree(tmp_path):
    """scripts.performance.flex_costs: for a distance bias (ALiBi, through the encoding's own score_bias), Shaw's
    score part,
    Shaw whole (the model's own path) and a sliding window, FlexAttention's output equals the chunked path's (compared across the two processes), with
    times and peaks."""
    import json

    from scripts.performance.flex_costs import main

    assert main(["--cases", "alibi,shaw-score,shaw,window", "--multiples", "1", "--repeats", "1", "--rounds", "1",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "flex_costs.json").read_text())["rows"]
    assert [(row["case"], row["length"]) for row in rows] == [("alibi", 256), ("shaw-score", 256), ("shaw", 256),
                                                                 ("window", 256)]
    for row in rows:
        assert row["max_abs_diff"] < 1e-5
        assert row["chunked"]["seconds"] > 0 and row["flex"]["seconds"] > 0 and row["flex"]["peak_mib"] > 0
    assert "| alibi | 1x (256) |" in (tmp_path / "flex_costs.md").read_text()
    assert main(["--cases", "sinks"]) == 2


def test_encoding_costs_with_compile_reports_the_compiled_step_and_its_break_even(tmp_path):
    """--compile: the compiled train step's speed and first step, and the steps after which compiling has paid,
    computed from the eager and compiled figures of the same row."""
    import json

    from scripts.encoding_costs import main

    assert main(["--variants", '[{"position": "alibi"}]', "--lengths", "1", "--batch", "1", "--train-steps", "1",
                 "--repeats", "1", "--rounds", "1", "--compile", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "encoding_costs.json").read_text())["rows"][0]
    eager, compiled = row["train"], row["train_compiled"]
    assert compiled["tokens_per_s"] > 0 and compiled["first_step_s"] > 0
    eager_step, compiled_step = 256 / eager["tokens_per_s"], 256 / compiled["tokens_per_s"]
    if compiled_step < eager_step:
        assert compiled["break_even_steps"] == round((compiled["first_step_s"] - eager_step)
                                                     / (eager_step - compiled_step))
    else:
        assert compiled["break_even_steps"] == -1
    table = (tmp_path / "encoding_costs.md").read_text()
    assert "compile pays after (steps)" in table and "| alibi | " in table


def test_step_profile_splits_each_modes_step_by_kind(tmp_path):
    """scripts.performance.step_profile: for ours and transformers' step, the profiled self time by kind adds up
    to the profiled total, and both spend time in matmuls and in attention."""
    import json

    from scripts.performance.step_profile import KINDS, kind, main

    assert kind("aten::mm") == "matmul" and kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind("aten::_fused_adamw_") == "optimizer" and kind("Torch-Compiled Region: 0/0") == "compiled kernels"
    assert main(["--shape", "micro", "--steps", "1", "--no-compile", "--out", str(tmp_path)]) == 0
    modes = json.loads((tmp_path / "step_profile-micro.json").read_text())["modes"]
    assert set(modes) == {"ours eager bf16", "hf eager bf16"}
    for mode in modes.values():
        assert sum(mode["by_kind_ms"].values()) == pytest.approx(mode["profiled_ms"])
        assert set(mode["by_kind_ms"]) == set(KINDS) and mode["wall_ms"] > 0
        assert mode["by_kind_ms"]["matmul"] > 0 and mode["by_kind_ms"]["attention"] > 0
    assert "| ours eager bf16 |" in (tmp_path / "step_profile-micro.md").read_text()


def test_encoding_costs_times_a_recipe_at_a_shape_given_on_the_command_line(tmp_path):
    """--shape replaces the default shape (in the parent and the measuring processes); a {"recipe": NAME} variant is
    that recipe of model/recipes.py scaled to the shape, labelled recipe-NAME."""
    import json

    from scripts.encoding_costs import main
    from scripts.performance.measure import COST_SHAPE

    before = dict(COST_SHAPE)
    shape = {"n_layers": 6, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "max_seq_len": 32, "vocab_size": 256}
    assert main(["--variants", '[{"position": "rope"}, {"recipe": "gemma3"}]', "--shape", json.dumps(shape),
                 "--lengths", "1,2", "--batch", "1", "--train-steps", "1", "--repeats", "1", "--rounds", "1",
                 "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "encoding_costs.json").read_text())
    assert saved["shape"] == {**before, **shape} and COST_SHAPE == before
    rope, gemma = saved["rows"]
    assert gemma["label"] == "recipe-gemma3" and "error" not in gemma, gemma
    assert gemma["eval_2x"]["tokens_per_s"] > 0 and gemma["train"]["tokens_per_s"] > 0
    assert any("window" in path for path in gemma["paths_2x"].values()) or gemma["paths_2x"] != rope["paths_2x"]
    assert main(["--shape", "[6]"]) == 2
