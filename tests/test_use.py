"""eval.use: the probe's windows against a hand-made layout, use of an oracle that copies within its reach (clearly
positive within it, 0 beyond), a real model under a sliding window (exactly 0 past the window), the second view
against a hand count, and the verdicts of eval.stats on hand-made data."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from errors import ConfigError
from eval.stats import Spread, equivalent, one_sided_above, spread
from eval.use import (
    GAP,
    LEAD,
    Placement,
    across_documents,
    build_windows,
    fitting_count,
    lead_tokens,
    longest_distance,
    measure_use,
    place,
    recurrence_distances,
    rows_table,
    self_checks,
)
from eval.verdicts import USE_RULE, verdict
from model.config import ModelConfig
from model.transformer import Transformer


def test_placement_matches_the_hand_made_layout():
    # window of 101 tokens; second copies packed from the end, distances interleaved (40 first), GAP = 2 between
    # passages: (57, 97) and (71, 91) go in first; the next 40 lands at (45, 85); the next 20 finds no room until
    # its first copy clears 45-48 and 57-60: (31, 51)
    assert GAP == 2 and LEAD == 16 and lead_tokens(100) == 6  # a short window keeps 1/16 of it natural
    placements = place(100, 4, [20, 40], 2)
    assert placements == [Placement(20, 31, 51), Placement(20, 71, 91), Placement(40, 45, 85), Placement(40, 57, 97)]
    assert list(placements[0].scored(4)) == [51, 52, 53]  # loss columns of tokens 52..54: tokens 2..4 of the copy


def test_a_window_of_l_holds_as_many_passages_as_fit():
    # L = 64, S = 8, d = 32, lead 4: seconds at 57 and 47, firsts at 25 and 15; a third first would start at 5,
    # within GAP of the lead
    assert fitting_count(64, 8, [32], 4) == 2
    assert place(64, 8, [32], 2) == [Placement(32, 15, 47), Placement(32, 25, 57)]
    assert fitting_count(64, 8, [60], 4) == 0


def test_placement_refuses_what_does_not_fit():
    with pytest.raises(ConfigError, match="shorter than a passage"):
        place(100, 8, [5], 1)
    with pytest.raises(ConfigError, match="do not fit"):
        place(100, 8, [80], 4)
    with pytest.raises(ConfigError, match="at least 2"):
        place(100, 1, [20], 1)
    longest = longest_distance(100, 4, [20], 2)
    place(100, 4, [20, longest], 2)
    with pytest.raises(ConfigError):
        place(100, 4, [20, longest + 1], 2)


def test_probe_and_control_differ_only_in_the_first_copies():
    ids = np.arange(10_000) % 9973 + 7  # every 4-gram distinct: passages are identifiable
    placements = place(100, 4, [20, 40], 2)
    probe, control = build_windows(ids, 100, placements, 4, 3, seed=1)
    assert probe.shape == control.shape == (3, 101)
    first = np.zeros(101, dtype=bool)
    for p in placements:
        first[p.first : p.first + 4] = True
        assert (probe[:, p.first : p.first + 4] == probe[:, p.second : p.second + 4]).all()  # the repeat
        assert (control[:, p.second : p.second + 4] == probe[:, p.second : p.second + 4]).all()  # same second copy
        assert (control[:, p.first : p.first + 4] != probe[:, p.first : p.first + 4]).all()  # other text there
    assert (probe[:, ~first] == control[:, ~first]).all()
    # the rest is the text itself: outside the passages each window is a contiguous run of ids
    natural = np.ones(101, dtype=bool)
    for p in placements:
        natural[p.first : p.first + 4] = natural[p.second : p.second + 4] = False
    for row in probe:
        start = row[0] - 7
        assert (row[natural] == (np.arange(start, start + 101) % 9973 + 7)[natural]).all()


def test_passages_parted_by_a_document_end_are_counted():
    # the gaps between copies: d = 20 at [35, 51) and [75, 91); d = 40 at [49, 85) and [61, 97)
    placements = place(100, 4, [20, 40], 2)
    windows = np.ones((2, 101), dtype=np.int64)
    windows[0, 80] = 0  # parts the second d = 20 passage and both d = 40 ones
    windows[1, 40] = 0  # parts the first d = 20 passage only
    windows[1, 33] = 0  # inside a first copy (31-34): parts nothing
    apart = across_documents(windows, placements, 4, [20, 40], separator=0)
    assert apart.tolist() == [[[False, True], [True, True]], [[True, False], [False, False]]]


def test_use_rows_count_the_copies_in_two_documents():
    ids = text(2)
    ids[::100] = 0  # a document end every 100 tokens: each gap of 150 tokens holds one
    [result] = measure_use(CopyOracle(512, reach=64), ids, trained=64, length=256, distances=[24, 160], span=8,
                           per_distance=2, windows=3, separator=0)
    rows = [result.row(i, 64, 0.05) for i in range(2)]
    assert [r["passages_scored"] for r in rows] == [6, 6]
    assert rows[1]["across_documents"] == 6  # 160 apart: the 152 tokens between the copies hold a document end
    assert rows[0]["across_documents"] < 6  # 24 apart: 16 tokens between them
    assert any("copies in two documents" in line for line in self_checks(rows, 64))
    [unknown] = measure_use(CopyOracle(512, reach=64), ids, trained=64, length=256, distances=[24], span=8,
                            per_distance=2, windows=3)
    assert "across_documents" not in unknown.row(0, 64, 0.05)

    # joined: the same windows with each document end written as another token; the count still says where they were
    seen = []
    oracle = CopyOracle(512, reach=64)
    oracle.forward = lambda inputs, *a, **k: (seen.append(inputs.clone()), CopyOracle.forward(oracle, inputs, *a, **k))[1]
    [joined] = measure_use(oracle, ids, trained=64, length=256, distances=[24, 160], span=8, per_distance=2,
                           windows=3, separator=0, joiner=1)
    assert seen and all((inputs != 0).all() for inputs in seen)
    assert joined.row(1, 64, 0.05)["across_documents"] == 6


class CopyOracle(torch.nn.Module):
    """A planted induction pattern: at each position, if the current token occurred within the last `reach` tokens,
    predict (probability 0.9) the token that followed its latest occurrence; otherwise uniform."""

    def __init__(self, vocab: int, reach: int) -> None:
        super().__init__()
        self.reach = reach
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=vocab, n_layers=1, attention_methods=[], to_dict=dict)

    def with_settings(self, **changes):
        return self

    def under(self, method, length, trained):
        return self

    def forward(self, inputs, targets, positions=None, loss_reduction="none", logits_to_keep=0, return_logits=True):
        rows, time = inputs.shape
        vocab = self.config.vocab_size
        probs = torch.full((rows, time, vocab), 0.1 / vocab)
        for r in range(rows):
            seen: dict[int, int] = {}
            x = inputs[r].tolist()
            for i in range(time):
                j = seen.get(x[i])
                probs[r, i] += (0.9 if j is not None and i - j <= self.reach and j + 1 < time else 0.0) * \
                    F.one_hot(torch.tensor(x[j + 1] if j is not None and j + 1 < time else 0), vocab)
                if j is None or not (i - j <= self.reach and j + 1 < time):
                    probs[r, i] += 0.9 / vocab
                seen[x[i]] = i
        loss = F.nll_loss(probs.log().transpose(1, 2), targets, reduction="none")
        return None, loss


def text(seed: int = 0, size: int = 20_000, vocab: int = 512) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=size)


def test_use_is_clearly_positive_within_reach_and_zero_beyond_it():
    oracle = CopyOracle(512, reach=64)
    [result] = measure_use(oracle, text(), trained=64, length=256, distances=[24, 160], span=8, per_distance=2,
                           windows=4)
    within, beyond = result.use[:, 0], result.use[:, 1]
    assert within.min() > 2.0  # copying 7 tokens from 24 back: a few nats per token
    assert verdict(spread(within[None, :]), 0.05) == "uses"
    assert np.abs(beyond).max() < 0.2  # other passages' first copies may fall in the reach
    assert verdict(spread(beyond[None, :]), 0.5) in ("none", "cannot tell")


def test_a_real_model_under_a_sliding_window_reads_nothing_past_it():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=512, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, max_seq_len=32,
                         position="rope")
    model = Transformer(config).eval()
    windowed = model.with_settings(attention_methods=[{"method": "window", "window": 32}])
    [plain] = measure_use(model, text(1), trained=32, length=128, distances=[80], span=6, per_distance=1, windows=3)
    [limited] = measure_use(windowed, text(1), trained=32, length=128, distances=[80], span=6, per_distance=1,
                            windows=3)
    assert limited.reach == 32
    assert np.abs(limited.use).max() < 1e-5  # the first copy lies wholly outside every scored query's window
    assert np.abs(plain.use).max() > 1e-4  # without the window the same model's losses do change
    rows = [limited.row(0, 32, 0.05)]
    assert rows[0]["past_reach"] and rows[0]["verdict"] == "none"
    assert "negative control (none, d = 80 beyond its reach): passes" in " ".join(self_checks(rows, 32))


def test_recurrence_distances_by_hand():
    tokens = np.array([5, 6, 7, 5, 6, 7, 9, 5, 6, 8])
    # the bigram before target t is tokens[t-2:t], its loss column t - 1; (5, 6) before t = 2, 5, 9 -> distances 3
    # and 4 at columns 4 and 8; (6, 7) before t = 3 and 6 -> distance 3 at column 5; the others never recur
    assert recurrence_distances(tokens, 2).tolist() == [0, 0, 0, 0, 3, 3, 0, 0, 4]


def test_one_sided_and_equivalence_tests_on_hand_made_data():
    # mean 0.1, se 0.02, 9 df: t(0.975, 9) = 2.2622 -> 95% interval [0.0548, 0.1452]
    estimate = Spread(0.1, 0.02, 9)
    low, high = estimate.bounds()
    assert low == pytest.approx(0.1 - 2.2622 * 0.02) and high == pytest.approx(0.1 + 2.2622 * 0.02)
    assert one_sided_above(estimate) and not equivalent(estimate, 0.14) and equivalent(estimate, 0.15)
    assert verdict(estimate, 0.05) == "uses"
    assert verdict(Spread(0.01, 0.01, 9), 0.05) == "none"  # [-0.0126, 0.0326] inside +-0.05, lower end below 0
    assert verdict(Spread(0.01, 0.05, 9), 0.05) == "cannot tell"
    assert verdict(Spread(0.01, 0.002, 9), 0.05) == "negligible"  # [0.0055, 0.0145]: above 0, within the margin
    values = np.array([[0.1, 0.3, 0.2]])  # one model, three windows: mean 0.2, sd 0.1, se 0.1 / sqrt(3), 2 df
    found = spread(values)
    assert (found.mean, found.df) == (pytest.approx(0.2), 2) and found.se == pytest.approx(0.1 / np.sqrt(3))
    assert spread(np.array([[0.5]])) is None
    with pytest.raises(ValueError):
        equivalent(estimate, 0.0)


def test_the_seeds_of_a_variant_are_summarised_over_seeds_and_windows():
    """eval.use's 'Across seeds' table: checkpoints VARIANT/seedS on the same windows give one row per cell, the
    mean over seeds and windows with eval.stats.spread's interval and the verdict; a lone checkpoint gives none."""
    import numpy as np

    from eval.stats import spread
    from eval.use import across_seeds

    def entry(path, values):
        return {"checkpoint": path, "trained": 64, "margin": 0.05,
                "rows": [{"method": "none", "length": 64, "distance": 32, "use_values": values}]}

    seeds = [[0.30, 0.31, 0.29, 0.30], [0.31, 0.30, 0.30, 0.29], [0.29, 0.30, 0.31, 0.31]]
    results = {f"runs/x/rope/seed{i + 1}": entry(f"runs/x/rope/seed{i + 1}", v) for i, v in enumerate(seeds)}
    results["runs/alone"] = entry("runs/alone", [0.0, 0.1])
    lines = across_seeds(results)
    expected = spread(np.asarray(seeds))
    low, high = expected.bounds()
    assert lines[0] == "## Across seeds"
    assert f"| rope | 3 | 64 (1L) | none | 32 (0.5L) | {expected.mean:+.3f} [{low:+.3f}, {high:+.3f}] | uses |" in lines
    assert not any("alone" in line for line in lines)
    assert across_seeds({"runs/alone": results["runs/alone"]}) == []


