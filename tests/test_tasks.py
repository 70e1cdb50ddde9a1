"""Task generators (eval/tasks.py): deterministic, answers masked exactly, an oracle scores 100%, a context-blind
predictor scores at chance."""
import numpy as np
import pytest
import torch

from errors import ConfigError
from eval.task_generators import BOS, READ, SEP, TASKS, WRITE, ZERO, get_task, score

LENGTHS = [16, 33, 64, 257]


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("length", LENGTHS)
def test_generation_is_a_function_of_the_seed(name, length):
    task = TASKS[name]
    first, again, other = task.batch(3, 8, length), task.batch(3, 8, length), task.batch(4, 8, length)
    assert all(torch.equal(a, b) for a, b in zip((first.inputs, first.targets, first.answers),
                                                 (again.inputs, again.targets, again.answers)))
    assert not torch.equal(first.inputs, other.inputs)
    assert first.inputs.shape == (8, length - 1) and first.inputs.max() < task.vocab_size


def test_copy_answers_are_exactly_the_second_copy():
    batch = TASKS["copy"].batch(0, 4, 21)  # 9 symbols, SEP, 9 symbols, then one SEP of padding
    tokens = torch.cat([batch.inputs[:, :1], batch.targets], dim=1)
    for row in range(4):
        assert tokens[row, 0] == BOS and tokens[row, 10] == SEP
        assert torch.equal(tokens[row, 1:10], tokens[row, 11:20])
        answers = torch.nonzero(batch.answers[row]).flatten() + 1  # target t is token t + 1
        assert answers.tolist() == list(range(11, 20))


def test_recall_answers_are_the_values_of_the_queried_keys():
    batch = TASKS["associative_recall"].batch(1, 16, 64)
    tokens = torch.cat([batch.inputs[:, :1], batch.targets], dim=1)
    for row in range(16):
        sep = int(torch.nonzero(tokens[row] == SEP)[0])
        table = {int(tokens[row, i]): int(tokens[row, i + 1]) for i in range(1, sep, 2)}
        answer_positions = (torch.nonzero(batch.answers[row]).flatten() + 1).tolist()
        assert answer_positions
        for position in answer_positions:
            assert table[int(tokens[row, position - 1])] == int(tokens[row, position])
        assert all(position > sep for position in answer_positions)


def test_flipflop_answers_repeat_the_last_written_bit():
    batch = TASKS["flipflop"].batch(2, 16, 129)
    tokens = torch.cat([batch.inputs[:, :1], batch.targets], dim=1)
    for row in range(16):
        memory = None
        for at in range(1, 129, 2):
            if tokens[row, at] == WRITE:
                memory = int(tokens[row, at + 1]) - ZERO
            if tokens[row, at] == READ:
                assert batch.answers[row, at] and int(tokens[row, at + 1]) - ZERO == memory
            else:
                assert not batch.answers[row, at]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_an_oracle_scores_100_and_a_context_blind_predictor_scores_at_chance(name):
    task = TASKS[name]
    batch = task.batch(5, 400, 64)
    oracle = torch.nn.functional.one_hot(batch.targets, task.vocab_size).float()
    assert score(oracle, batch) == {"exact_match": 1.0, "token_accuracy": 1.0}
    # Context-blind: a random answer symbol, the best such a predictor can do in expectation.
    rng = np.random.default_rng(0)
    answer_symbols = sorted(set(batch.targets[batch.answers].tolist()))
    guesses = torch.from_numpy(rng.choice(answer_symbols, size=batch.targets.shape))
    blind = score(torch.nn.functional.one_hot(guesses, task.vocab_size).float(), batch)
    assert abs(blind["token_accuracy"] - task.chance) < 0.05
    expected_exact = float((task.chance ** batch.answers.sum(dim=1).double()).mean())  # all answers right by luck
    assert abs(blind["exact_match"] - expected_exact) < 0.03


def test_unknown_tasks_and_too_short_sequences_are_refused():
    with pytest.raises(ConfigError, match="valid names are"):
        get_task("sort")
    with pytest.raises(ConfigError, match="at least 4 tokens"):
        TASKS["copy"].batch(0, 1, 3)


def test_the_suite_trains_each_encoding_on_answers_only_and_scores_each_length(tmp_path, capsys):
    """A micro run of eval.tasks (copy, 2 encodings, 2 seeds): one run per encoding and seed, results per length
    with intervals over the seeds, and the training loss counts answer tokens only."""
    import json

    from eval.task_generators import TASKS as tasks
    from eval.tasks import TaskBatches, main

    inputs, targets = TaskBatches(tasks["copy"], 16, 4, 0, 1).train_batch(3)
    assert ((targets != -100) == tasks["copy"].batch([0, 3, 0], 4, 16).answers).all()
    out = tmp_path / "tasks"
    assert main(["--task", "copy", "--encodings", "rope,none", "--length", "16", "--seeds", "1,2",
                 "--multiples", "1,2", "--count", "32", "--out", str(out), "--train.max_steps=20",
                 "--train.eval_interval=10", "--model.dim=32", "--model.n_layers=1"]) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    assert set(results) == {"rope", "none"} and set(results["rope"]) == {"1x", "2x"}
    assert results["rope"]["1x"]["exact_match"]["n"] == 2
    assert (out / "copy.png").exists() and (out / "runs" / "copy" / "none" / "seed2" / "model.safetensors").exists()
    assert main(["--task", "sort", "--out", str(out)]) == 2
    assert main(["--task", "copy", "--out", str(out), "--model.dimm=3"]) == 2
