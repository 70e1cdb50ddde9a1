"""experiments.compare at micro scale: seeds, intervals, cached re-runs, workers, failure isolation, findings."""
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from eval.extrapolation import CheckpointEvaluation
from eval.stats import Estimate
from experiments.compare import running
from experiments.compare.cli import main
from experiments.compare.findings import findings, order_statement, verdict
from experiments.compare.results import Variant
from tests.conftest import ROOT

MICRO = ["--model.dim=32", "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1",
         "--model.max_seq_len=16", "--train.max_steps=6", "--train.batch_size=4", "--train.eval_interval=3",
         "--train.eval_batches=1", "--train.log_interval=2", "--compare.vocab_size=300",
         "--compare.eval_tokens=512", '--compare.methods=["yarn", "dynamic", "clamp"]',
         '--compare.lengths=["1x", "2x", "4x"]', "--compare.seeds=[1]",
         "--compare.probes=[]"]  # the quick preset's use probe runs in the probes test below
ENCODINGS = ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"]
EVERY = '--compare.encodings=["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"]'  # quick's + learned


def arguments(source, out, *extra):
    return ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick", "--out", str(out),
            f"--compare.source={source}", "--compare.val_fraction=0.3", *MICRO, *extra]


def test_compare_end_to_end_with_seeds_snapshots_and_a_cached_rerun(small_text_file, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, "--compare.seeds=[1, 2]", "--compare.snapshots=[0.5]",
                     "--compare.workers=1", EVERY)
    assert main(args) == 0
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["status"]) == sorted(f"{e}-seed{s}" for e in ENCODINGS for s in (1, 2))
    assert {r["status"] for r in results["status"].values()} == {"trained"}
    labels = {cell["label"] for cell in results["cells"]}
    assert labels == set(ENCODINGS) | {"rope+yarn", "rope+dynamic", "learned+clamp"}
    for cell in results["cells"]:
        if cell["label"] == "learned" and cell["multiple"] > 1:
            assert cell["ppl"] is None and "beyond the learned table" in cell["error"]
            continue
        assert len(cell["ppl_per_seed"]) == 2
        assert cell["ppl"]["low"] <= cell["ppl"]["mean"] <= cell["ppl"]["high"]
        if cell["multiple"] > 1:
            assert cell["penalty"]["low"] <= cell["penalty"]["mean"] <= cell["penalty"]["high"]
    assert {(row["label"], row["fraction"]) for row in results["snapshots"]} == \
        {(e if e != "learned" else "learned+clamp", f) for e in ENCODINGS for f in (0.5, 1.0)}
    probe = {(row["label"], row["offset"]) for row in results["probe"] if row["ppl"]}
    assert ("sinusoidal", 240) in probe and ("learned", 16) not in probe and ("learned+clamp", 240) in probe
    for section in ("## Setup", "### Perplexity", "### Extrapolation penalty", "### Position-shift probe",
                    "### Extrapolation against training tokens", "## What this shows", "within noise",
                    "Student's t interval over seeds", "Reproduce: `python -m experiments.compare"):
        assert section in report, section
    for name in ("plot.png", "penalty.png", "position_loss.png", "train_curves.png", "snapshots.png", "table.md"):
        assert (out / name).stat().st_size > 0
    assert (out / "runs" / "t5" / "seed2" / "snapshots" / "step-000003" / "model.safetensors").exists()
    final = CheckpointEvaluation.load(out / "evals" / "t5" / "seed2.npz")
    snapshot = CheckpointEvaluation.load(out / "evals" / "t5" / "seed2-step3.npz")
    assert snapshot.plan["starts_sha"] == final.plan["starts_sha"]  # the same tokens
    assert sorted(snapshot.losses) == ["none@16", "none@64"] and set(final.losses) > set(snapshot.losses)
    # Re-running trains nothing and reuses every evaluation; the numbers are the same.
    capsys.readouterr()
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert {r["status"] for r in again["status"].values()} == {"skipped (already trained)"}
    assert {r["eval"] for r in again["status"].values()} == {"cached"}
    assert again["cells"] == results["cells"]
    invocations = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert [r["jobs"] for r in invocations] == [{"trained": 2 * len(ENCODINGS)}, {"skipped": 2 * len(ENCODINGS)}]
    assert "all 2 invocations on record" in (out / "report.md").read_text()
    assert re.search(r"in the 1 that trained and 0\.\d min in the 1 that trained nothing", (out / "report.md").read_text())


def test_results_do_not_depend_on_the_number_of_workers(small_text_file, tmp_path):
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        args = arguments(small_text_file, out, '--compare.encodings=["alibi", "rope"]', "--compare.seeds=[3]",
                         f"--compare.workers={workers}", "--compare.threads=1")
        assert main(args) == 0
        runs[workers] = out
    for encoding in ("alibi", "rope"):
        weights = [(runs[w] / "runs" / encoding / "seed3" / "model.safetensors").read_bytes() for w in (1, 2)]
        assert weights[0] == weights[1]
    cells = [json.loads((runs[w] / "results.json").read_text())["cells"] for w in (1, 2)]
    assert cells[0] == cells[1]
    assert (runs[2] / "logs" / "rope-seed3.log").read_text().count("final val_loss") == 1


