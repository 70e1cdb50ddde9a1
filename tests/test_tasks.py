"""Task generators (experiments/tasks.py): deterministic, answers masked exactly, an oracle scores 100%, a context-blind
predictor scores at chance."""
import numpy as np
import pytest
import torch

from data.tasks import BOS, READ, SEP, TASKS, WRITE, ZERO, get_task
from errors import ConfigError
from eval.task_score import score

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
        assert len(set(tokens[row, 1:10].tolist())) == 9  # distinct symbols: the copy is a lookup
        answers = torch.nonzero(batch.answers[row]).flatten() + 1  # target t is token t + 1
        assert answers.tolist() == list(range(11, 20))


def test_copy_trains_on_strings_of_every_length_and_tests_on_the_longest():
    """Training strings have random lengths up to half the sequence (no fixed offset solves the task); the test
    string is the longest the sequence holds; either way the answers are exactly the second copy."""
    train = TASKS["copy"].batch(0, 200, 64, train=True)
    tokens = torch.cat([train.inputs[:, :1], train.targets], dim=1)
    sizes = []
    for row in range(200):
        size = int(torch.nonzero(tokens[row] == SEP)[0]) - 1
        sizes.append(size)
        assert torch.equal(tokens[row, 1 : 1 + size], tokens[row, 2 + size : 2 + 2 * size])
        assert (torch.nonzero(train.answers[row]).flatten() + 1).tolist() == list(range(2 + size, 2 + 2 * size))
        assert (tokens[row, 2 + 2 * size :] == SEP).all()
    assert min(sizes) < 8 and max(sizes) > 28 and all(1 <= size <= 31 for size in sizes)
    assert int(TASKS["copy"].batch(0, 8, 64).answers.sum(dim=1).min()) == 31


def test_a_copy_longer_than_its_symbols_is_refused():
    with pytest.raises(ConfigError, match="at most 515 tokens"):
        TASKS["copy"].batch(0, 1, 1024)


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
    # Context-blind: it reads the current token only, and guesses one of the answers seen after that token (a
    # retrieval query narrows the answer to its key's needles; elsewhere the token says nothing).
    rng = np.random.default_rng(0)
    seen: dict[int, set[int]] = {}
    for token, answer in zip(batch.inputs[batch.answers].tolist(), batch.targets[batch.answers].tolist()):
        seen.setdefault(token, set()).add(answer)
    guesses = batch.targets.clone()
    for row, column in torch.nonzero(batch.answers).tolist():
        guesses[row, column] = int(rng.choice(sorted(seen[int(batch.inputs[row, column])])))
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
    """A micro run of experiments.tasks (copy and flipflop, 2 encodings, 2 seeds, 2 worker processes): one run per task,
    encoding and seed, results per length with intervals over the seeds, and the training loss counts answer
    tokens only."""
    import json

    from data.tasks import TASKS as tasks
    from experiments.tasks import TaskBatches, main

    inputs, targets = TaskBatches(tasks["copy"], 16, 4, 0, 1).train_batch(3)
    assert ((targets != -100) == tasks["copy"].batch([0, 3, 0], 4, 16, train=True).answers).all()
    out = tmp_path / "tasks"
    assert main(["--tasks", "copy,flipflop", "--encodings", "rope,none", "--length", "16", "--seeds", "1,2",
                 "--multiples", "1,2", "--count", "32", "--workers", "2", "--out", str(out), "--train.max_steps=20",
                 "--train.eval_interval=10", "--model.dim=32", "--model.n_layers=1"]) == 0
    for task in ("copy", "flipflop"):
        results = json.loads((out / task / "results.json").read_text())["results"]
        assert set(results) == {"rope", "none"} and set(results["rope"]) == {"1x", "2x"}
        exact = results["rope"]["1x"]["exact_match"]
        assert exact["n"] == 2 and len(exact["values"]) == 2  # the seeds' own values are kept
        assert abs(exact["mean"] - sum(exact["values"]) / 2) < 1e-12
        assert (out / task / f"{task}.png").exists()
        assert (out / "runs" / task / "none" / "seed2" / "model.safetensors").exists()
        assert (out / "runs" / "logs" / f"{task}-none-seed2.log").exists()
    table = (out / "tasks.md").read_text()
    assert "| copy | 1x | 2x |" in table and "| flipflop | 1x | 2x |" in table and (out / "tasks.png").exists()
    assert main(["--tasks", "sort", "--out", str(out)]) == 2
    assert main(["--tasks", "copy", "--out", str(out), "--model.dimm=3"]) == 2
    assert main(["--tasks", "copy", "--out", str(out), "--length", "128"]) == 2  # 8x is past copy's 515 tokens


def test_a_failed_training_is_reported_and_the_others_go_on(tmp_path):
    from experiments.tasks import TaskJob, run_jobs

    shared = {"model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1},
              "train": {"batch_size": 4, "max_steps": 3, "eval_interval": 3, "eval_batches": 1, "dtype": "float32"}}
    jobs = [TaskJob(task, "rope", {"position": "rope"}, 1, 16, (1,), 8, shared, str(tmp_path)) for task in ("nope", "copy")]
    failed, done = sorted(run_jobs(jobs, 1, tmp_path / "logs"), key=lambda r: r["task"] != "nope")
    assert failed["status"].startswith("failed: ConfigError: unknown task 'nope'")
    assert done["status"] == "ok" and set(done["rows"]) == {"1x"}


