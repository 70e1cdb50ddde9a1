"""The retrieval tasks (mqar, niah_multikey): answers at the distance asked for, checked against hand-made examples;
the length x distance grid; the window control against the model run on the last L tokens; the grid's aggregation
over seeds against hand-made numbers."""
import numpy as np
import pytest
import torch

from errors import ConfigError
from eval.task_generators import (
    BOS,
    FILLER0,
    KEY0,
    SEP,
    TASKS,
    VALUE0,
    evaluate,
    grid_cells,
    make_mqar_at,
    make_niah_at,
    retrieval_grid,
    window_control,
)
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


def test_mqar_puts_the_pairs_the_distance_before_the_queries_a_hand_made_example():
    """Length 20 (4 pairs: 8 tokens of pairs, 8 of queries), distance 9: queries at 12-19, pairs at 3-10; filler
    elsewhere; the answers are the values after the queried keys."""
    rng = FixedRng(integers=[None, [5, 6, 7, 8]], choices=[[3, 1, 0, 2]], permutation=[2, 0, 3, 1])
    rng._integers[0] = np.full(20, FILLER0)  # the filler draw comes first
    tokens, answers = make_mqar_at(rng, 20, 9)
    k, v = KEY0, VALUE0
    expected = [BOS, FILLER0, FILLER0, k + 3, v + 5, k + 1, v + 6, k + 0, v + 7, k + 2, v + 8, FILLER0,
                k + 0, v + 7, k + 3, v + 5, k + 2, v + 8, k + 1, v + 6]
    assert tokens.tolist() == expected
    assert np.nonzero(answers)[0].tolist() == [13, 15, 17, 19]
    # query i sits at 12 + 2i and asks pair j = (2, 0, 3, 1)[i], whose key sits at 3 + 2j: distance 9 + 2 (i - j)
    keys_at = {int(tokens[at]): at for at in range(3, 11, 2)}
    assert [12 + 2 * i - keys_at[int(tokens[12 + 2 * i])] for i in range(4)] == [5, 11, 7, 13]


def test_niah_puts_the_queried_needle_the_distance_before_the_query_a_hand_made_example():
    """Length 24, distance 11: the query key at 22, its needle's key at 11; SEP at 21; the answer is the last
    token, the needle's value; the distractor needles lie elsewhere."""
    rng = FixedRng(integers=[np.full(24, FILLER0), [9, 4, 2]], choices=[[3, 15], [40, 41, 42]])
    tokens, answers = make_niah_at(rng, 24, 11)
    assert tokens[0] == BOS and tokens[21] == SEP and tokens[22] == KEY0 + 40 == tokens[11]
    assert tokens[12] == VALUE0 + 9 == tokens[23]
    assert (tokens[3], tokens[4], tokens[15], tokens[16]) == (KEY0 + 41, VALUE0 + 4, KEY0 + 42, VALUE0 + 2)
    assert np.nonzero(answers)[0].tolist() == [23]


@pytest.mark.parametrize("name", ["mqar", "niah_multikey"])
@pytest.mark.parametrize("length, distance", [(32, 5), (64, 16), (256, 128), (256, 247)])
def test_every_answer_lies_at_the_distance_asked_for(name, length, distance):
    """For each answer, the key before it (the query) occurs earlier exactly once, and that occurrence lies the
    distance asked for before the query (mqar: give or take 2 (i - j), less than twice the pairs)."""
    task = TASKS[name]
    distance = max(task.min_distance, min(distance, task.max_distance(length)))
    batch = task.batch(0, 16, length, distance=distance)
    tokens = tokens_of(batch)
    spread = 2 * 4 if name == "mqar" else 1
    for row in range(16):
        for answer in (torch.nonzero(batch.answers[row]).flatten() + 1).tolist():
            query = answer - 1
            key = int(tokens[row, query])
            earlier = torch.nonzero(tokens[row, :query] == key).flatten().tolist()
            assert len(earlier) == 1
            assert abs((query - earlier[0]) - distance) < spread
            assert int(tokens[row, earlier[0] + 1]) == int(tokens[row, answer])