@pytest.mark.integration  # a comparison with two workers, ~14 s
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to free one")
def test_the_last_job_scores_on_the_cores_of_idle_workers(small_text_file, tmp_path, capsys):
    """With threads automatic, once one job is left for two workers it takes both cores for its scoring; with
    compare.threads set, every job keeps its threads."""
    out = tmp_path / "adapt"
    extra = ['--compare.encodings=["alibi", "rope", "none"]', "--compare.seeds=[1]", "--compare.workers=2"]
    assert main(arguments(small_text_file, out, *extra)) == 0
    assert "1 job(s) left for 2 workers: each scores with 2 threads from now on" in capsys.readouterr().out
    assert main(arguments(small_text_file, tmp_path / "fixed", *extra, "--compare.threads=1")) == 0
    assert "job(s) left" not in capsys.readouterr().out


def test_the_jobs_that_evaluate_the_most_models_start_first():
    """rope (the model and four scalings) before learned (and clamp), then the rest in the configured order; a
    hybrid whose layers refuse an attention method does not count it."""
    from types import SimpleNamespace

    from model.config import ModelConfig

    methods = ["linear", "ntk", "dynamic", "yarn", "clamp", "selfextend"]
    settings = {"none": {"position": "none"}, "alibi": {"position": "alibi"}, "learned": {"position": "learned"},
                "rope": {"position": "rope"},
                "irope": {"position": "rope", "position_layers": ["rope", "none"]}}
    configs = {(name, 1): SimpleNamespace(model=ModelConfig(n_layers=2, **values)) for name, values in settings.items()}
    jobs = [running.Job(name, 1, {"model": values}, {"methods": methods}, 1) for name, values in settings.items()]
    assert [job.encoding for job in running.largest_first(jobs, configs)] == \
        ["rope", "irope", "learned", "none", "alibi"]


def test_a_failed_variant_is_reported_and_the_others_go_on(small_text_file, tmp_path, monkeypatch, capsys):
    real = running.train_variant

    def failing(config):
        if config.model.position == "t5":
            raise RuntimeError("simulated failure")
        return real(config)

    monkeypatch.setattr(running, "train_variant", failing)
    out = tmp_path / "cmp"
    assert main(arguments(small_text_file, out, '--compare.encodings=["t5", "rope"]', "--compare.workers=1")) == 1
    results = json.loads((out / "results.json").read_text())
    assert results["status"]["t5-seed1"]["status"] == "failed: RuntimeError: simulated failure"
    assert {cell["label"] for cell in results["cells"]} == {"rope", "rope+yarn", "rope+dynamic"}
    assert "failed: RuntimeError" in (out / "report.md").read_text()


def test_the_newer_encodings_and_named_variants_run_through_compare(small_text_file, tmp_path):
    """compare.variants from configs/compare.toml (a hybrid and p-RoPE) next to kerple: trained with their own
    settings, evaluated, with the RoPE methods applied to the RoPE-based variants only; a run saved before newer
    model settings existed is still recognised as the same run (skipped, not refused)."""
    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, '--compare.encodings=["kerple", "p-rope", "irope"]', "--compare.workers=1",
                     "--model.n_layers=4")
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert {cell["label"] for cell in results["cells"]} == {"kerple", "p-rope", "p-rope+yarn", "p-rope+dynamic",
                                                            "irope", "irope+yarn", "irope+dynamic"}
    state_path = out / "runs" / "irope" / "seed1" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    assert state["run_config"]["model"]["position_layers"] == ["rope", "rope", "rope", "none"]
    assert state["run_config"]["model"]["position_args"] == {"rope": {"fraction": 1.0, "p": 1.0}}
    report = (out / "report.md").read_text()
    assert 'irope: {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"]}' in report
    model = state["run_config"]["model"]  # as written by code from before model.position_args: flat keys
    del model["position_args"]
    model.update(rope_fraction=1.0, rope_p=1.0, cope_positions=0)
    state_path.write_text(json.dumps(state))
    assert main(args) == 0
    assert json.loads((out / "results.json").read_text())["status"]["irope-seed1"]["status"] == \
        "skipped (already trained)"


@pytest.mark.parametrize("override, message", [
    ('--compare.encodings=["rope", "alibl"]', "compare.encodings: unknown ['alibl']"),
    ('--compare.encodings=["rope", "rope"]', "lists a name twice"),
    ('--compare.variants={rope = {position = "alibi"}}', "compare.variants.rope"),
    ('--compare.variants={mine = {position_args = {rope = {p = 0.5}}}}', "compare.variants.mine"),
    (('--compare.variants={mine = {position = "rope", position_args = {rope = {p = 2.0}}}}',
      '--compare.encodings=["rope", "mine"]'), "p in [0, 1]"),
    (('--compare.encodings=["rope", "partial-rope"]', "--model.n_heads=16"), "rotates 0 of the 2 dimensions"),
    ('--compare.methods=["yarn", "rerope2"]', "unknown inference-time method"),
    ('--compare.methods=["yarn+linear"]', "at most one RoPE scaling"),
    ('--compare.encoding_settings={t5 = {t5_max_distance = 64}}', "compare.encoding_settings is now [model] "
                                                                   "position_args"),
    ((EVERY, "--model.position_args.t5.max_distanc=64"), "unknown setting(s) ['max_distanc']"),
    ("--compare.seeds=[1, 1]", "distinct integers"),
    ("--compare.snapshots=[1.5]", "fractions of training"),
    ('--compare.reuse=["no/such/comparison"]', "compare.reuse: ['no/such/comparison'] are not comparisons'"),
    ((EVERY, "--model.position_args.learned.max_positions=8"), "beyond the learned table of 8 positions"),
])
def test_bad_settings_are_refused_before_anything_trains(small_text_file, tmp_path, capsys, override, message):
    out = tmp_path / "cmp"
    assert main(arguments(small_text_file, out, *([override] if isinstance(override, str) else override))) == 2
    error = capsys.readouterr().err
    assert error.startswith("error:") and message in error and "Traceback" not in error
    assert not (out / "runs").exists()