@pytest.mark.integration  # trains a task model to its target, ~18 s
def test_a_task_training_stops_once_validation_exact_match_reaches_the_target(tmp_path):
    """--until: the stop check runs at each evaluation step; a target met stops there (steps recorded), one never
    met trains to max_steps and is marked in the table."""
    from experiments.tasks import main, run_suite, table

    shared = {"model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1},
              "train": {"batch_size": 4, "max_steps": 20, "eval_interval": 10, "eval_batches": 1, "dtype": "float32"}}
    training = run_suite(["copy"], {"rope": {"position": "rope"}}, [1, 2], 16, [1], 8, shared,
                         tmp_path / "met", until=0.0).training
    assert training["copy"]["rope"] == {"seeds": [1, 2], "steps": [10, 10], "reached": [True, True]}
    assert '"stopped": "validation exact match' in (tmp_path / "met" / "copy" / "rope" / "seed1" / "metrics.jsonl").read_text()
    suite = run_suite(["copy"], {"rope": {"position": "rope"}}, [1], 16, [1], 8, shared,
                      tmp_path / "unmet", until=1.0)  # 20 steps of a 1-layer model: exact match < 1
    results, training = suite.results, suite.training
    assert training["copy"]["rope"] == {"seeds": [1], "steps": [20], "reached": [False]}
    shown = table(results, 16, [1], training)
    assert "| copy | 1x | steps (each seed) |" in shown and "| 20* |" in shown and "* ran to train.max_steps" in shown
    assert main(["--tasks", "copy", "--until", "1.5", "--out", str(tmp_path / "bad")]) == 2


def test_a_cap_shorter_than_one_learning_rate_cycle_decays_over_the_whole_run():
    from experiments.tasks import DEFAULT_TRAIN, task_train

    assert task_train({})["lr_cycle"] == DEFAULT_TRAIN["lr_cycle"] == 3000
    assert task_train({"max_steps": 1000})["lr_cycle"] == 0  # one decay to step 1,000: the model ends annealed
    assert task_train({"max_steps": 1000, "lr_cycle": 500})["lr_cycle"] == 500  # set by the user: kept


def test_a_rerun_scores_finished_trainings_again_and_resumes_an_interrupted_one(tmp_path, monkeypatch):
    """The suite resumes: a job whose folder holds a finished training with the same settings and stop target is
    scored again without training (equal scores); an interrupted one continues from its checkpoint to the same
    weights as an uninterrupted training; another stop target trains afresh."""
    import dataclasses

    import experiments.tasks as tasks
    from model.checkpoint import load_model, load_trainer_state

    shared = {"model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1},
              "train": {"batch_size": 4, "max_steps": 20, "eval_interval": 10, "eval_batches": 1, "dtype": "float32"}}
    job = tasks.TaskJob("copy", "rope", {"position": "rope"}, 1, 16, (1,), 8, shared, str(tmp_path / "a"),
                        until=1.0)  # not reached by 20 steps of a 1-layer model: trains to max_steps
    first = tasks.run_task_job(job)
    assert first["status"] == "ok" and first["steps"] == 20 and first["reached"] is False
    whole = tmp_path / "a" / "copy" / "rope" / "seed1"
    stamp = (whole / "model.safetensors").stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(tasks, "run_training", lambda training: calls.append(training) or 1 / 0)
    again = tasks.run_task_job(job)
    assert calls == [] and again["rows"] == first["rows"] and (again["steps"], again["reached"]) == (20, False)
    assert (whole / "model.safetensors").stat().st_mtime_ns == stamp
    assert tasks.run_task_job(dataclasses.replace(job, until=0.5))["status"].startswith("failed: ZeroDivision")
    assert calls[-1].resume is False  # another stop target: trained afresh
    monkeypatch.undo()

    def interrupt_at_10(*args):
        def check(model, step):
            raise KeyboardInterrupt
        return check

    interrupted = dataclasses.replace(job, runs=str(tmp_path / "b"))
    with monkeypatch.context() as patch:
        patch.setattr(tasks, "stop_at", interrupt_at_10)
        assert "TrainingInterrupted" in tasks.run_task_job(interrupted)["status"]
    parts = tmp_path / "b" / "copy" / "rope" / "seed1"
    assert load_trainer_state(parts)["step"] == 10
    resumed = tasks.run_task_job(interrupted)
    assert resumed["status"] == "ok" and resumed["steps"] == 20 and load_trainer_state(parts)["step"] == 20
    for (name, a), b in zip(load_model(whole).state_dict().items(), load_model(parts).state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_named_variants_train_with_their_settings(tmp_path):
    """--variants: a named set of model settings that --encodings lists beside plain encodings (randomized positions
    here); a malformed table or a variant without a position is refused before anything trains."""
    import json

    from experiments.tasks import main

    out = tmp_path / "tasks"
    variants = '{rope-randomized = {position = "rope", random_positions = 256}}'
    assert main(["--tasks", "copy", "--encodings", "rope,rope-randomized", "--variants", variants, "--length", "16",
                 "--seeds", "1", "--multiples", "1,2", "--count", "8", "--workers", "1", "--out", str(out),
                 "--train.max_steps=4", "--train.eval_interval=2", "--model.dim=32", "--model.n_layers=1"]) == 0
    saved = json.loads((out / "runs" / "copy" / "rope-randomized" / "seed1" / "config.json").read_text())
    assert saved["random_positions"] == 256 and saved["position"] == "rope"
    assert set(json.loads((out / "copy" / "results.json").read_text())["results"]) == {"rope", "rope-randomized"}
    assert main(["--encodings", "rope-randomized", "--out", str(out)]) == 2  # not defined
    assert main(["--encodings", "x", "--variants", "{x = {dim = 8}}", "--out", str(out)]) == 2  # no position
    assert main(["--encodings", "x", "--variants", "{x = ", "--out", str(out)]) == 2  # not TOML
    assert main(["--encodings", "x", "--variants", '{x = {position = "none", random_positions = 256}}',
                 "--out", str(out)]) == 2  # NoPE reads no positions
