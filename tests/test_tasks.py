"""The task suite: the generators (data/tasks.py: deterministic, answers masked exactly, an oracle scores 100%, a
context-blind predictor scores at chance), one task model's training (train/tasks.py: answers-only loss, the stop
target, reuse and resume), the study's cells and measure, the report's rules against hand-made records
(experiments/tasks.py), and the study end to end through the engine."""
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



# ------------------------------------------------------------------------------------------ one task model's training

MICRO_MODEL = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1}
MICRO_TRAIN = {"batch_size": 4, "max_steps": 20, "eval_interval": 10, "eval_batches": 1, "warmup_steps": 2,
               "log_interval": 10, "dtype": "float32"}


def micro_run(folder, seed=1):
    from train.config import build_run_config

    return build_run_config({"model": {**MICRO_MODEL, "position": "rope", "vocab_size": TASKS["copy"].vocab_size,
                                       "max_seq_len": 16}, "train": {**MICRO_TRAIN, "seed": seed},
                             "out": {"dir": str(folder), "overwrite": True}})


def test_task_batches_count_the_answers_only():
    from train.tasks import TaskBatches

    inputs, targets = TaskBatches(TASKS["copy"], 16, 4, 0, 1).train_batch(3)
    answers = TASKS["copy"].batch([0, 3, 0], 4, 16, train=True).answers
    assert ((targets != -100) == answers).all() and answers.any() and (~answers).any()


def test_a_training_stops_at_its_target_and_a_rerun_reuses_it_or_trains_afresh(tmp_path, monkeypatch):
    """The stop check runs at each evaluation step: a reason to stop ends the training there (steps and "reached"
    recorded); the same training asked again is reused, not retrained; another stop target trains afresh."""
    import train.tasks as tasks_training

    config = micro_run(tmp_path / "run")
    steps, reached = tasks_training.train_task(config, TASKS["copy"], 16, 0.5, lambda model, step: "met")
    assert (steps, reached) == (10, True)
    assert '"stopped": "met"' in (tmp_path / "run" / "metrics.jsonl").read_text()
    calls = []
    monkeypatch.setattr(tasks_training, "run_training", lambda training: calls.append(training) or 1 / 0)
    assert tasks_training.train_task(config, TASKS["copy"], 16, 0.5, None) == (10, True) and calls == []
    with pytest.raises(ZeroDivisionError):
        tasks_training.train_task(config, TASKS["copy"], 16, 0.25, None)
    assert calls[-1].resume is False