def test_an_encodings_settings_reach_the_encoding_and_its_variants_only():
    from experiments.compare.config import load_compare_config

    compare, shared, _ = load_compare_config(ROOT / "configs" / "compare.toml", "quick", [
        '--compare.variants={t5-short = {position = "t5", position_args = {t5 = {num_buckets = 16}}}, '
        't5-own = {position = "t5", position_args = {t5 = {max_distance = 32}}}, '
        'hybrid = {position = "rope", position_layers = ["rope", "t5"]}}'])
    model = shared["model"]
    assert model["position_args"] == {"t5": {"max_distance": 64}}  # the quick preset's
    assert compare.model_settings("t5", model) == {"position": "t5", "position_args": {"t5": {"max_distance": 64}}}
    assert compare.model_settings("t5-short", model)["position_args"] == {"t5": {"max_distance": 64,
                                                                                 "num_buckets": 16}}
    assert compare.model_settings("t5-own", model)["position_args"]["t5"]["max_distance"] == 32  # the variant's wins
    assert compare.model_settings("hybrid", model)["position_args"] == {"t5": {"max_distance": 64}}
    assert compare.model_settings("rope", model) == {"position": "rope"}


def variant(name, values_by_length):
    result = Variant(name, "none", name)
    for length, values in values_by_length.items():
        result.nll[length] = {seed: math.log(value) for seed, value in enumerate(values)}
    return result


def test_orderings_are_stated_only_where_the_intervals_separate():
    variants = {"alibi": variant("alibi", {16: [10.0, 10.1, 9.9]}),
                "rope": variant("rope", {16: [10.05, 10.2, 9.95]}),
                "sinusoidal": variant("sinusoidal", {16: [20.0, 20.5, 19.5]})}
    statement = order_statement(variants, 16, 1.0)
    assert statement == "Perplexity at 1x, best to worst: alibi (10.0) ≈ rope (10.1) < sinusoidal (20.0)."


def test_verdicts_follow_the_interval_not_the_mean():
    assert verdict(Estimate(2.5, 2.2, 2.8, 3), 2.0, holds_above=True) == "reproduced"
    assert verdict(Estimate(1.5, 1.2, 1.8, 3), 2.0, holds_above=True) == "not reproduced"
    assert verdict(Estimate(2.1, 1.8, 2.4, 3), 2.0, holds_above=True).startswith("within noise")
    assert verdict(Estimate(1.05, 1.0, 1.08, 3), 1.10, holds_above=False) == "reproduced"
    assert verdict(Estimate(2.1, None, None, 1), 2.0, holds_above=True).startswith("undetermined")
    assert verdict(None, 2.0, True) == "not measured here"


def test_findings_name_the_penalty_side_and_the_paper_checks():
    rows = {}
    for name, ppl, penalty in (("alibi", [10, 10.2, 9.8], [0.0, 0.004, -0.004]), ("rope", [10, 13, 11], [0.5, 0.6, 0.4])):
        v = variant(name, {16: ppl, 64: [2 * p if name == "rope" else p for p in ppl]})
        v.penalty[64] = {seed: np.full(8, value) for seed, value in enumerate(penalty)}
        rows[name] = v
    text = "\n".join(findings(rows, [16, 64], 16, []))
    assert "Degrade beyond L (interval above 0): rope (+0.500)." in text
    assert "Flat (interval within +-0.01 nats, i.e. +-1% perplexity): alibi (+0.000)." in text
    assert "ALiBi stays flat (within 10%) out to 4x: reproduced" in text
    assert "rotary degrades (more than 10%) by 4x: reproduced" in text
    assert "T5 bias holds (within 25%) to 4x: not measured here" in text


def test_one_seed_states_no_penalty_side_however_many_windows_agree():
    """One trained model per encoding: its windows agree closely (a narrow interval over windows), but another
    training run of the same seed can move RoPE's 16x penalty by 0.3 nats (docs/results.md), so nothing is claimed."""
    rows = {}
    for name, penalty in (("alibi", 0.0), ("rope", 0.7)):
        v = variant(name, {16: [10.0], 64: [12.0]})
        v.penalty[64] = {0: np.random.default_rng(0).normal(penalty, 0.01, 64)}
        rows[name] = v
    assert rows["rope"].penalty_estimate(64).low is None
    text = "\n".join(findings(rows, [16, 64], 16, []))
    assert "Degrade beyond L (interval above 0): none." in text
    assert "Flat (interval within +-0.01 nats, i.e. +-1% perplexity): none." in text
    assert "Within noise of 0: none. One seed, so no interval: alibi (+0.0" in text
    assert "rope (+0.7" in text.split("One seed, so no interval:")[1]
    assert "rope +0.7" in text and "nats: one seed, no interval" in text