def test_jittered_places_fit_differ_between_windows_and_keep_second_copies_past_their_start():
    from eval.use import jittered
    draws = [jittered(1000, 16, [40, 300, 700], 3, np.random.default_rng([0, w]), second_from=500) for w in range(4)]
    for placements in draws:
        assert sorted(p.distance for p in placements) == [40] * 3 + [300] * 3 + [700] * 3
        taken = np.zeros(1001 + GAP, dtype=int)
        for p in placements:
            assert p.second - p.first == p.distance and p.second >= 500 and p.first >= lead_tokens(1000)
            assert p.second + 16 <= 1001
            for start in (p.first, p.second):
                taken[start : start + 16] += 1
        assert taken.max() == 1  # no two copies overlap
    # each window its own places: the longest distance's first copy is not at one fixed token
    assert len({min(p.first for p in placements if p.distance == 700) for placements in draws}) > 1
    assert draws[0] == jittered(1000, 16, [40, 300, 700], 3, np.random.default_rng([0, 0]), second_from=500)
    with pytest.raises(ConfigError, match="found no room"):
        jittered(100, 16, [40, 60], 4, np.random.default_rng(0))


def test_the_priming_control_holds_the_same_tokens_in_another_order():
    from eval.use import shuffled_first_copies, write_copies
    ids = np.arange(5000) % 997
    placements = [Placement(40, 30, 70), Placement(100, 120, 220)]
    probe, control = write_copies(ids, 1000, 300, placements, 16, np.random.default_rng(0))
    shuffled = shuffled_first_copies(control[None], probe[None], placements, 16, np.random.default_rng(1))[0]
    for p in placements:
        first, second = slice(p.first, p.first + 16), slice(p.second, p.second + 16)
        assert (probe[first] == probe[second]).all() and (control[second] == probe[second]).all()
        assert sorted(shuffled[first]) == sorted(probe[first]) and (shuffled[first] != probe[first]).any()
        assert (shuffled[second] == probe[second]).all()
    outside = np.ones(301, dtype=bool)
    for p in placements:
        outside[p.first : p.first + 16] = False
    assert (shuffled[outside] == control[outside]).all()  # only the first copies differ from the control


