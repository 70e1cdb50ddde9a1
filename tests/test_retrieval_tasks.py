"""The retrieval tasks (mqar, niah_multikey): needles at the distance asked for, checked against hand-made examples;
the length x distance grid; the window control against the model run on the last L tokens; the grid over seeds
(eval.retrieval.grid_over_seeds) against hand-made numbers."""
import numpy as np
import pytest
import torch

from data.tasks import (
    BOS,
    FILLER0,
    KEYS,
    NEEDLE0,
    QUERY0,
    TASKS,
    VALUES,
    make_mqar_at,
    make_niah_at,
)
from errors import ConfigError
from eval.retrieval import grid_cells, retrieval_grid, window_control
from eval.task_score import evaluate
from model.transformer import Transformer
from tests.conftest import micro_config


def tokens_of(batch):
    return torch.cat([batch.inputs[:, :1], batch.targets], dim=1)


class FixedRng:
    """A generator whose draws are given: the hand-made examples below fix every random choice."""

    def __init__(self, integers=(), choices=(), permutation=None):
        self._integers, self._choices, self._permutation = list(integers), list(choices), permutation

    def integers(self, low, high=None, size=None):
        if self._integers:
            return np.asarray(self._integers.pop(0))
        return np.full(size, low) if size is not None else low  # filler: its first token everywhere

    def choice(self, values, size, replace):
        return np.asarray(self._choices.pop(0))

    def permutation(self, count):
        return np.asarray(self._permutation if self._permutation is not None else range(count))


def test_mqar_puts_the_needles_the_distance_before_the_queries_a_hand_made_example():
    """Length 20 (4 needles, 8 tokens of queries), distance 9: queries at 12-19, the block of needles at 3-6;
    filler elsewhere; each answer is the needle token of the key its query asks for."""
    rng = FixedRng(integers=[np.full(20, FILLER0), [5, 6, 7, 8]], choices=[[3, 1, 0, 2]], permutation=[2, 0, 3, 1])
    tokens, answers = make_mqar_at(rng, 20, 9)
    needle = [NEEDLE0 + key * VALUES + value for key, value in zip([3, 1, 0, 2], [5, 6, 7, 8])]
    query = [QUERY0 + key for key in [3, 1, 0, 2]]
    order = [2, 0, 3, 1]
    expected = [BOS, FILLER0, FILLER0, *needle, *[FILLER0] * 5,
                *[token for i in order for token in (query[i], needle[i])]]
    assert tokens.tolist() == expected
    assert np.nonzero(answers)[0].tolist() == [13, 15, 17, 19]
    # query i sits at 12 + 2i and asks needle j = order[i], which sits at 3 + j: distance 9 + 2i - j
    assert [12 + 2 * i - (3 + j) for i, j in enumerate(order)] == [9 + 2 * i - j for i, j in enumerate(order)]
    assert [12 + 2 * i - tokens.tolist().index(needle[j]) for i, j in enumerate(order)] == [7, 11, 10, 14]


def test_niah_puts_the_needles_in_a_band_the_distance_before_the_queries_a_hand_made_example():
    """Length 48 (4 needles; queries at 40-47), distance 10: the band is the 8 tokens 23-30, the needles at the 4
    slots drawn from it; the queries ask for every needle, in another order."""
    rng = FixedRng(integers=[np.full(48, FILLER0), [1, 2, 3, 4]], choices=[[23, 26, 30, 24], [9, 4, 2, 11]],
                   permutation=[1, 3, 0, 2])
    tokens, answers = make_niah_at(rng, 48, 10)
    needles = {slot: NEEDLE0 + key * VALUES + value for slot, key, value in zip([23, 26, 30, 24], [9, 4, 2, 11],
                                                                                  [1, 2, 3, 4])}
    assert all(tokens[slot] == needle for slot, needle in needles.items())
    assert set(np.nonzero(tokens[:40] != FILLER0)[0].tolist()) == {0, 23, 24, 26, 30}
    assert tokens[40:48:2].tolist() == [QUERY0 + key for key in (4, 11, 9, 2)]
    assert tokens[41:48:2].tolist() == [needles[slot] for slot in (26, 24, 23, 30)]
    assert np.nonzero(answers)[0].tolist() == [41, 43, 45, 47]