def test_method_findings_pair_seeds_against_plain_and_yarn():
    """Seeds differ a lot between themselves, but the method's change on each seed's model is consistent: paired by
    seed it is 'better' than plain; against yarn the per-seed ratios straddle 1: 'within noise'."""
    from experiments.compare.findings import method_findings

    def with_method(encoding, method, by_length):
        result = variant(encoding, by_length)
        result.method, result.label = method, f"{encoding}+{method}" if method != "none" else encoding
        return result

    plain = with_method("rope", "none", {64: [20.0, 40.0, 80.0], 256: [50.0, 90.0, 200.0]})
    yarn = with_method("rope", "yarn", {64: [15.0, 33.0, 60.0], 256: [30.0, 60.0, 100.0]})
    rerope = with_method("rope", "rerope", {64: [16.0, 31.0, 63.0], 256: [29.0, 63.0, 98.0]})
    variants = {v.label: v for v in (plain, yarn, rerope)}
    lines = method_findings(variants, [16, 64, 256], 16)
    text = "\n".join(lines)
    assert "rope+rerope: 4x vs plain: 0.787 [" in text  # exp of the mean log ratio (0.8, 0.775, 0.7875) and "better" in text.split("4x vs yarn")[0]
    assert "16x vs yarn" in text and "within noise" in text.split("16x vs yarn")[1]
    assert "rope+yarn:" not in text  # YaRN is the baseline, not a finding


def test_a_second_comparison_in_the_same_folder_is_refused(small_text_file, tmp_path, capsys):
    import os

    from model.folder_lock import FolderLock

    out = tmp_path / "cmp"
    with FolderLock(out, "comparison"):  # a flock conflicts across open files, also within one process
        assert main(arguments(small_text_file, out, '--compare.encodings=["rope"]')) == 2
    error = capsys.readouterr().err
    assert f"being written by another comparison (process {os.getpid()})" in error and "Traceback" not in error
    assert sorted(p.name for p in out.iterdir()) == [".writer.lock"]


def test_nothing_good_is_overwritten_by_a_failed_rerun(small_text_file, tmp_path, capsys):
    """A typo in compare.encodings, other model settings, and other data in the same folder: each is refused up
    front with exit 2 and one line, and the previous report, plots and runs stay byte-identical."""
    out = tmp_path / "cmp"
    assert main(arguments(small_text_file, out, '--compare.encodings=["rope", "alibi"]', "--compare.workers=1")) == 0
    before = {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()
              and "logs" not in path.parts and path.name != "invocations.jsonl" and path.name != ".writer.lock"}
    other_text = tmp_path / "other.txt"
    other_text.write_text(small_text_file.read_text()[::-1])
    for extra, message in [
        (['--compare.encodings=["rope", "alibl"]'], "compare.encodings: unknown ['alibl']"),
        (['--compare.encodings=["rope", "alibi"]', "--model.dim=48"], "holds a comparison with other settings"),
        ([f"--compare.source={other_text}"], "holds a comparison prepared from other data"),
    ]:
        capsys.readouterr()
        assert main(arguments(small_text_file, out, *extra)) == 2
        error = capsys.readouterr().err
        assert message in error and "Traceback" not in error
        assert len([line for line in error.splitlines() if line.startswith("error:")]) == 1
        after = {path: path.read_bytes() for path in before}
        assert after == before, message
    # Compiling is how a run executes, not what it trains: a re-run that compiles is accepted and retrains nothing.
    assert main(arguments(small_text_file, out, '--compare.encodings=["rope", "alibi"]', "--compare.workers=1",
                          "--train.compile=true")) == 0
    weights = [path for path in before if path.name == "model.safetensors"]
    assert len(weights) == 2 and all(path.read_bytes() == before[path] for path in weights)


def test_a_rerun_in_which_every_job_fails_keeps_the_previous_report(small_text_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, '--compare.encodings=["rope"]', "--compare.workers=1")
    assert main(args) == 0
    report = (out / "report.md").read_bytes()

    def failing(config):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(running, "train_variant", failing)
    assert main(args) == 1
    assert (out / "report.md").read_bytes() == report
    assert "the previous report" in capsys.readouterr().err