def test_eval_use_end_to_end_and_its_report_again_from_the_results_file(prepared_data, tmp_path, capsys):
    """eval.use on a micro checkpoint: rows over windows with calibrated verdicts and their margin; --report-only
    writes the same report from results.json alone."""
    import json

    from eval.use import main
    from tests.conftest import train_micro_run

    checkpoint = train_micro_run(prepared_data, tmp_path / "run")
    out = tmp_path / "use"
    assert main(["--checkpoint", str(checkpoint), "--lengths", "1x,4x", "--distances", "0.75x,2x", "--span", "4",
                 "--windows", "3", "--per-distance", "1", "--out", str(out)]) == 0
    [entry] = json.loads((out / "results.json").read_text()).values()
    past = [r for r in entry["rows"] if r["length"] > entry["trained"]]
    assert past and all(r["n"] == 3 and r["unit"] == "windows" and r["se"] is not None for r in past)
    assert all("margin" in r and r["verdict"] in ("uses", "negligible", "none", "cannot tell") for r in past)
    first = (out / "report.md").read_text()
    assert "Holm-corrected" in first
    assert main(["--out", str(out), "--report-only"]) == 0
    again = (out / "report.md").read_text()
    assert "Verdicts re-derived by `python -m eval.use --report-only`" in again
    assert again.count(USE_RULE) == first.count(USE_RULE) == 1  # the rule stated once, the one the verdicts follow
    assert [line for line in again.splitlines() if line.startswith("| ")] == \
        [line for line in first.splitlines() if line.startswith("| ")]  # the same rows and verdicts
    # nothing that fits: a clear error, and the report already written is kept
    assert main(["--checkpoint", str(checkpoint), "--lengths", "1x", "--distances", "0.5x", "--span", "12",
                 "--windows", "3", "--out", str(out)]) == 2
    assert "no distance of --distances 0.5x fits" in capsys.readouterr().err
    assert (out / "report.md").read_text() == again


