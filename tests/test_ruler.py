"""experiments.ruler: its cells, the rules of its report (k of n, RULER's own score, needle distance and response
value, parity, the rank correlation with use held by Holm, the published orderings), and, with the optional extra
(make ruler-deps), pelab as lm-evaluation-harness's model (infer/harness.py), a cell measured on a micro checkpoint
and the study run end to end through the engine with lm-eval's hf model beside it."""
import json

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from errors import ConfigError
from eval.ruler import response_value, sample_row, yarn_folder
from experiments import ruler, ruler_report
from experiments.engine import Context, Records, key, main
from model import Transformer
from model.checkpoint import save_checkpoint
from tests.conftest import micro_config


@pytest.fixture
def needs_lm_eval():
    pytest.importorskip("lm_eval", reason="needs lm-eval: make ruler-deps")
    pytest.importorskip("wonderwords", reason="needs lm-eval: make ruler-deps")


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=64, init_std=0.2))
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 64, "step": 0})
    return folder


def run_cell(method, task, k, length=16, n=4, **more):
    """A report's view of a cell: k of n samples answered in full."""
    return {"method": method, "task": task, "length": length, "samples": [{"score": 1.0}] * k + [{"score": 0.5}] *
            (n - k), **more}


# ---------------------------------------------------------------------------------------------------- the cells

def test_the_cells_are_each_blocks_product_with_the_parity_models_and_the_inputs_identified_not_located(checkpoint,
                                                                                                        tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"weights")
    (hf / "config.json").write_text("{}")
    settings = ruler.Settings(checkpoint=str(checkpoint), methods=["none", "yarn"], tasks=["niah_single_1"],
                              lengths=[512, 1024], grid=[{"methods": ["linear"], "tasks": ["ruler_vt"],
                                                          "lengths": [2048]}], parity=str(hf), parity_yarn=True)
    cells = ruler.cells(settings, Context(tmp_path / "out"))
    assert [c["name"] for c in cells] == [f"{m}/niah_single_1@{n}" for m in ("none", "yarn", "hf", "hf-yarn")
                                          for n in (512, 1024)] + [f"{m}/ruler_vt@2048" for m in
                                                                   ("linear", "hf", "yarn", "hf-yarn")]
    assert {c["set_for"] for c in cells} == {2048} and {c["trained"] for c in cells} == {64}  # the longest length
    assert len({c["checkpoint"] for c in cells}) == 1 and len(cells[0]["checkpoint"]) == 16
    hf_cells = [c for c in cells if c["model"].startswith("hf")]
    assert all(c["hf_checkpoint"] != c["checkpoint"] for c in hf_cells)
    assert not any("hf_checkpoint" in c for c in cells if c not in hf_cells)
    moved = dict(cells[0], local={"checkpoint": "elsewhere"})
    assert key(moved) == key(cells[0])  # where the checkpoint lies is not part of the address


def test_a_block_of_later_samples_makes_cells_of_its_own_and_leaves_the_first_cells_addresses(checkpoint, tmp_path):
    plain = ruler.Settings(checkpoint=str(checkpoint), methods=["none", "yarn"], tasks=["niah_single_1"],
                           lengths=[512])
    more = ruler.Settings(checkpoint=str(checkpoint), methods=["none", "yarn"], tasks=["niah_single_1"], lengths=[512],
                          grid=[{"methods": ["yarn"], "tasks": ["niah_single_1"], "lengths": [512], "first": 20,
                                 "samples": 40}])
    first, extended = (ruler.cells(settings, Context(tmp_path / "out")) for settings in (plain, more))
    assert extended[:2] == first and [key(c) for c in extended[:2]] == [key(c) for c in first]
    assert "first" not in first[0] and first[0]["samples"] == 20  # a cell from sample 0: its address as before
    [later] = extended[2:]
    assert later["name"] == "yarn/niah_single_1@512[20:60]" and (later["first"], later["samples"]) == (20, 40)