@pytest.mark.integration  # SIGKILLed comparisons in subprocesses
def test_a_comparison_killed_at_random_moments_ends_as_an_uninterrupted_one(small_text_file, tmp_path):
    """SIGKILL a small comparison (2 encodings x 2 seeds) at random moments (fractions of an uninterrupted run's
    time) three times, re-run it to the end: the numbers equal those of an uninterrupted run and the report has
    each row once."""
    import random
    import signal
    import subprocess
    import sys
    import time

    extra = ['--compare.encodings=["alibi", "rope"]', "--compare.seeds=[1, 2]", "--compare.workers=1",
             "--train.max_steps=12", "--train.eval_interval=2"]  # a checkpoint every 2 steps: kills land mid-run
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    started = time.perf_counter()
    uninterrupted = subprocess.run([sys.executable, "-m", "experiments.compare", *arguments(small_text_file, straight,
                                                                                    *extra)],
                                   cwd=ROOT, capture_output=True, text=True)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    duration = time.perf_counter() - started  # kills land at random fractions of it, on any machine's speed
    command = [sys.executable, "-m", "experiments.compare", *arguments(small_text_file, killed, *extra)]
    rng = random.Random(7)
    kills = 0
    for _ in range(3):
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 0.7) * duration)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    assert kills >= 2  # most attempts were cut short
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]
    results = [json.loads((folder / "results.json").read_text()) for folder in (straight, killed)]
    assert results[0]["cells"] == results[1]["cells"]
    report = (killed / "report.md").read_text()
    for label in ("alibi", "rope", "rope+yarn", "rope+dynamic"):
        rows = [line for line in report.splitlines() if line.startswith(f"| {label} |")]
        assert len(rows) == len([line for line in (straight / "report.md").read_text().splitlines()
                                 if line.startswith(f"| {label} |")]) >= 1, label


def test_a_negligible_paired_change_is_not_called_better_or_worse():
    from experiments.compare.findings import verdict_word

    assert verdict_word(Estimate(1.0001, 1.00005, 1.00015, 3)) == "the same within 1%"
    assert verdict_word(Estimate(0.95, 0.93, 0.97, 3)) == "better"
    assert verdict_word(Estimate(1.05, 1.02, 1.08, 3)) == "worse"
    assert verdict_word(Estimate(1.0, 0.97, 1.03, 3)) == "within noise"


@pytest.mark.integration  # a comparison with probes and tasks, ~14 s
def test_probes_and_tasks_add_their_sections_and_are_cached(small_text_file, tmp_path, capsys, monkeypatch):
    """compare.probes run on every trained model (a length a learned table cannot run is recorded, not fatal),
    compare.tasks trains the task suite per encoding, the report gets their sections, and a re-run reuses both."""
    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, '--compare.encodings=["learned", "rope"]', "--compare.workers=1",
                     '--compare.probes=["attention", "induction", "passkey", "use"]',
                     '--compare.probe_lengths=["1x", "16x"]', '--compare.use_distances=["2x", "max"]',
                     "--compare.use_windows=3",
                     "--compare.probe_tokens=256", "--compare.passkey_trials=2", '--compare.tasks=["flipflop"]',
                     "--compare.task_steps=3", "--compare.seeds=[1, 2]",
                     '--compare.methods=["clamp"]', '--compare.lengths=["1x", "2x"]')
    import matplotlib

    from eval import figures

    strokes: dict[str, set[str]] = {}  # each figure's line colours, by its path in OUT without the suffix
    save = figures.save

    def recording(figure, path, *rest, **options):
        strokes[Path(path).relative_to(out).with_suffix("").as_posix()] = {
            matplotlib.colors.to_hex(colour) for axis in figure.axes
            for colour in [line.get_color() for line in axis.get_lines()]
            + [edge for collection in axis.collections for edge in collection.get_edgecolor()]}
        return save(figure, path, *rest, **options)

    monkeypatch.setattr(figures, "save", recording)
    assert main(args) == 0
    attention = json.loads((out / "probes" / "rope" / "seed1-attention.json").read_text())["rows"]
    # 16x = 256 positions, binned to 64 (4 positions each) in the summary; the means within and beyond L are exact
    assert len(attention["16x"]["entropy"]["by_position"][0]) == 64 and attention["16x"]["far"]["beyond_L"]
    assert attention["16x"]["entropy"]["positions"][:2] == [1.5, 5.5]
    learned = json.loads((out / "probes" / "learned" / "seed2-attention.json").read_text())["rows"]
    assert "entropy" in learned["1x"] and "learned table" in learned["16x"]["error"]
    passkey = json.loads((out / "probes" / "rope" / "seed2-passkey.json").read_text())["rows"]
    assert "too short for the passkey template" in passkey["1x"]["error"]  # 16 tokens: recorded, not fatal
    assert [row["trials"] for row in passkey["16x"]] == [2, 2, 2] and all("low" in row for row in passkey["16x"])
    tasks = json.loads((out / "tasks" / "flipflop" / "results.json").read_text())
    assert set(tasks["results"]) == {"learned", "rope"} and tasks["results"]["rope"]["8x"]["exact_match"]["n"] == 2
    assert tasks["training"]["rope"] == {"seeds": [1, 2], "steps": [3, 3], "reached": [False, False]}  # the cap
    use = json.loads((out / "probes" / "rope" / "seed1-use.json").read_text())["rows"]["results"]
    # at the longest length (2x = 32 tokens) as trained, under clamp where it applies and under the window control
    assert {(r["method"], r["length"]) for r in use} == {("none", 32), ("window", 32)}
    assert np.asarray(use[0]["passages"]).shape[:2] == (3, 1)  # 3 windows x one distance (2L does not fit in 2L)
    # per distance, the passages whose copies a document's end parts (counted on the text as prepared)
    assert [len(r["across_documents"]) for r in use] == [len(r["distances"]) for r in use]
    assert all(0 <= count <= 3 for r in use for count in r["across_documents"])
    report = (out / "report.md").read_text()
    for heading in ("### Attention diagnostics", "### Induction probe", "### Passkey retrieval", "### Task: flipflop",
                    "### Use of the text past L, on the same weights"):
        assert heading in report
    assert "| rope+window |" in report and "Negative control (rope+window" in report
    assert "- Copies in different documents (a document's end between them" in report
    assert "| rope @ 16x |" in report and (out / "attention.png").stat().st_size > 0
    assert " | 3* / 3* |" in report and "until validation exact match at L reaches 0.95, at most 3 steps" in report
    from eval.figures import colour, method_colour

    pngs = sorted(out.rglob("*.png"))
    assert len(pngs) >= 6 and not list(out.rglob("*.svg"))  # one file per figure
    for name in ("plot", "penalty", "train_curves", "attention", "tasks/flipflop/flipflop"):
        assert colour("rope") in strokes[name], name  # one colour per encoding in every figure
        # learned: no table at 16x (attention) and no penalty as trained (its clamp row is in its own panel)
        assert (colour("learned") in strokes[name]) == (name not in ("attention", "penalty")), name
    assert method_colour("clamp") in strokes["penalty"]  # learned under each method
    capsys.readouterr()
    assert main(args) == 0
    output = capsys.readouterr().out
    assert "attention cached, induction cached, passkey cached, use cached" in output
    assert "task flipflop: cached" in output


