"""The frontier2 preset at a micro scale: its designs train and evaluate beyond L, the resonance method composes with
a Resonance-trained model, and the report checks the papers' claims (PoPE against RoPE and RoPE + YaRN, Resonance
YaRN against YaRN)."""

import json

import pytest


@pytest.mark.integration  # a comparison of 3 designs x 2 seeds under 2 methods, about a minute on 2 cores
def test_the_frontier2_preset_runs_and_checks_its_claims(small_text_file, tmp_path):
    from experiments.compare.cli import main
    from tests.test_compare import MICRO, ROOT

    out = tmp_path / "cmp"
    assert main(["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "frontier2", "--out", str(out),
                 f"--compare.source={small_text_file}", "--compare.val_fraction=0.3", *MICRO,
                 '--compare.encodings=["rope", "pope", "rope-resonance"]', "--compare.seeds=[1, 2]",
                 '--compare.methods=["yarn", "resonance"]', "--compare.workers=1"]) == 0
    saved = json.loads((out / "runs" / "rope-resonance" / "seed1" / "config.json").read_text())
    assert saved["rope_scaling"]["rope_type"] == "resonance" and saved["rope_scaling"]["factor"] == 1.0
    labels = {cell["label"] for cell in json.loads((out / "results.json").read_text())["cells"]}
    assert {"pope", "rope+resonance", "rope-resonance+resonance", "rope-resonance+yarn"} <= labels
    assert "pope+yarn" not in labels  # a RoPE scaling applies to RoPE models only
    report = (out / "report.md").read_text()
    assert "PoPE extrapolates beyond L better than RoPE under YaRN, zero-shot (Gopalakrishnan et al. 2025)" in report
    assert "Resonance YaRN extrapolates beyond L better than YaRN (Wang et al. 2024)" in report