def test_the_report_pools_a_models_cells_of_one_task_and_length_each_sample_once(tmp_path):
    settings = ruler.Settings(checkpoint="ckpt", methods=["yarn"], tasks=["niah_single_1"], lengths=[128],
                              out=str(tmp_path))
    common = {"model": "yarn", "task": "niah_single_1", "length": 128, "checkpoint": "0" * 16, "trained": 64,
              "set_for": 128, "dtype": "auto", "local": {"checkpoint": "c"}}
    cells = [{"name": "yarn/niah_single_1@128", "samples": 2, **common},
             {"name": "yarn/niah_single_1@128[1:4]", "samples": 3, "first": 1, **common}]

    def sample(doc, score):
        return {"doc_id": doc, "target": ["12"], "response": " 12", "score": score, "prompt_tokens": 100}

    records = [[sample(0, 1.0), sample(1, 1.0)], [sample(3, 0.0), sample(1, 0.0), sample(2, 1.0)]]
    stored = {key(c): {"record": {"seconds": 5.0, "from_cache": 1, "dtype": "bfloat16", "samples": r}, "seconds": 6.0,
                       "machine": "a CPU"} for c, r in zip(cells, records)}
    [entry] = ruler_report.pooled(Records(settings, tmp_path, cells, stored, []))
    assert [s["doc_id"] for s in entry["samples"]] == [0, 1, 2, 3]  # sample 1 from the cell declared first
    assert [s["score"] for s in entry["samples"]] == [1.0, 1.0, 1.0, 0.0]
    assert (entry["seconds"], entry["from_cache"], entry["method"]) == (10.0, 2, "yarn")
    assert ruler_report.full(entry) == (3, 4)


@pytest.mark.parametrize("bad", [{"grid": [{"methods": ["none"]}]}, {"methods": ["no-such-method"]},
                                 {"parity_yarn": True}, {"lengths": [0]}, {"samples": 0}, {"dtype": "float16"},
                                 {"grid": [{"methods": ["none"], "tasks": ["niah_single_1"], "lengths": [512],
                                            "first": -1}]},
                                 {"grid": [{"methods": ["none"], "tasks": ["niah_single_1"], "lengths": [512],
                                            "first": "20"}]},
                                 {"grid": [{"methods": ["none"], "tasks": ["niah_single_1"], "lengths": [512],
                                            "from": 20}]}])
def test_settings_refuse_what_no_cell_could_run(bad):
    with pytest.raises(ConfigError):
        ruler.Settings(**bad)


def test_a_needle_sample_keeps_how_far_back_its_needle_stands_and_what_its_response_gives():
    class Words:
        @staticmethod
        def encode(text):
            return text.split()

    logged = {"doc_id": 3, "target": ["8734194"], "resps": [[" 1743906."]], "512": 0.0, "arguments": [["a b c d"]],
              "doc": {"input": "hay 1743906 hay . key: 8734194 . hay hay question", "outputs": ["8734194"]}}
    row = sample_row(logged, "niah_single_1", 512, Words(), Words())
    assert row == {"doc_id": 3, "target": ["8734194"], "response": " 1743906.", "score": 0.0, "prompt_tokens": 4,
                   "needle_back": 5, "value": "held"}
    assert "needle_back" not in sample_row(logged, "ruler_vt", 512, Words(), Words())  # not a needle task


def test_needle_responses_are_told_apart_by_the_number_they_give():
    held = {"8734194", "1743906", "12"}
    assert response_value(" 8734194.", "8734194", held) == "answer"
    assert response_value(": 1743906. And 8734194", "8734194", held) == "answer"  # RULER's match: anywhere
    assert response_value(" 1743906.", "8734194", held) == "held"
    assert response_value(" 174390.", "8734194", held) == "invented"  # a number, but not one the prompt holds
    assert response_value(" we are we go", "8734194", held) == "none"
    assert response_value(" f1a2", "f1a2-uuid", held) is None  # not a number: not told apart