def test_newer_paper_claims_are_judged_by_their_intervals():
    """Extrapolation claims rest on the penalty difference paired by seed and window, 1x claims on the perplexity
    ratio paired by seed."""
    from experiments.compare.findings import newer_claim_findings

    rng = np.random.default_rng(0)

    def with_penalty(name, ppl_1x, penalty, spread=0.002):
        result = variant(name, {16: ppl_1x, 64: [130, 140, 150]})
        result.penalty[64] = {seed: penalty + spread * rng.standard_normal(16) for seed in range(3)}
        return result

    variants = {"rope": with_penalty("rope", [100, 110, 120], 0.10),
                "xpos": with_penalty("xpos", [100, 110, 120], 0.05),  # lower penalty: agrees
                "rnope-swa": with_penalty("rnope-swa", [100, 110, 120], 0.20),  # higher: disagrees
                "irope": with_penalty("irope", [100, 110, 120], 0.10, spread=0.05),  # overlaps: cannot tell
                "p-rope": with_penalty("p-rope", [100.2, 110.1, 119.9], 0.10),  # 1x: same within 1%: agrees
                "cope": with_penalty("cope", [110, 121, 132], 0.10)}  # 1x: 1.1x in every seed: disagrees
    lines = "\n".join(newer_claim_findings(variants, [16, 64], 16))
    assert "xPos extrapolates better than RoPE (Sun et al. 2022): penalty at 4x xpos +0.050" in lines
    assert lines.count("; agrees") == 2 and "kerple" not in lines  # not compared: no statement
    assert "rnope-swa +0.200" in lines and "disagrees (the paired difference excludes 0 the other way)" in lines
    assert "difference paired by seed and window -0.050 [-0.052, -0.047]" in lines
    assert "cannot tell (the paired difference's interval holds 0)" in lines
    assert "cope / rope perplexity at 1x = 1.100 [1.100, 1.100]x; disagrees" in lines


def test_the_passkey_section_gives_an_interval_over_seeds_not_pooled_trials(tmp_path):
    from types import SimpleNamespace

    from eval.stats import seeds_and_trials, wilson_interval
    from experiments.compare.layout import probe_path
    from experiments.compare.probes import passkey_section

    compare = SimpleNamespace(encodings=["rope", "alibi"], seeds=[1, 2], probe_lengths=["1x", "4x"], passkey_trials=10)
    by_seed = {("rope", 1): 10, ("rope", 2): 0, ("alibi", 1): 3, ("alibi", 2): 3}  # successes of 3 x 10 per length
    for (encoding, seed), successes in by_seed.items():
        rows = [{"depth": d, "accuracy": (successes if d == 0.5 else 0) / 10, "trials": 10} for d in (0.1, 0.5, 0.9)]
        path = probe_path(tmp_path, encoding, seed, "passkey")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": {"1x": rows, "4x": {"error": "too short"}}}))
    results = SimpleNamespace(out=tmp_path, compare=compare)  # what passkey_section reads of ComparisonResults
    table = {line.split(" | ")[0].strip("| "): line for line in passkey_section(results) if line.startswith("| ")}
    split, agree = seeds_and_trials([10, 0], [30, 30]), seeds_and_trials([3, 3], [30, 30])
    assert table["rope"] == f"| rope | {split.format()} | n/a |"
    assert table["alibi"] == f"| alibi | {agree.format()} | n/a |"
    assert split.high - split.low > 2 * (wilson_interval(10, 60).high - wilson_interval(10, 60).low)
    assert (agree.low, agree.high) == (wilson_interval(6, 60).low, wilson_interval(6, 60).high)


