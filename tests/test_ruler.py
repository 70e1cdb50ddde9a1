"""pelab as lm-evaluation-harness's model (infer/harness.py) and RULER's niah_single_1 through it on a tiny
checkpoint (any score): its loglikelihoods against the model's own scoring, its generation against generate_tokens,
and experiments.ruler's cells, cache and report. Needs the optional extra (make ruler-deps); integration tier."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval", reason="needs lm-eval: make ruler-deps")
pytest.importorskip("wonderwords", reason="needs RULER's wonderwords: make ruler-deps")

from data.tokenizer import load_tokenizer  # noqa: E402
from eval.scoring import score_windows  # noqa: E402
from infer.generate import generate_tokens  # noqa: E402
from model import Transformer  # noqa: E402
from model.checkpoint import save_checkpoint  # noqa: E402
from tests.conftest import micro_config  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=64, init_std=0.2))
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 64, "step": 0})
    return folder


class Request:
    def __init__(self, *args):
        self.args = args


def test_the_harness_model_scores_and_generates_as_pelab_does(checkpoint):
    from infer.harness import PelabLM

    lm = PelabLM(str(checkpoint), dtype="float32", device="cuda:0")  # lm-eval's default device: the CPU here
    text = "def area(radius):\n    return 3.14 * radius * radius\n"
    ids = lm.tok_encode(text)
    # rolling loglikelihood of a text within max_length: every token scored after the end-of-text prefix
    window = np.array([[lm.eot_token_id, *ids]])
    expected = -float(score_windows(lm.model, window).sum())
    [rolling] = lm.loglikelihood_rolling([Request(text)])
    assert rolling == pytest.approx(expected, abs=1e-3)
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


def test_ruler_niah_single_1_runs_on_a_tiny_checkpoint_and_resumes(checkpoint, tmp_path):
    from experiments.ruler import main

    out = tmp_path / "ruler"
    argv = ["--checkpoint", str(checkpoint), "--methods", "none,yarn", "--tasks", "niah_single_1", "--lengths",
            "512", "--samples", "2", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 0
    cell = json.loads((out / "cells" / "yarn" / "niah_single_1@512.json").read_text())
    assert cell["length"] == 512 and cell["set_for"] == 512 and len(cell["samples"]) == 2
    assert all(0.0 <= s["score"] <= 1.0 and s["prompt_tokens"] <= 512 for s in cell["samples"])
    # where each needle stands, read from the samples generated again as lm-eval generated them
    assert all(0 < s["needle_back"] <= s["prompt_tokens"] for s in cell["samples"])
    assert list((out / "cache" / "none").glob("niah_single_1@512*.db"))  # lm-eval's response cache, per sample
    report = (out / "report.md").read_text()
    assert "niah_single_1 @ 512" in report and "| YaRN |" in report and "/2 [" in report
    assert "## By how far back the needle stands" in report
    stamp = (out / "cells" / "none" / "niah_single_1@512.json").stat().st_mtime_ns
    assert main(argv) == 0  # a finished cell is not run again
    assert (out / "cells" / "none" / "niah_single_1@512.json").stat().st_mtime_ns == stamp


def test_the_answer_teacher_forced_after_the_cells_own_prompt_scores_as_the_model_does(checkpoint, tmp_path):
    from experiments.ruler import built_task, main
    from infer.harness import PelabLM

    out = tmp_path / "ruler"
    common = ["--checkpoint", str(checkpoint), "--methods", "none", "--tasks", "niah_single_1", "--lengths", "512",
              "--samples", "2", "--dtype", "float32", "--out", str(out)]
    assert main(common) == 0
    assert main(common + ["--forced"]) == 0
    cell = json.loads((out / "cells" / "none" / "niah_single_1@512.json").read_text())
    forced = json.loads((out / "forced" / "none" / "niah_single_1@512.json").read_text())
    assert [s["doc_id"] for s in forced["samples"]] == [0, 1]
    for row, sample in zip(forced["samples"], cell["samples"]):
        assert row["answer"] == sample["target"][0] and row["needle_back"] == sample["needle_back"]
        # the prompt the cell's model was given (its token count, with the answer's leading space moved over)
        assert abs(row["prompt_tokens"] - sample["prompt_tokens"]) <= 1
    # the answer's log-probability and argmax test, read again from one forward of the model
    lm = PelabLM(str(checkpoint), dtype="float32")
    built = built_task(str(checkpoint), "niah_single_1", 512)
    built.build_all_requests(limit=1)
    [first] = [one for one in built.instances if one.doc_id == 0]
    context, continuation = lm._encode_pair(first.args[0], " " + first.doc["outputs"][0])
    with torch.no_grad():
        logits, _ = lm.model(torch.tensor([context + continuation[:-1]]))
    logprobs = torch.log_softmax(logits[0, len(context) - 1:].float(), -1)
    picked = logprobs.gather(1, torch.tensor(continuation)[:, None]).sum()
    assert forced["samples"][0]["logprob"] == pytest.approx(float(picked), abs=1e-4)
    assert forced["samples"][0]["greedy"] == bool((logprobs.argmax(-1) == torch.tensor(continuation)).all())
    # the control answer: the answer's shape, nowhere in the prompt, scored after the same prompt
    control = forced["samples"][0]["control"]
    assert len(control) == len(first.doc["outputs"][0]) and control not in first.args[0]
    assert all(a.isdigit() == b.isdigit() for a, b in zip(control, first.doc["outputs"][0]))
    _, control_tokens = lm._encode_pair(first.args[0], " " + control)
    with torch.no_grad():
        logits, _ = lm.model(torch.tensor([context + control_tokens[:-1]]))
    picked = torch.log_softmax(logits[0, len(context) - 1:].float(), -1).gather(
        1, torch.tensor(control_tokens)[:, None]).sum()
    assert forced["samples"][0]["control_logprob"] == pytest.approx(float(picked), abs=1e-4)
    assert forced["samples"][0]["gain"] == pytest.approx(forced["samples"][0]["logprob"] - float(picked), abs=1e-4)
    assert "## The answer teacher-forced" in (out / "report.md").read_text()
    assert main(common + ["--forced"]) == 0  # every sample done: nothing scored again
    # the needle's own words as the cue: the answer a verbatim copy of the needle's
    from experiments.ruler import needle_cue
    assert needle_cue("Grass. The sky is blue. One of the numbers for cat is: 123. More.", "123") == \
        "One of the numbers for cat is:"
    assert main(common + ["--forced", "--cue", "needle"]) == 0
    verbatim = json.loads((out / "forced-needle" / "none" / "niah_single_1@512.json").read_text())
    assert verbatim["cue"] == "needle" and len(verbatim["samples"]) == 2
    cue = needle_cue(first.doc["input"], first.doc["outputs"][0])
    assert cue.endswith("is:") and first.doc["outputs"][0] not in cue
    assert verbatim["samples"][0]["prompt_tokens"] > forced["samples"][0]["prompt_tokens"]
    assert "| needle |" in (out / "report.md").read_text()
    assert json.loads((out / "forced" / "none" / "niah_single_1@512.json").read_text())["seconds"] == forced["seconds"]
