"""The map preset at a micro scale: text and retrieval tasks for two encodings and two seeds, the window control on
both, and the report's extrapolation map (figure, table, readings) with its numbers in results.json."""

import json

import pytest


@pytest.mark.integration  # two encodings x two seeds, their retrieval models and grids: about two minutes on 2 cores
def test_the_map_preset_draws_harm_against_use(small_text_file, tmp_path):
    from experiments.compare.cli import main
    from tests.test_compare import MICRO, ROOT

    out = tmp_path / "map"
    overrides = [o for o in MICRO if not o.startswith(("--compare.methods", "--compare.seeds"))]
    assert main(["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "map", "--out", str(out),
                 f"--compare.source={small_text_file}", "--compare.val_fraction=0.3", *overrides,
                 '--compare.encodings=["alibi", "rope"]', "--compare.seeds=[1, 2]", '--compare.tasks=["mqar", "niah_multikey"]',
                 "--compare.task_steps=4", "--compare.task_cycle=2", "--compare.task_count=8",
                 "--compare.workers=1"]) == 0
    results = json.loads((out / "results.json").read_text())
    labels = {cell["label"] for cell in results["cells"]}
    assert {"alibi", "alibi+window", "rope", "rope+yarn", "rope+window", "rope+yarn+window"} <= labels
    points = {point["label"]: point for point in results["map"]}
    assert set(points) == {"alibi", "rope", "rope+yarn"}  # the window control is no point of its own
    for point in points.values():
        assert set(point["use"]) == set(point["control"]) == set(point["difference"]) == {"mqar", "niah_multikey"}
        assert point["harm"]["n"] == 2 and point["text_window"]["n"] == 2
    grid = json.loads((out / "tasks" / "mqar" / "results.json").read_text())["grid"]
    assert set(grid) == {"alibi", "rope", "rope+yarn"} and grid["rope"]["8x"]["4L"]["distance"] == 128
    report = (out / "report.md").read_text()
    assert "### The extrapolation map: harm against use" in report and "![the extrapolation map](map.png)" in report
    assert "model - control (paired)" in report and "answer distance" in report
    assert "### Task: mqar" in report and "### Task: niah_multikey" in report  # a section per task (the second
    # used to fail: the first's results shadowed the comparison's)
    assert (out / "map.png").stat().st_size > 0 and not (out / "map.svg").exists()  # one file per figure