def test_findings_name_every_separated_pair_and_order_the_encodings_as_trained_when_methods_are_there():
    """A chain of '≈' can join two variants whose intervals separate (overlap is not transitive): the separated
    pairs are listed; with methods, the orderings hold the encodings as trained only."""
    rows = {name: variant(name, {16: ppl, 64: ppl}) for name, ppl in
            (("alibi", [10.0, 10.1, 9.9]), ("rope", [10.6, 10.7, 10.5]), ("none", [11.2, 11.3, 11.1]))}
    text = "\n".join(findings(rows, [16, 64], 16, []))
    assert "Perplexity at 1x, best to worst: alibi (10.0) < rope (10.6) < none (11.2)." in text
    assert "(better < worse): alibi < rope, none; rope < none." in text
    wide = {name: variant(name, {16: ppl, 64: ppl}) for name, ppl in
            (("alibi", [10.0, 10.2, 9.8]), ("rope", [10.5, 11.5, 9.5]), ("none", [11.0, 11.2, 10.8]))}
    text = "\n".join(findings(wide, [16, 64], 16, []))
    assert "alibi (10.0) ≈ rope (10.5) ≈ none (11.0)" in text and "(better < worse): alibi < none." in text
    yarn = variant("rope", {16: [10.6, 10.7, 10.5], 64: [9.0, 9.1, 8.9]})
    yarn.method, yarn.label = "yarn", "rope+yarn"
    text = "\n".join(findings({**rows, "rope+yarn": yarn}, [16, 64], 16, []))
    assert "rope+yarn" not in text.split("(The encodings as trained;")[0]  # orderings: as trained only
    assert "Perplexity at 4x, best to worst: alibi (10.0) < rope (10.6) < none (11.2)." in text


def test_findings_give_the_absolute_encodings_1x_gap_and_check_the_papers_order_of_degradation():
    """The sinusoid (absolute) gets its 1x perplexity against RoPE's next to its extrapolation claims; the ALiBi
    paper's order (sinusoidal > rope > t5 > alibi by the penalty) is checked pair by pair: here the sinusoid and
    RoPE separate as the paper has them, RoPE and T5 are reversed, T5 and ALiBi agree."""
    rows = {}
    for name, ppl, penalty in (("sinusoidal", [15.0, 15.2, 14.8], [0.9, 1.0, 1.1]),
                               ("rope", [10.0, 10.2, 9.8], [0.3, 0.35, 0.4]),
                               ("t5", [10.0, 10.1, 9.9], [0.6, 0.65, 0.7]),
                               ("alibi", [10.0, 10.2, 9.8], [0.0, 0.004, -0.004])):
        v = variant(name, {16: ppl, 64: ppl})
        v.penalty[64] = {seed: np.full(8, value) for seed, value in enumerate(penalty)}
        rows[name] = v
    text = "\n".join(findings(rows, [16, 64], 16, []))
    assert "sinusoidal +1.000 [" in text and "(absolute encoding; its 1x perplexity is 1.50x RoPE's, not within 10%)" \
        in text
    assert "rope +0.350" in text and "rope +0.350 [+0.226, +0.474] nats: positions beyond L cost more than the " \
        "longer context gives;" in text  # a relative encoding gets no gap
    assert ("the order of degradation beyond L (sinusoidal > rotary > T5 > ALiBi), by the penalty at 4x: "
            "sinusoidal (+1.000) > rope (+0.350, difference +0.650 [+0.526, +0.774]): agrees; rope (+0.350) > t5 "
            "(+0.650, difference -0.300 [-0.300, -0.300]): reversed; t5 (+0.650) > alibi (+0.000, difference +0.650 "
            "[+0.521, +0.779]): agrees.") in text



def test_an_encodings_own_learning_rate_reaches_its_optimizer_groups_and_no_other(prepared_data, tmp_path):
    from experiments.compare.config import load_compare_config
    from model import Transformer
    from train.loop import build_optimizer

    compare, shared, _ = load_compare_config(ROOT / "configs" / "compare.toml", "quick", [
        *MICRO, "--train.max_steps=4", "--train.warmup_steps=2", "--train.log_interval=1", "--train.eval_interval=4",
        f"--compare.out={tmp_path}", "--compare.train_settings={alibi = {lr = 0.0125}}"])
    rates = {}
    for encoding in ("alibi", "rope"):
        config = running.variant_config(shared, encoding, 1, prepared_data, compare)
        groups = build_optimizer(Transformer(config.model), config, torch.device("cpu")).param_groups
        assert len(groups) >= 2 and {group["lr"] for group in groups} == {config.train.lr}
        assert running.train_variant(config) == "trained"
        logged = [json.loads(line) for line in (Path(config.out.dir) / "metrics.jsonl").read_text().splitlines()]
        rates[encoding] = max(record["lr"] for record in logged if "lr" in record)  # the peak, after warm-up
    assert rates["alibi"] == pytest.approx(0.0125)
    assert rates["rope"] == pytest.approx(shared["train"]["lr"])  # the shared rate, untouched