@pytest.mark.parametrize("name", ["mqar", "niah_multikey"])
def test_training_sequences_cover_every_distance_the_length_holds(name):
    task = TASKS[name]
    batch = task.batch(0, 400, 32, train=True)
    tokens = tokens_of(batch)
    distances = set()
    for row in range(400):
        for answer in (torch.nonzero(batch.answers[row]).flatten() + 1).tolist():
            query = answer - 1
            distances.add(query - int(torch.nonzero(tokens[row, :query] == tokens[row, query])[0]))
    assert min(distances) <= 4 and max(distances) >= 25


def test_a_distance_the_length_cannot_hold_or_a_task_without_one_is_refused():
    with pytest.raises(ConfigError, match="does not fit"):
        TASKS["mqar"].batch(0, 1, 32, distance=40)
    with pytest.raises(ConfigError, match="from 8 to"):
        TASKS["mqar"].batch(0, 1, 32, distance=5)  # its pairs would overlap its queries
    with pytest.raises(ConfigError, match="no answer distance to set"):
        TASKS["copy"].batch(0, 1, 32, distance=4)


def test_the_grid_holds_each_length_and_the_distances_it_fits():
    cells = grid_cells(TASKS["niah_multikey"], 32, [1, 2, 8])
    assert cells == [("1x", "L/2", 16), ("2x", "L/2", 16), ("2x", "2L", 61), ("8x", "L/2", 16), ("8x", "2L", 64),
                     ("8x", "4L", 128), ("8x", "8L", 253)]


@pytest.mark.parametrize("position", ["alibi", "rope", "t5"])
def test_the_window_control_equals_the_model_run_on_the_last_L_tokens(position):
    """One layer (stacked layers relay what lies further back): the last query's logits under the window control
    equal those of the same weights on the last L tokens alone, for distance biases and rotations (relative: the
    positions' offset does not matter)."""
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, n_layers=1, max_seq_len=16)).eval()
    idx = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        windowed = window_control(model, 16)(idx)[0][:, -1]
        alone = model(idx[:, -16:])[0][:, -1]
        full = model(idx)[0][:, -1]
    assert torch.allclose(windowed, alone, atol=1e-5)
    assert not torch.allclose(full, alone, atol=1e-3)  # the control changes something


def test_the_window_control_covers_stick_breaking():
    """Hiding keys applies to weights of an encoding's own (stick-breaking), as to softmax."""
    torch.manual_seed(0)
    model = Transformer(micro_config(position="stickbreaking", n_layers=1, max_seq_len=16)).eval()
    idx = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        assert torch.allclose(window_control(model, 16)(idx)[0][:, -1], model(idx[:, -16:])[0][:, -1], atol=1e-5)


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
            assert cell["full"]["token_accuracy"] <= 2 / 64  # one fixed value of 64: right by chance at most


def test_the_grid_aggregates_per_cell_over_seeds_against_a_hand_made_results_file():
    from experiments.tasks import aggregate_grid

    def seed(full, window):
        return {"8x": {"4L": {"distance": 128, "full": {"exact_match": full, "token_accuracy": full},
                              "window": {"exact_match": window, "token_accuracy": window}}}}

    merged = aggregate_grid([seed(0.9, 0.1), seed(0.7, 0.1), seed(0.8, 0.0)])
    cell = merged["8x"]["4L"]
    assert cell["distance"] == 128
    assert cell["full"]["exact_match"]["values"] == [0.9, 0.7, 0.8]
    assert abs(cell["full"]["exact_match"]["mean"] - 0.8) < 1e-12
    difference = cell["difference"]["exact_match"]
    assert difference["values"] == pytest.approx([0.8, 0.6, 0.8])
    # t interval on the paired differences: mean 0.7333, sd 0.11547, n 3, t(0.975, 2) = 4.3027
    half = 4.302653 * 0.1154701 / 3 ** 0.5
    assert difference["mean"] == pytest.approx(0.733333, abs=1e-5)
    assert (difference["low"], difference["high"]) == pytest.approx((0.733333 - half, 0.733333 + half), abs=1e-4)


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
                    earlier = torch.nonzero(inputs[row, :at] == inputs[row, at]).flatten()
                    if len(earlier) and earlier[-1] + 1 < at:
                        logits[row, at, inputs[row, earlier[-1] + 1]] = 1.0
            return logits, None

    for distance in (8, 60, 120):
        assert evaluate(Oracle(), task, 128, 8, distance=distance)["exact_match"] == 1.0