def test_the_hf_folder_with_yarn_rewrites_only_its_config(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text(json.dumps({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}))
    target = yarn_folder(folder, 2.0, 8192, tmp_path / "work")
    assert (target / "model.safetensors").resolve() == (folder / "model.safetensors").resolve()
    assert json.loads((target / "config.json").read_text())["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 8192}
    assert yarn_folder(folder, 2.0, 8192, tmp_path / "work") == target  # made once


# ---------------------------------------------------------------------------------------------------- the report

def test_ruler_own_score_is_given_for_tasks_with_several_answers_with_a_bounded_interval():
    vt = {"samples": [{"target": list("abcde"), "score": 0.2}] * 3 + [{"target": list("abcde"), "score": 0.0}] * 17}
    score = ruler_report.partial_score(vt)
    assert score.mean == pytest.approx(0.03) and 0 < score.low < 0.03 < score.high < 0.25
    assert ruler_report.score_text(vt).startswith("0/20 [0.00, 0.16]; score 0.03 [")
    needle = {"samples": [{"target": ["4430567"], "score": 1.0}] * 20}
    assert ruler_report.partial_score(needle) is None and ruler_report.score_text(needle) == "20/20 [0.84, 1.00]"
    assert ruler_report.seconds_text({"seconds": 41.6, "from_cache": 3}) == "42 s; 3 samples from an earlier run"


def test_needle_shares_average_only_the_tasks_every_method_was_asked():
    cells = [run_cell("a", "niah_single_1", 4), run_cell("a", "niah_multikey_2", 0), run_cell("b", "niah_single_1", 2),
             run_cell("b", "ruler_vt", 4), run_cell("c", "niah_single_1", 1, length=8)]
    assert ruler_report.needle_shares(cells, 16) == {"a": 1.0, "b": 0.5}  # only a has niah_multikey_2; vt: no needle
    assert ruler_report.needle_shares(cells + [run_cell("b", "niah_multikey_2", 4)], 16) == {"a": 0.5, "b": 0.75}


def test_ruler_is_read_pooled_over_the_niah_tasks_and_each_alone_and_held_against_use_with_holm():
    methods = "abcdef"
    cells = [run_cell(m, "niah_single_1", 4 - i * 4 // 6) for i, m in enumerate(methods)]
    assert list(ruler_report.ruler_readings(cells, 16)) == ["niah_single_1"]  # one task: no pooled reading
    cells += [run_cell(m, "niah_multikey_2", 0) for m in methods[:-1]]
    assert list(ruler_report.ruler_readings(cells, 16)) == ["niah_single_1"]  # f was not asked niah_multikey_2
    cells += [run_cell("f", "niah_multikey_2", 1), run_cell("a", "ruler_vt", 4)]
    readings = ruler_report.ruler_readings(cells, 16)
    pooled = "mean over niah_multikey_2 and niah_single_1"
    assert list(readings) == [pooled, "niah_multikey_2", "niah_single_1"]
    assert readings["niah_multikey_2"]["f"] == 0.25 and readings[pooled]["f"] == pytest.approx((0.25 + 1 / 4) / 2)
    rows = ruler_report.correlate(readings, {m: {"book": {100: 6.0 - i, 300: 0.0}} for i, m in enumerate(methods)})
    assert len(rows) == 6
    single = next(r for r in rows if r["ruler_reading"] == "niah_single_1" and r["use"] == "mean over the distances")
    multikey = next(r for r in rows if r["ruler_reading"] == "niah_multikey_2" and r["use"] ==
                    "mean over the distances")
    assert single["spearman"] > 0.9 and single["holm"]  # shares fall with use: passes Holm at 5%
    assert multikey["spearman"] < 0 and not multikey["holm"]  # only the least-using method answers one


def test_use_is_read_over_the_distances_and_at_the_farthest_and_orderings_are_written_highest_first():
    use = {"a": {"book": {100: 2.0, 300: 0.0}}, "b": {"book": {100: 0.5, 300: 0.4}},
           "c": {"book": {100: 0.1, 300: 0.0}, "other": {100: 0.3, 300: 0.2}}}
    mean, farthest = ruler_report.correlate({"pooled": {"a": 0.9, "b": 0.5, "c": 0.0, "d": 1.0}}, use)
    assert mean["methods"] == ["a", "b", "c"] and mean["reading"] == pytest.approx([1.0, 0.45, 0.15])  # d: no use
    assert mean["spearman"] == pytest.approx(1.0) and mean["p"] == pytest.approx(1 / 6) and not mean["holm"]
    assert farthest["reading"] == pytest.approx([0.0, 0.4, 0.1]) and farthest["spearman"] == pytest.approx(-0.5)
    assert ruler_report.correlate({"pooled": {"a": 1.0, "b": 0.0}}, use) == []
    assert ruler_report.ordering({"yarn": 48.25, "linear": 0.0, "none": 0.0}, ["linear", "yarn", "none"]) == \
        "YaRN 48.25 > PI (linear) 0 = plain RoPE 0"
    assert ruler_report.p_text(0.0) == "< 5e-06" and ruler_report.p_text(6.5e-05) == "6.5e-05"


def test_published_orderings_come_with_their_source_and_count_only_separated_pairs():
    cells = [run_cell(method, "niah_single_1", 0, length=128,
                      samples=[{"doc_id": i, "score": float(i < k), "response": "", "target": ["7"]} for i in range(20)])
             for method, k in (("yarn", 16), ("ntk", 11), ("linear", 0), ("none", 0))]
    pairs = ruler_report.sample_pairs(cells, ["yarn", "ntk", "linear", "none"], ["niah_single_1"], 128)
    # 16 vs 0 and 11 vs 0 on the same samples separate (Holm over 6 pairs); YaRN 5 to 0 over NTK does not (p 0.0625)
    assert pairs[("yarn", "linear")]["separated"] and pairs[("ntk", "none")]["separated"]
    assert pairs[("yarn", "ntk")]["a"] == 5 and pairs[("yarn", "ntk")]["p"] == 0.0625
    assert not pairs[("yarn", "ntk")]["separated"] and not pairs[("linear", "none")]["separated"]
    rows = ruler_report.published_rows({"yarn": 0.8, "ntk": 0.55, "linear": 0.0, "none": 0.0}, pairs)
    drope = next(row for row in rows if row["source"].startswith("DroPE"))
    assert (drope["alike"], drope["opposite"], drope["left"]) == (4, 0, 2)
    assert all(len(row["methods"]) >= 2 and row["source"] for row in rows)


def test_the_tables_bin_needles_by_half_l_count_response_values_and_compare_hf_responses():
    samples = [{"doc_id": i, "score": float(i % 2), "needle_back": back, "value": value, "response": f" {i}",
                "target": ["7"]} for i, (back, value) in enumerate([(10, "held"), (40, "answer"), (70, "none")])]
    cell = run_cell("none", "niah_single_1", 0, length=128, samples=samples)
    lines = ruler_report.by_distance([cell], trained=64)
    assert lines[4] == "| method | task @ length | 0-32 back | 32-64 back | 64-96 back |"
    assert lines[-2] == "| plain RoPE | niah_single_1 @ 128 | 0/1 | 1/1 | 0/1 |"
    assert ruler_report.value_lines([cell])[-2] == "| plain RoPE | niah_single_1 @ 128 | 3 | 1 | 1 | 0 | 1 |"
    assert ruler_report.value_lines([{**cell, "samples": [{"value": None}]}]) == []
    hf = {**cell, "method": "hf", "samples": [dict(s, response=" 9") if s["doc_id"] == 2 else s for s in samples]}
    parity = ruler_report.parity_lines([{**cell, "seconds": 10.0}, {**hf, "seconds": 12.0}])
    assert parity[4].startswith("| plain RoPE | niah_single_1 | 128 | 3 | 2 | 1/3 [")
    assert parity[4].endswith("| 10 s / 12 s |") and parity[5] == "- none niah_single_1@128 sample 2: pelab ' 2', hf ' 9'"


def test_the_report_renders_from_the_records_alone(tmp_path):
    settings = ruler.Settings(checkpoint="ckpt", methods=["none", "yarn"], tasks=["niah_single_1", "ruler_vt"],
                              lengths=[128], out=str(tmp_path))
    common = {"checkpoint": "0" * 16, "trained": 64, "set_for": 128, "samples": 2, "dtype": "auto"}
    cells = [{"name": f"{m}/{t}@128", "model": m, "task": t, "length": 128, **common, "local": {"checkpoint": "c"}}
             for m in ("none", "yarn") for t in ("niah_single_1", "ruler_vt")]
    needle = [{"doc_id": i, "target": ["12"], "response": " 12", "score": 1.0, "prompt_tokens": 100,
               "needle_back": 20 + 40 * i, "value": "answer"} for i in range(2)]
    vt = [{"doc_id": i, "target": list("abcde"), "response": "a", "score": 0.2, "prompt_tokens": 100} for i in range(2)]
    stored = {key(c): {"record": {"seconds": 5.0, "from_cache": 0, "dtype": "bfloat16", "samples":
                                  vt if c["task"] == "ruler_vt" else needle}, "seconds": 6.0, "machine": "a CPU"}
              for c in cells[:3]}
    ruler_report.report(Records(settings, tmp_path, cells, stored, [{"command": "python -m experiments.ruler",
                                                                      "machine": "a CPU", "where": "here", "wall_s": 30}]))
    text = (tmp_path / "report.md").read_text()
    assert "Machine: a CPU. Methods set for 128 tokens; bfloat16;" in text
    assert "| plain RoPE | 2/2 [0.34, 1.00] (5 s) | 0/2 [0.00, 0.66]; score 0.20 [" in text
    assert "| YaRN | 2/2 [0.34, 1.00] (5 s) |  |" in text
    assert "| plain RoPE | niah_single_1 @ 128 | 1/1 | 1/1 |" in text  # 20 and 60 back, bins of 32
    assert "Not measured yet (1 cells): yarn/ruler_vt@128." in text and "Compute summed over the 3 cells" in text


# ------------------------------------------------------------------------------- with lm-evaluation-harness

class Request:
    def __init__(self, *args):
        self.args = args


@pytest.mark.integration
def test_the_harness_model_scores_and_generates_as_pelab_does(needs_lm_eval, checkpoint):
    from eval.scoring import score_windows
    from infer.generate import generate_tokens
    from infer.harness import PelabLM

    lm = PelabLM(str(checkpoint), dtype="float32", device="cuda:0")  # lm-eval's default device: the CPU here
    text = "def area(radius):\n    return 3.14 * radius * radius\n"
    ids = lm.tok_encode(text)
    # rolling loglikelihood of a text within max_length: every token scored after the end-of-text prefix
    window = np.array([[lm.eot_token_id, *ids]])
    [rolling] = lm.loglikelihood_rolling([Request(text)])
    assert rolling == pytest.approx(-float(score_windows(lm.model, window).sum()), abs=1e-3)
    # loglikelihood of a continuation: the same losses, on its tokens only
    context, continuation = "def area(radius):", "\n    return 3.14 * radius * radius\n"
    [(logprob, greedy)] = lm.loglikelihood([Request(context, continuation)])
    whole = lm.tok_encode(context + continuation)
    losses = score_windows(lm.model, np.array([whole]))[0]
    scored = len(whole) - len(lm.tok_encode(context))
    assert logprob == pytest.approx(-float(losses[-scored:].sum()), abs=1e-3) and isinstance(greedy, bool)
    # greedy generation: generate_tokens' tokens, cut at the first stop string as lm-eval's hf model cuts them
    prompt = "def main():\n"
    tokens = list(generate_tokens(lm.model, lm.tok_encode(prompt), 12, temperature=0))
    [answer] = lm.generate_until([Request(prompt, {"until": [], "max_gen_toks": 12, "do_sample": False})])
    assert answer == lm.tok_decode(tokens[: tokens.index(lm.eot_token_id)] if lm.eot_token_id in tokens else tokens)
    stop = answer[len(answer) // 2:][:2]
    if stop.strip():
        [cut] = lm.generate_until([Request(prompt, {"until": [stop], "max_gen_toks": 12, "do_sample": False})])
        assert cut == answer.split(stop)[0]


@pytest.mark.integration
def test_a_cell_is_measured_through_lm_eval_and_its_needles_found_in_the_prompts(needs_lm_eval, checkpoint,
                                                                                   tmp_path):
    settings = ruler.Settings(checkpoint=str(checkpoint), tasks=["niah_single_1"], lengths=[512], samples=2,
                              dtype="float32")
    [cell] = json.loads(json.dumps(ruler.cells(settings, Context(tmp_path))))
    record = ruler.measure(cell, Context(tmp_path))
    assert record["dtype"] == "float32" and record["from_cache"] == 0 and record["seconds"] > 0
    assert [s["doc_id"] for s in record["samples"]] == [0, 1]
    assert all(s["score"] in (0.0, 1.0) and 0 < s["needle_back"] < s["prompt_tokens"] <= 512 and
               s["value"] in ("answer", "held", "invented", "none") for s in record["samples"])
    assert list((tmp_path / "work" / "cache").glob(f"{key(cell)}*.db"))  # lm-eval's response cache, in work/
    assert ruler.measure(cell, Context(tmp_path))["from_cache"] == 2  # an interrupted cell continues from it
    # the task's samples 1 and 2 alone: numbered as the task numbers them, the same needles as from sample 0
    later = ruler.measure(dict(cell, first=1, samples=2), Context(tmp_path))
    both = ruler.measure(dict(cell, samples=3), Context(tmp_path))
    assert [s["doc_id"] for s in later["samples"]] == [1, 2]
    assert [s["target"] for s in later["samples"]] == [s["target"] for s in both["samples"][1:]]
    assert [s["needle_back"] for s in later["samples"]] == [s["needle_back"] for s in both["samples"][1:]]


@pytest.mark.integration
def test_the_study_runs_with_lm_evals_hf_model_beside_pelabs_and_against_use(needs_lm_eval, checkpoint, tmp_path,
                                                                            monkeypatch):
    import experiments.use_grid

    hf = tmp_path / "hf"
    from scripts.export_hf import main as export

    assert export(["--checkpoint", str(checkpoint), "--out", str(hf)]) == 0
    use_folder = tmp_path / "use"  # a use-grid study folder; its numbers come from use_by_method
    use_folder.mkdir()
    (use_folder / "study.json").write_text(json.dumps({"study": "experiments.use_grid", "settings": {}, "cells": []}))
    monkeypatch.setattr(experiments.use_grid, "use_by_method", lambda records: {
        "none": {"book": {100: 0.1}}, "linear": {"book": {100: 0.0}}, "yarn": {"book": {100: 0.5}}})
    out = tmp_path / "ruler"
    argv = ["--checkpoint", str(checkpoint), "--methods", "none,linear", "--parity", str(hf), "--parity-yarn", "true",
            "--tasks", "niah_single_1", "--lengths", "512", "--set-for", "128", "--samples", "2", "--dtype", "float32",
            "--use-results", str(use_folder), "--out", str(out), "--workers", "1", "--threads", "1"]
    assert main("experiments.ruler", argv) == 0
    report = (out / "report.md").read_text()
    # each pelab method beside lm-eval's hf model on the same samples (a random model's near-ties may flip)
    assert "| plain RoPE | niah_single_1 | 512 | 2 |" in report and "| YaRN | niah_single_1 | 512 | 2 |" in report
    assert "## RULER against same-weights use" in report and "## Published orderings beside the lab's" in report
    assert "## By how far back the needle stands" in report and "| PI (linear) |" in report
    records = sorted((out / "records").glob("*.json"))
    assert len(records) == 5 and not list(out.glob("cache"))  # none, linear, hf, yarn, hf-yarn; no cache beside them
    stamps = [path.stat().st_mtime_ns for path in records]
    assert main("experiments.ruler", argv) == 0  # every cell has its record: nothing measured again
    assert [path.stat().st_mtime_ns for path in records] == stamps
    rendered = (out / "report.md").read_text()
    assert main("experiments.ruler", ["--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == rendered
    assert (out / "work" / "hf-yarn2" / "config.json").exists()  # YaRN at 128 / 64 for the hf model, in work/