@pytest.mark.parametrize("name", ["mqar", "niah_multikey"])
@pytest.mark.parametrize("length, distance", [(32, 5), (64, 16), (256, 128), (256, 247)])
def test_every_answer_lies_at_the_distance_asked_for(name, length, distance):
    """For each answer, the key before it (the query) occurs earlier exactly once, and that occurrence lies the
    distance asked for before the query (mqar: give or take 2 (i - j), less than twice the pairs)."""
    task = TASKS[name]
    distance = max(task.min_distance, min(distance, task.max_distance(length)))
    batch = task.batch(0, 16, length, distance=distance)
    tokens = tokens_of(batch)
    # how far from `distance` an answer may lie: mqar's block and queries (-3..+6), niah's band (0..+13)
    low, high = (distance - 3, distance + 6) if name == "mqar" else (distance, distance + 13)
    for row in range(16):
        for answer in (torch.nonzero(batch.answers[row]).flatten() + 1).tolist():
            query = answer - 1
            needle = int(tokens[row, answer])
            assert int(tokens[row, query]) == QUERY0 + (needle - NEEDLE0) // VALUES  # the query asks for its key
            earlier = torch.nonzero(tokens[row, :query] == needle).flatten().tolist()
            assert len(earlier) == 1 and low <= query - earlier[0] <= high


@pytest.mark.parametrize("name", ["mqar", "niah_multikey"])
def test_training_sequences_cover_every_distance_the_length_holds(name):
    task = TASKS[name]
    batch = task.batch(0, 400, 32, train=True)
    tokens = tokens_of(batch)
    distances = set()
    for row in range(400):
        for answer in (torch.nonzero(batch.answers[row]).flatten() + 1).tolist():
            query = answer - 1
            distances.add(query - int(torch.nonzero(tokens[row, :query] == tokens[row, answer])[0]))
    assert min(distances) <= 4 and max(distances) >= 25


def test_a_distance_the_length_cannot_hold_or_a_task_without_one_is_refused():
    with pytest.raises(ConfigError, match="does not fit"):
        TASKS["mqar"].batch(0, 1, 32, distance=40)
    with pytest.raises(ConfigError, match="from 4 to"):
        TASKS["mqar"].batch(0, 1, 32, distance=3)  # its block would overlap its queries
    with pytest.raises(ConfigError, match="no answer distance to set"):
        TASKS["copy"].batch(0, 1, 32, distance=4)


def test_the_grid_holds_each_length_and_the_distances_it_fits():
    cells = grid_cells(TASKS["mqar"], 32, [1, 2, 8])
    assert cells == [("1x", "L/2", 16), ("2x", "L/2", 16), ("2x", "2L", 55), ("8x", "L/2", 16), ("8x", "2L", 64),
                     ("8x", "4L", 128), ("8x", "8L", 247)]


@pytest.mark.parametrize("position", ["alibi", "rope", "t5"])
def test_the_window_control_equals_the_model_run_on_its_first_token_and_last_L_minus_1(position):
    """One layer (stacked layers relay what lies further back): the last query's logits under the window control
    equal those of the same weights on the first token and the last L - 1 tokens alone, at their own positions,
    for distance biases and rotations."""
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, n_layers=1, max_seq_len=16)).eval()
    idx = torch.randint(0, 97, (2, 40))
    kept = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(25, 40)])  # token 0 and the last 15
    with torch.no_grad():
        windowed = window_control(model, 16)(idx)[0][:, -1]
        alone = model(idx[:, kept], positions=kept[None])[0][:, -1]
        full = model(idx)[0][:, -1]
    assert torch.allclose(windowed, alone, atol=1e-5)
    assert not torch.allclose(full, alone, atol=1e-3)  # the control changes something


def test_the_window_control_of_randomized_positions_counts_tokens_not_position_ids():
    """Randomized positions (Ruoss et al.) spread a sequence's position ids over [0, N): the control still hides
    every token but the first and the last L - 1, whatever ids they were drawn, and hides nothing within L."""
    torch.manual_seed(0)
    model = Transformer(micro_config(position="rope", n_layers=1, max_seq_len=16, random_positions=256)).eval()
    idx = torch.randint(0, 97, (2, 40))
    kept = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(25, 40)])
    with torch.no_grad():
        assert torch.allclose(window_control(model, 16)(idx[:, :16])[0], model(idx[:, :16])[0], atol=1e-5)
        drawn = model.default_positions(idx, None)  # the ids the model draws for these rows
        windowed = window_control(model, 16)(idx)[0][:, -1]
        alone = model(idx[:, kept], positions=drawn[:, kept])[0][:, -1]
        full = model(idx)[0][:, -1]
    assert torch.allclose(windowed, alone, atol=1e-5)
    assert not torch.allclose(full, alone, atol=1e-3)


def test_the_window_control_covers_stick_breaking():
    """Hiding keys applies to weights of an encoding's own (stick-breaking), as to softmax."""
    torch.manual_seed(0)
    model = Transformer(micro_config(position="stickbreaking", n_layers=1, max_seq_len=16)).eval()
    idx = torch.randint(0, 97, (1, 40))
    kept = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(25, 40)])
    with torch.no_grad():
        assert torch.allclose(window_control(model, 16)(idx)[0][:, -1],
                              model(idx[:, kept], positions=kept[None])[0][:, -1], atol=1e-5)