def test_a_comparison_copies_the_models_another_trained_with_the_same_settings_and_trains_the_others(
        small_text_file, tmp_path):
    """compare.reuse: the same settings on the same data give the same weights (a fresh training in a third folder
    shows it), so the copy stands for the training; a changed setting is trained, not copied."""
    first, second, fresh, other = (tmp_path / name for name in ("first", "second", "fresh", "other"))
    two = ['--compare.encodings=["alibi", "rope"]', "--compare.workers=1"]
    assert main(arguments(small_text_file, first, *two)) == 0
    assert main(arguments(small_text_file, second, *two, f'--compare.reuse=["{first}"]')) == 0
    results = json.loads((second / "results.json").read_text())
    assert {r["status"] for r in results["status"].values()} == {f"reused (trained in {first})"}
    assert results["cells"] == json.loads((first / "results.json").read_text())["cells"]
    assert "Reproduce: `python -m experiments.compare" in (second / "report.md").read_text()
    assert "--compare.reuse" not in (second / "report.md").read_text()  # it changes no number
    copied = second / "runs" / "rope" / "seed1"
    state = json.loads((copied / "trainer_state.json").read_text())
    assert state["run_config"]["out"]["dir"] == str(copied)
    assert state["run_config"]["data"]["dir"] == str(second / "data")
    assert Path(state["data_folder"]["path"]) == (second / "data").resolve()
    assert f'dir = "{copied}"' in (copied / "run_config.toml").read_text()
    assert main(arguments(small_text_file, fresh, '--compare.encodings=["rope"]', "--compare.workers=1")) == 0
    assert (fresh / "runs" / "rope" / "seed1" / "model.safetensors").read_bytes() == \
        (first / "runs" / "rope" / "seed1" / "model.safetensors").read_bytes()
    assert main(arguments(small_text_file, other, *two, "--compare.train_settings={rope = {lr = 0.01}}",
                          f'--compare.reuse=["{first}"]')) == 0
    statuses = json.loads((other / "results.json").read_text())["status"]
    assert statuses["alibi-seed1"]["status"] == f"reused (trained in {first})"
    assert statuses["rope-seed1"]["status"] == "trained"


def test_use_against_the_tokens_trained_probes_every_kept_model(small_text_file, tmp_path):
    """compare.snapshot_probes = ["use"]: the use probe on each kept model as on the final one, cached per step, and
    the report's table and figure of use against the tokens trained (issue 75)."""
    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, '--compare.encodings=["none", "rope"]', "--compare.seeds=[1, 2]",
                     "--compare.snapshots=[0.5]", '--compare.probes=["use"]', '--compare.snapshot_probes=["use"]',
                     '--compare.methods=["yarn"]', '--compare.use_distances=["0.5x", "2x", "max"]',
                     "--compare.use_windows=3", "--model.max_seq_len=32", "--compare.workers=1")
    assert main(args) == 0
    for encoding in ("none", "rope"):
        for seed in (1, 2):
            kept = json.loads((out / "probes" / encoding / f"seed{seed}-step3-use.json").read_text())["rows"]
            final = json.loads((out / "probes" / encoding / f"seed{seed}-use.json").read_text())["rows"]
            assert kept["results"] and kept["results"] != final["results"]  # other weights, the same windows
            assert [r["distances"] for r in kept["results"]] == [r["distances"] for r in final["results"]]
    report = (out / "report.md").read_text()
    section = report[report.index("### Use against the tokens trained"):]
    for label in ("none", "rope", "rope+yarn"):
        rows = [line for line in section.splitlines() if line.startswith(f"| {label} |")]
        assert [row.split("|")[2].strip() for row in rows] == ["384", "768"], rows  # 3 and 6 steps of 4 x 32
        assert all(row.split("|")[3].strip() != "n/a" for row in rows), rows  # the positive control, within L
        # the longest length's penalty beside use: scored for the kept models as trained (snapshot_methods: clamp)
        assert all((row.split("|")[-2].strip() == "n/a") == (label == "rope+yarn") for row in rows), rows
    assert (out / "use_budget.png").stat().st_size > 0
    rows = json.loads((out / "results.json").read_text())["use_by_step"]
    assert {(r["label"], r["step"], r["column"]) for r in rows} >= {("rope", 3, "within L"), ("rope", 6, "2L back")}
    assert all(r["use"] is None or r["use"]["low"] is None or r["use"]["low"] <= r["use"]["mean"] <= r["use"]["high"]
               for r in rows)
    assert all((r["penalty"] is None) == (r["label"] != "rope" and r["label"] != "none") for r in rows)


def test_snapshot_probes_need_snapshots_and_name_the_use_probe():
    from errors import ConfigError
    from experiments.compare.config import CompareConfig

    with pytest.raises(ConfigError, match="compare.snapshot_probes"):
        CompareConfig(snapshot_probes=["use"])
    with pytest.raises(ConfigError, match="compare.snapshot_probes"):
        CompareConfig(snapshots=[0.5], snapshot_probes=["passkey"])
    assert CompareConfig(snapshots=[0.5], snapshot_probes=["use"]).snapshot_probes == ["use"]


def test_a_use_probe_the_held_out_text_cannot_hold_stops_before_any_training(small_text_file, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(arguments(small_text_file, out, '--compare.probes=["use"]', "--compare.use_windows=100000",
                          "--compare.workers=1")) == 2
    assert "lower compare.use_windows" in capsys.readouterr().err
    assert not (out / "runs").exists()  # nothing trained
