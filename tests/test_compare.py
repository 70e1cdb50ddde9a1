"""eval.compare end to end at micro scale: every variant trained and evaluated, report written, reruns skip."""
import json

from eval.compare import findings, main
from tests.conftest import ROOT

MICRO = ["--model.dim=32", "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1",
         "--model.max_seq_len=16", "--train.max_steps=6", "--train.batch_size=4", "--train.eval_interval=3",
         "--train.eval_batches=1", "--train.log_interval=2", "--compare.vocab_size=300",
         "--compare.eval_tokens=512", '--compare.scalings=["yarn", "dynamic"]', '--compare.lengths=["1x", "2x", "4x"]']


def test_compare_end_to_end(small_text_file, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick", "--out", str(out),
            f"--compare.source={small_text_file}", "--compare.val_fraction=0.3", *MICRO]
    assert main(args) == 0
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    encodings = ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"]
    assert sorted(results["status"]) == sorted(encodings)
    assert set(results["status"].values()) == {"trained"}
    labels = {row["label"] for row in results["rows"]}
    assert labels == set(encodings) | {"rope+yarn", "rope+dynamic"}
    assert {row["multiple"] for row in results["rows"]} == {1.0, 2.0, 4.0}
    for section in ("## Setup", "### Perplexity", "relative to the same variant at 1x", "train_curves.png",
                    "plot.png", "## What this shows", "Reproduce: `python -m eval.compare"):
        assert section in report, section
    for name in ("plot.png", "train_curves.png", "position_loss.png", "table.md"):
        assert (out / name).stat().st_size > 0
    # Re-running skips the trained variants; a variant that fails is reported and the others still run.
    capsys.readouterr()
    assert main(args + ['--compare.encodings=["rope", "xpos"]']) == 1
    results = json.loads((out / "results.json").read_text())
    assert results["status"]["rope"] == "skipped (already trained)"
    assert results["status"]["xpos"].startswith("failed: ConfigError: model.position: unknown encoding 'xpos'")
    assert {row["label"] for row in results["rows"]} == {"rope", "rope+yarn", "rope+dynamic"}


def test_findings_state_the_literature_checks():
    rows = []
    table = {"sinusoidal": [10, 25, 60], "alibi": [10, 10.2, 10.5], "t5": [10, 10.5, 11], "rope": [10, 13, 20]}
    for label, values in table.items():
        for multiple, ppl in zip([1.0, 2.0, 4.0], values):
            rows.append({"label": label, "multiple": multiple, "ppl": ppl})
    text = "\n".join(findings(rows))
    assert "Within 10% of their own 1x perplexity at 4x: alibi (1.05x), t5 (1.10x)." in text
    assert "sinusoidal perplexity more than doubles by 2x: reproduced (sinusoidal at 2x = 2.50x" in text
    assert "ALiBi stays flat (within 10%) out to 4x: reproduced" in text
    assert "rotary degrades steadily with length: reproduced" in text
    assert "Perplexity at 4x, best to worst: alibi (10.5) < t5 (11.0) < rope (20.0) < sinusoidal (60.0)." in text