def test_a_context_blind_model_is_at_chance_on_the_grid_and_its_control_equals_it():
    """A model whose embeddings are zero predicts the same for every context: at chance in every cell, and its
    window control the same, so the paired difference is exactly 0."""
    model = Transformer(micro_config(position="rope", vocab_size=TASKS["mqar"].vocab_size, max_seq_len=16)).eval()
    with torch.no_grad():
        model.tok_embeddings.weight.zero_()
    grid = retrieval_grid(model, TASKS["mqar"], 16, [1, 2], 32)
    assert set(grid) == {"1x", "2x"} and set(grid["2x"]) == {"L/2", "2L"}
    for cells in grid.values():
        for cell in cells.values():
            assert cell["full"] == cell["window"]
            assert cell["full"]["token_accuracy"] <= 2 / 64  # one fixed token: right at most by chance


def test_the_grid_aggregates_per_cell_over_seeds_against_hand_made_numbers():
    from eval.retrieval import grid_over_seeds

    def seed(full, window):
        return {"8x": {"4L": {"distance": 128, "full": {"exact_match": full, "token_accuracy": full},
                              "window": {"exact_match": window, "token_accuracy": window}}}}

    merged = grid_over_seeds([seed(0.9, 0.1), seed(0.7, 0.1), seed(0.8, 0.0)], 128, 0.95)
    cell = merged["8x"]["4L"]
    assert cell["distance"] == 128
    full, window, difference = cell["full"], cell["window"], cell["difference"]
    assert abs(full.mean - 0.8) < 1e-12 and full.n == 3 and 0 <= full.low < 0.8 < full.high <= 1
    # the union of the t interval on the paired differences 0.8, 0.6, 0.8 (mean 0.7333, sd 0.11547, n 3,
    # t(0.975, 2) = 4.3027) and the MOVER interval from the two parts' own limits, cut to [-1, 1]
    half = 4.302653 * 0.1154701 / 3 ** 0.5
    mover = (0.733333 - ((full.mean - full.low) ** 2 + (window.high - window.mean) ** 2) ** 0.5,
             0.733333 + ((full.high - full.mean) ** 2 + (window.mean - window.low) ** 2) ** 0.5)
    assert difference.mean == pytest.approx(0.733333, abs=1e-5)
    assert difference.low == pytest.approx(max(-1.0, min(0.733333 - half, mover[0])), abs=1e-4)
    assert difference.high == pytest.approx(min(1.0, max(0.733333 + half, mover[1])), abs=1e-4)
    assert difference.high - difference.low >= full.high - full.low


def test_an_oracle_retrieves_at_every_distance_and_evaluate_takes_the_distance():
    """evaluate(..., distance) scores the sequences of that distance: an oracle that looks the key up scores 1."""
    task = TASKS["niah_multikey"]

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, inputs):
            logits = torch.full((*inputs.shape, task.vocab_size), -1.0)
            for row in range(inputs.shape[0]):
                for at in range(1, inputs.shape[1]):
                    if inputs[row, at] >= QUERY0 and inputs[row, at] < QUERY0 + KEYS:  # a query: its key's needle
                        key = int(inputs[row, at]) - QUERY0
                        found = [t for t in inputs[row, :at].tolist() if (t - NEEDLE0) // VALUES == key and
                                 NEEDLE0 <= t < QUERY0]
                        logits[row, at, found[0]] = 1.0
            return logits, None

    for distance in (8, 60, 100):
        assert evaluate(Oracle(), task, 128, 8, distance=distance)["exact_match"] == 1.0


def test_the_retrieval_command_scores_checkpoints_on_any_grid_and_refuses_another_tasks_model(tmp_path, capsys):
    import json

    from eval import retrieval
    from model.checkpoint import save_checkpoint

    task = TASKS["mqar"]
    folder = tmp_path / "model"
    save_checkpoint(folder, Transformer(micro_config(vocab_size=task.vocab_size, max_seq_len=32)))
    out = tmp_path / "out"
    assert retrieval.main(["--checkpoint", str(folder), "--task", "mqar", "--lengths", "4x,256", "--distances",
                           "0.5x,3x,200", "--count", "4", "--out", str(out)]) == 0
    cells = json.loads((out / "results.json").read_text())["results"][0]["cells"]
    # 200 tokens do not fit the 128-token length, and are left out there
    assert task.max_distance(128) < 200 <= task.max_distance(256)
    assert [(cell["length"], cell["distance"]) for cell in cells] == [(128, 16), (128, 96), (256, 16), (256, 96),
                                                                      (256, 200)]
    assert all(0 <= cell[side]["exact_match"] <= 1 for cell in cells for side in ("full", "window"))
    assert (out / "table.md").read_text().count("\n| ") == 1 + len(cells)
    other = tmp_path / "other"
    save_checkpoint(other, Transformer(micro_config(max_seq_len=32)))
    assert retrieval.main(["--checkpoint", str(other), "--task", "mqar", "--out", str(tmp_path / "o2")]) == 2
    assert "not trained on this task" in capsys.readouterr().err