def test_an_interrupted_training_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    """Never reaching its target, a training runs to max_steps ("reached" False); one interrupted after its
    checkpoint at step 10 resumes from it to the same weights."""
    from model.checkpoint import load_model, load_trainer_state
    from train.loop import TrainingInterrupted
    from train.tasks import train_task

    assert train_task(micro_run(tmp_path / "whole"), TASKS["copy"], 16, 1.0, lambda model, step: None) == (20, False)

    def interrupt(model, step):
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        train_task(micro_run(tmp_path / "parts"), TASKS["copy"], 16, 1.0, interrupt)
    assert load_trainer_state(tmp_path / "parts")["step"] == 10
    assert train_task(micro_run(tmp_path / "parts"), TASKS["copy"], 16, 1.0, lambda model, step: None) == (20, False)
    for (name, a), b in zip(load_model(tmp_path / "whole").state_dict().items(),
                            load_model(tmp_path / "parts").state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_cap_shorter_than_one_learning_rate_cycle_decays_over_the_whole_run():
    from experiments.tasks import DEFAULT_TRAIN, task_train

    assert task_train({})["lr_cycle"] == DEFAULT_TRAIN["lr_cycle"] == 3000 == task_train({})["eval_interval"]
    assert task_train({"max_steps": 1000})["lr_cycle"] == 0  # one decay to step 1,000: the model ends annealed
    assert task_train({"max_steps": 1000, "lr_cycle": 500})["lr_cycle"] == 500  # set by the user: kept
    assert task_train({"lr_cycle": 500})["eval_interval"] == 500  # the stop check at each cycle's end


# ------------------------------------------------------------------------------------------- cells and measure

def test_settings_and_cells_refuse_what_cannot_run():
    from experiments.tasks import Settings, cells

    for bad in ({"tasks": ["sort"]}, {"encodings": ["rope-randomized"]}, {"until": 1.5}, {"seeds": [1, 1]},
                {"multiples": [0]}, {"encodings": ["x"], "variants": {"x": {"dim": 8}}}, {"methods": ["nope"]}):
        with pytest.raises(ConfigError):
            Settings(**bad)
    with pytest.raises(ConfigError, match="at most 515 tokens"):  # 8x of 128 is past copy's longest sequence
        cells(Settings(tasks=["copy"], length=128), None)
    with pytest.raises(ConfigError):
        cells(Settings(model={"dimm": 3}), None)
    with pytest.raises(ConfigError):  # NoPE reads no positions
        cells(Settings(encodings=["x"], variants={"x": {"position": "none", "random_positions": 256}}), None)


def test_cells_carry_each_variants_settings_and_the_methods_that_apply():
    """A variant's model settings reach its run config; a learned table is clamped past its end; a retrieval task's
    cell names the methods that apply to its encoding (never the window control, which every grid scores anyway)."""
    from experiments.tasks import Settings, cells

    settings = Settings(tasks=["copy", "mqar"], encodings=["rope-randomized", "alibi", "learned"], seeds=[1],
                        variants={"rope-randomized": {"position": "rope", "random_positions": 256}},
                        methods=["yarn", "window", "yarn+window"], model={"dim": 32})
    found = {cell["name"]: cell for cell in cells(settings, None)}
    assert list(found) == ["copy/rope-randomized-seed1", "copy/alibi-seed1", "copy/learned-seed1",
                           "mqar/rope-randomized-seed1", "mqar/alibi-seed1", "mqar/learned-seed1"]
    model = found["copy/rope-randomized-seed1"]["run"]["model"]
    assert (model["position"], model["random_positions"], model["dim"], model["n_layers"]) == ("rope", 256, 32, 4)
    assert found["copy/learned-seed1"]["run"]["model"]["position_args"] == {"learned": {"clamp": True}}
    assert "methods" not in found["copy/alibi-seed1"]
    assert found["mqar/rope-randomized-seed1"]["methods"] == ["yarn"] and found["mqar/alibi-seed1"]["methods"] == []
    assert found["mqar/alibi-seed1"]["grid_count"] == 128


def test_the_command_line_takes_variants_and_the_model_and_train_tables():
    from experiments import engine
    from experiments.tasks import STUDY

    argv = ["--encodings", "rope,rope-randomized", "--seeds", "1,2", "--until", "0",
            "--tasks.variants={rope-randomized = {position = \"rope\", random_positions = 2048}}",
            "--model.dim=32", "--train.max_steps=100"]
    args, overrides = engine.build_parser(STUDY).parse_known_args(argv)
    settings = engine.resolve_settings(STUDY, args, overrides)
    assert settings.variants == {"rope-randomized": {"position": "rope", "random_positions": 2048}}
    assert (settings.encodings, settings.seeds, settings.until) == (["rope", "rope-randomized"], [1, 2], 0.0)
    assert settings.model == {"dim": 32} and settings.train == {"max_steps": 100}


def test_the_comparisons_task_cells_take_its_variants_seeds_and_budget():
    from experiments.compare import Settings as CompareSettings
    from experiments.tasks import DEFAULT_MODEL, comparison_cells

    settings = CompareSettings(encodings=["rope", "irope"], seeds=[1, 2], tasks=["mqar"], task_steps=300,
                               variants={"irope": {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"]}},
                               task_cycle=100, task_count=16, task_until=0.0, methods=["yarn", "window", "yarn+window"])
    found = comparison_cells(settings)
    assert [cell["name"] for cell in found] == ["task/mqar/rope-seed1", "task/mqar/rope-seed2", "task/mqar/irope-seed1",
                                                 "task/mqar/irope-seed2"]
    first = found[0]
    assert first["kind"] == "task" and first["until"] is None and first["count"] == 16 and first["length"] == 32
    assert {k: first["run"]["train"][k] for k in ("max_steps", "lr_cycle", "eval_interval", "seed")} == {
        "max_steps": 300, "lr_cycle": 100, "eval_interval": 100, "seed": 1}
    assert {k: first["run"]["model"][k] for k in DEFAULT_MODEL} == DEFAULT_MODEL
    assert found[2]["run"]["model"]["position_layers"] == ["rope", "rope", "rope", "none"]
    assert first["methods"] == ["yarn"]


def test_measure_trains_a_micro_model_and_scores_every_length_and_its_grid(tmp_path):
    from experiments.engine import Context
    from experiments.tasks import Settings, cells, measure

    settings = Settings(tasks=["mqar"], encodings=["rope"], seeds=[1], length=16, multiples=[1, 2], count=8,
                        methods=["yarn"], until=1.0, model=MICRO_MODEL, train=MICRO_TRAIN)
    cell = cells(settings, None)[0]
    record = measure(cell, Context(tmp_path))
    assert (record["steps"], record["reached"]) == (20, False)  # 20 steps of a 1-layer model: not learned
    assert set(record["rows"]) == {"1x", "2x"} and all(0 <= v <= 1 for row in record["rows"].values()
                                                         for v in row.values())
    assert set(record["grids"]) == {"none", "yarn"} and set(record["grids"]["none"]["2x"]) == {"L/2", "2L"}
    assert (tmp_path / "work" / "tasks" / "mqar" / "rope" / "seed1" / "model.safetensors").exists()
    assert measure(cell, Context(tmp_path)) == record  # reused, not retrained: the same scores


# ---------------------------------------------------------------------------------------------- the report

def task_record(task, encoding, seed, exact, steps=500, reached=True, grid=None, until=0.95):
    """A hand-made (cell, record): exact match per length ("1x", "2x"), and a retrieval grid {method: (full, window)}
    at the map's cell 8x / 4L."""
    cell = {"name": f"{task}/{encoding}-seed{seed}", "kind": "task", "task": task, "encoding": encoding, "seed": seed,
            "length": 32, "multiples": [1, 2], "count": 256, "until": until,
            "run": {"model": {}, "train": {"batch_size": 32, "max_steps": 3000}}}
    record = {"steps": steps, "reached": reached,
              "rows": {key: {"exact_match": value, "token_accuracy": value} for key, value in zip(("1x", "2x"), exact)}}
    if grid is not None:
        cell["grid_count"] = 128
        record["grids"] = {method: {"8x": {"4L": {"distance": 128, "full": {"exact_match": full, "token_accuracy": 0},
                                                  "window": {"exact_match": window, "token_accuracy": 0}}}}
                           for method, (full, window) in grid.items()}
    return cell, record


def test_the_tables_show_rates_over_seeds_the_seeds_that_learned_and_each_seeds_steps():
    from eval.stats import rate_over_seeds
    from experiments.tasks import grouped, tasks_markdown

    pairs = [task_record("copy", "rope", 2, (1.0, 0.0), steps=6000), task_record("copy", "rope", 1, (0.5, 0.25),
                                                                                  steps=12000, reached=False)]
    text = tasks_markdown(grouped(pairs), 32, [1, 2])
    assert "| copy | 1x | 2x | steps (each seed) |" in text
    one_x = rate_over_seeds([0.5, 1.0], 256, 0.95)  # seed order: seed 1's value first
    assert f"| rope | {one_x.estimate.format(2)} 1/2 | " in text and "| 12,000* / 6,000 |" in text
    assert "* ran to train.max_steps" in text and "pooled Wilson interval" in text and "reaches 0.95" in text
    assert "answer distance past L" not in text


def test_the_map_reads_the_grids_at_8x_and_4L_with_the_difference_paired_by_seed():
    from eval.stats import paired_rate_difference, rate_over_seeds
    from experiments.tasks import MAP_CELL, retrieval_grids

    pairs = [task_record("mqar", "rope", seed, (1.0, 1.0), grid={"none": (full, 0.0), "yarn": (1.0, 0.0)})
             for seed, full in ((1, 0.5), (2, 0.75), (3, 0.25))]
    found = retrieval_grids(pairs)
    assert set(found) == {"mqar"} and set(found["mqar"]) == {"rope", "rope+yarn"}
    use, control, difference = found["mqar"]["rope"]
    assert use == rate_over_seeds([0.5, 0.75, 0.25], 128, 0.95).estimate and control.mean == 0.0
    assert difference == paired_rate_difference([0.5, 0.75, 0.25], use, control)
    assert "4L" in MAP_CELL and "8x" in MAP_CELL
    assert retrieval_grids([task_record("copy", "rope", 1, (1.0, 1.0))]) == {}


def test_the_comparisons_section_has_a_table_a_figure_and_the_grid_per_task(tmp_path):
    from types import SimpleNamespace

    from experiments.tasks import comparison_section

    pairs = [task_record("mqar", encoding, seed, (1.0, 0.5), grid={"none": (0.5, 0.0)})
             for encoding in ("alibi", "rope") for seed in (1, 2)]
    lines = comparison_section(pairs, SimpleNamespace(tasks=["flipflop", "mqar"]), tmp_path)
    assert lines[0] == "### Task: mqar" and "at most 3,000 steps" in lines[2]
    assert "| encoding | 1x | 2x | steps |" in lines and "![mqar](tasks/mqar/mqar.png)" in lines
    assert (tmp_path / "tasks" / "mqar" / "mqar.png").exists()
    assert "| encoding | 8x, d = 128 (4L) |" in lines and sum(line.startswith("| alibi |") for line in lines) == 3


@pytest.mark.integration  # trains 4 micro task models through the engine, ~30 s
def test_the_study_runs_through_the_engine_and_renders_its_report(tmp_path):
    import json

    from experiments.engine import main

    out = tmp_path / "tasks"
    argv = ["--tasks", "copy,flipflop", "--encodings", "rope,none", "--length", "16", "--seeds", "1,2",
            "--multiples", "1,2", "--count", "16", "--out", str(out), "--workers", "1", "--threads", "1",
            "--train.max_steps=20", "--train.eval_interval=10", "--model.dim=32", "--model.n_layers=1"]
    assert main("experiments.tasks", argv) == 0
    assert len(list((out / "records").glob("*.json"))) == 8
    table = (out / "tasks.md").read_text()
    assert "| copy | 1x | 2x | steps (each seed) |" in table and "| flipflop | 1x | 2x | steps (each seed) |" in table
    assert all((out / name).exists() for name in ("tasks.png", "copy/copy.png", "flipflop/flipflop.png"))
    assert "Reproduce: `python -m experiments.tasks" in (out / "report.md").read_text()
    stamp = (out / "work" / "tasks" / "copy" / "none" / "seed2" / "model.safetensors").stat().st_mtime_ns
    assert main("experiments.tasks", argv) == 0  # every cell has its record: nothing trains again
    assert (out / "work" / "tasks" / "copy" / "none" / "seed2" / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["measured"] == 0
    (out / "tasks.md").unlink()
    assert main("experiments.tasks", ["--report-only", "--out", str(out)]) == 0 and (out / "tasks.md").read_text() == table
    assert main("experiments.tasks", ["--tasks", "sort", "--out", str(tmp_path / "bad")]) == 2