class CacheOracle(CopyOracle):
    """A planted priming pattern: the next token is one of the tokens of the last `reach` (probability 0.9 spread
    over them), in whatever order they came; otherwise uniform. It gains from a passage's tokens, not their order."""

    def forward(self, inputs, targets, positions=None, loss_reduction="none", logits_to_keep=0, return_logits=True):
        rows, time = inputs.shape
        vocab = self.config.vocab_size
        probs = torch.full((rows, time, vocab), 0.1 / vocab)
        for r in range(rows):
            for i in range(time):
                recent = torch.unique(inputs[r, max(0, i - self.reach + 1): i + 1])
                probs[r, i, recent] += 0.9 / len(recent)
        loss = F.nll_loss(probs.log().transpose(1, 2), targets, reduction="none")
        return None, loss


def test_the_priming_control_splits_use_into_presence_and_order():
    # a copier reads in order: presence at most 0 (the shuffled copy misleads it), order all of the use and more
    [copied] = measure_use(CopyOracle(512, reach=64), text(), trained=64, length=256, distances=[24], span=8,
                           per_distance=2, windows=4, priming=True)
    row = copied.row(0, 64, 0.05)
    assert row["use"]["mean"] > 2.0 and row["presence"]["mean"] <= 0.0 < row["use"]["mean"] <= row["order"]["mean"]
    assert row["order"]["mean"] == pytest.approx(float(np.mean(copied.use[:, 0] - row["presence_values"])))
    # a cache of recent tokens is primed: presence is its use, order nothing
    [cached] = measure_use(CacheOracle(512, reach=64), text(), trained=64, length=256, distances=[24], span=8,
                           per_distance=2, windows=4, priming=True)
    row = cached.row(0, 64, 0.05)
    assert row["use"]["mean"] > 0.5 and abs(row["order"]["mean"]) < 0.05 * row["use"]["mean"]
    assert row["presence"]["mean"] == pytest.approx(row["use"]["mean"], rel=0.05)
    assert "presence | order |" in rows_table([row], 64)[0]
    [plain] = measure_use(CopyOracle(512, reach=64), text(), trained=64, length=256, distances=[24], span=8,
                          per_distance=2, windows=4)
    assert "presence" not in plain.row(0, 64, 0.05)  # measured only when asked: a third forward


