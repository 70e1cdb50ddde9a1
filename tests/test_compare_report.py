"""A comparison's report rendered from a saved state, against its expected text.

tests/fixtures/compare_report/state.json is what experiments.compare's report reads, saved from a micro comparison (6
encodings incl. a named variant, RoPE scalings, log-n and clamp, 2 seeds, a snapshot, the three probes and a
task): the variants' per-seed numbers from the cached evaluations, the snapshot rows, the training summaries, the
job statuses, the data's meta.json and the probe and task result files (the attention curves cut to 8 positions,
which only its figure reads). report.md and table.md beside it were rendered from that state by the code before
experiments/compare/ became a package; the package must write the same text. One line changed since, on purpose: the
encodings' own settings became model.position_args (the state's T5 setting and variants with it), so the setup line
lists them that way. After a deliberate change of the report's text, rewrite them with
`python -m tests.test_compare_report` and review the diff.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from eval.stats import Estimate
from experiments.compare.config import CompareConfig
from experiments.compare.report import report_markdown, tables_markdown
from experiments.compare.results import ComparisonResults, Invocation, Variant
from experiments.compare.running import variant_config
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "compare_report"


def _estimate(values: list | None) -> Estimate | None:
    return None if values is None else Estimate(*values)


def _variant(name: str, saved: dict) -> Variant:
    variant = Variant(saved["encoding"], saved["method"], name)
    variant.nll = {int(n): {int(s): x for s, x in by.items()} for n, by in saved["nll"].items()}
    variant.penalty = {int(n): {int(s): np.asarray(x) for s, x in by.items()} for n, by in saved["penalty"].items()}
    variant.curves = {int(s): np.asarray(x) for s, x in saved["curves"].items()}
    variant.probe = {int(o): {int(s): x for s, x in by.items()} for o, by in saved["probe"].items()}
    variant.errors = {int(n): x for n, x in saved["errors"].items()}
    return variant


def load_state(out: Path) -> ComparisonResults:
    """The saved state as ComparisonResults of a comparison in `out` (its data's meta.json, invocations.jsonl and
    probe and task files written there)."""
    state = json.loads((FIXTURE / "state.json").read_text())
    for relative, data in state["files"].items():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_text(json.dumps(data))
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "data" / "meta.json").write_text(json.dumps(state["meta"]))
    (out / "invocations.jsonl").write_text("".join(json.dumps(record) + "\n" for record in state["invocations"]))
    compare = CompareConfig(**{**state["compare"], "out": str(out)})
    configs = {(e, s): variant_config(state["shared"], e, s, out / "data", compare)
               for s in compare.seeds for e in compare.encodings}
    training = {e: {int(s): summary for s, summary in by_seed.items()} for e, by_seed in state["training"].items()}
    snapshots = {name: [(f, _estimate(p), _estimate(a), _estimate(b)) for f, p, a, b in rows]
                 for name, rows in state["snapshots"].items()}
    variants = {name: _variant(name, saved) for name, saved in state["variants"].items()}
    return ComparisonResults(compare, state["shared"], configs, state["statuses"], training, variants, snapshots,
                             Invocation(**state["invocation"]))


def test_the_report_of_a_saved_state_reads_as_expected(tmp_path):
    results = load_state(tmp_path)
    assert results.trained == 16 and results.lengths == [16, 32, 64] and results.probe_offsets == [0, 16, 48, 240]
    report = report_markdown(results)
    expected = (FIXTURE / "report.md").read_text()
    for heading in ("## Setup", "### Position-shift probe", "### Extrapolation against training tokens",
                    "### Attention diagnostics", "### Induction probe", "### Passkey retrieval", "### Task: flipflop",
                    "## What this shows", "Claims of the newer encodings' papers", "Inference-time methods against"):
        assert heading in report, heading
    assert report.splitlines() == expected.splitlines()  # line by line first: a readable diff
    assert report == expected
    assert tables_markdown(results) == (FIXTURE / "table.md").read_text()
    assert (tmp_path / "attention.png").stat().st_size > 0  # the attention section draws its figure


if __name__ == "__main__":  # rewrite the expected text from the saved state (after a deliberate change)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        state = load_state(Path(folder))
        (FIXTURE / "report.md").write_text(report_markdown(state))
        (FIXTURE / "table.md").write_text(tables_markdown(state))
    sys.exit(0)


def test_every_papers_claim_names_what_a_comparison_can_train():
    """Each claim of NEWER_CLAIMS compares two rows a comparison makes: an encoding or a variant of
    configs/compare.toml, optionally under an inference-time method (NAME+METHOD)."""
    import tomllib

    from experiments.compare.findings import NEWER_CLAIMS
    from model.encodings import POSITION_ENCODINGS
    from model.methods import METHODS

    variants = tomllib.loads((ROOT / "configs/compare.toml").read_text())["compare"]["variants"]
    for claim in NEWER_CLAIMS:
        for row in claim[:2]:
            name, _, method = row.partition("+")
            assert name in POSITION_ENCODINGS or name in variants, claim
            assert not method or method in METHODS, claim
        assert claim[2] in ("1x", "longest") and claim[3] in ("lower", "not higher"), claim