def test_a_max_column_keeps_its_verdict_but_is_not_a_reach():
    from eval.use import calibrate

    def row(length, distance, mean, pinned=False):
        return {"method": "none", "length": length, "distance": distance, "multiple": distance / 64, "n": 64,
                "use": {"mean": mean, "low": mean - 0.02, "high": mean + 0.02, "n": 64}, "se": 0.01, "unit": "windows",
                "past_reach": False, "probe_nll": 3.0, "control_nll": 3.0 + mean, **({"pinned": True} if pinned else {})}

    rows = [row(64, 32, 1.0), row(256, 32, 0.9), row(256, 128, 0.8), row(256, 223, 0.7, pinned=True)]
    calibrate(rows, 64)
    assert [r["verdict"] for r in rows[1:]] == ["uses", "uses", "uses"]
    assert {r["reach"] for r in rows[1:]} == {128}  # 223, the window-start column, is shown and not counted
    assert "(window start: not a reach)" in rows_table(rows[1:], 64)[-1]


def test_across_seeds_groups_kept_models_and_carries_presence_and_order():
    from eval.use import across_seeds, seed_group
    assert seed_group("runs/x/runs/rope/seed2") == "rope"
    assert seed_group("runs/x/runs/rope/seed2/snapshots/step-000200") == "rope @ step-000200"
    assert seed_group("runs/smollm2") is None

    def entry(checkpoint, shift):
        values = [0.3 + shift + 0.01 * i for i in range(4)]
        return {"checkpoint": checkpoint, "trained": 64, "margin": 0.05,
                "rows": [{"method": "none", "length": 64, "distance": 32, "use_values": values,
                          "presence_values": [v - 0.1 for v in values], "order_values": [0.1] * 4}]}

    results = {f"{s}{k}": entry(f"runs/x/runs/rope/seed{s}{k}", s / 100)
               for s in (1, 2, 3) for k in ("", "/snapshots/step-000200")}
    lines = across_seeds(results)
    assert lines[4].endswith("| presence | order |")
    rows = [line for line in lines if line.startswith("| rope")]
    assert [row.split(" | ")[0] for row in rows] == ["| rope", "| rope @ step-000200"]
    assert all(row.endswith("+0.100 [+0.100, +0.100] |") for row in rows)  # order: 0.1 in every window and seed
