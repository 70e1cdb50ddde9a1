"""RULER's synthetic tasks through lm-evaluation-harness for every inference-time method of one checkpoint: a grid of
(method, task, length) cells, each cached by sample, and the parity of pelab's model with lm-eval's own hf model.

    make ruler-deps
    python -m experiments.ruler --checkpoint runs/smollm2 --methods none,yarn,selfextend \\
        --tasks niah_single_1,niah_multikey_2 --lengths 4096,16384 --set-for 16384 --samples 20 --out runs/ruler
    python -m experiments.ruler --checkpoint runs/smollm2 --parity runs/smollm2_hf --tasks niah_single_1 \\
        --lengths 4096 --samples 20 --dtype float32 --out runs/ruler_parity

A cell runs lm-eval's own task files unchanged (lm_eval.simple_evaluate; infer/harness.py's model "pelab", the
method set for --set-for tokens, so PI, NTK and YaRN at 4k are the 16k setting's cost within L), the first --samples
samples of the task at that length (RULER generates them from the checkpoint's tokenizer, seeded: the same samples
for every method). Each response is kept in an lm-eval response cache (OUT/cache/METHOD/TASK@LENGTH) as soon as it
is generated, so an interrupted cell continues; a finished cell's samples (prompt length, target, response, score,
seconds) are OUT/cells/METHOD/TASK@LENGTH.json. Scores are RULER's (string_match_all); the report counts the samples
answered in full as k of n with the Wilson 95% interval.

--parity HF_FOLDER runs the same samples through lm-eval's hf model on that folder (scripts.export_hf of the same
checkpoint; --parity-yarn adds YaRN at factor --set-for / L through its config's rope_scaling), and records for
each sample whether the two responses are identical.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from commands import add_checkpoint, add_out, comma_list, command_parser, parse, results_json
from data.tokenizer import load_tokenizer
from errors import ConfigError, cli_command
from experiments.ruler_report import first_number, write_report
from model.checkpoint import trained_length
from model.methods import NONE, check_methods
from model.runtime import configure_runtime

TASKS = "niah_single_1,niah_multikey_2,ruler_vt"


def cell_path(out: Path, method: str, task: str, length: int) -> Path:
    return out / "cells" / method / f"{task}@{length}.json"


def run_cell(lm, checkpoint: str, task: str, length: int, samples: int, cache: Path | None) -> list[dict]:
    """One (model, task, length) cell through lm_eval.simple_evaluate: its samples, each with its response, score
    and prompt length in tokens."""
    import lm_eval

    started = time.perf_counter()
    cached = 0
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        database = Path(f"{cache}_rank0.db")  # lm-eval's name for rank 0's cache
        if database.exists():
            with sqlite3.connect(database) as connection:
                cached = connection.execute("SELECT count(*) FROM unnamed").fetchone()[0]
    result = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=samples, log_samples=True,
                                     use_cache=None if cache is None else str(cache),
                                     metadata={"pretrained": checkpoint, "max_seq_lengths": [length]})
    seconds = time.perf_counter() - started
    [logged] = result["samples"].values()
    tokenizer = lm.tokenizer if hasattr(lm, "tokenizer") else None
    rows = []
    for sample in sorted(logged, key=lambda s: s["doc_id"]):
        prompt = sample["arguments"][0][0] if sample["arguments"] else ""
        rows.append({"doc_id": sample["doc_id"], "target": sample["target"], "response": sample["resps"][0][0],
                     "score": float(sample[str(length)]),
                     "prompt_tokens": len(tokenizer.encode(prompt)) if tokenizer is not None else None})
    return [{"seconds": seconds, "from_cache": cached, "samples": rows}]


def built_task(checkpoint: str, task: str, length: int):
    """The task as lm_eval.simple_evaluate builds it: its seeds, then the task from the checkpoint's tokenizer (so
    its samples are the ones a cell answered)."""
    import random

    import numpy as np
    import torch
    from lm_eval.tasks import TaskManager, get_task_dict

    random.seed(0), np.random.seed(1234), torch.manual_seed(1234)  # simple_evaluate's seeds
    return get_task_dict([task], TaskManager(metadata={"pretrained": checkpoint, "max_seq_lengths": [length]}))[task]


def needle_distances(checkpoint: str, task: str, length: int, samples: int) -> dict[int, int]:
    """doc_id -> tokens from the needle (the first place its answer appears) to the end of the prompt, for the first
    `samples` samples of a needle task, generated again (built_task) to read where each needle stands."""
    built = built_task(checkpoint, task, length)
    docs = built.test_docs() if built.has_test_docs() else built.validation_docs()
    tokenizer = load_tokenizer(checkpoint)
    found = {}
    for doc_id, doc in enumerate(docs):
        if doc_id >= samples:
            break
        text, answer = built.doc_to_text(doc), doc["outputs"][0]
        where = text.find(answer)
        if where >= 0:
            found[doc_id] = {"answer": answer, "needle_back": len(tokenizer.encode(text[where:])),
                             "numbers": set(re.findall(r"\d+", text))}
    return found


def response_value(response: str, answer: str, numbers: set[str]) -> str | None:
    """What a needle sample's response gives for a numeric answer: "answer" (it holds the answer), "held" (its first
    number is one the prompt holds, another needle's value say: the model read the haystack's needles but not which
    one was asked), "invented" (a number the prompt does not hold), "none" (no number); None for an answer that is
    not a number (the report says nothing of it)."""
    if not answer.isdigit():
        return None
    if answer in response:  # RULER's own match, as the score reads it
        return "answer"
    first = first_number(response)
    return "none" if first is None else "held" if first in numbers else "invented"


def forced_path(out: Path, method: str, task: str, length: int, cue: str = "question") -> Path:
    return out / ("forced" if cue == "question" else f"forced-{cue}") / method / f"{task}@{length}.json"


def needle_cue(prompt: str, answer: str) -> str:
    """The needle's own words before its answer: from the sentence boundary before the answer's first place in the
    prompt up to it ("One of the special magic numbers for X is:")."""
    where = prompt.find(answer)
    if where < 0:
        raise ConfigError(f"the answer {answer!r} is not in the prompt: no needle to take the words of")
    start = max(prompt.rfind(mark, 0, where) for mark in (". ", ".\n", "\n"))
    return prompt[start + 1 if start >= 0 else 0:where].strip()


def control_answer(answer: str, prompt: str, seed: int) -> str:
    """An answer of the same shape (each digit a random digit, each letter a random letter of its case, the rest
    kept) that the prompt does not hold: what the model is scored on when the needle cannot help."""
    import random

    draw = random.Random(seed)
    while True:
        control = "".join(draw.choice("0123456789") if c.isdigit() else
                          draw.choice("abcdefghijklmnopqrstuvwxyz") if c.islower() else
                          draw.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") if c.isupper() else c for c in answer)
        if control != answer and control not in prompt:
            return control


def forced_answers(lm, checkpoint: str, task: str, length: int, samples: int, path: Path,
                   cue: str = "question", method: str = NONE) -> dict:
    """Each sample's answer teacher-forced after its prompt (the prompt the cell's model was given): whether every
    answer token is the model's most likely token given the prompt and the answer tokens before it, the answer's
    log-probability, and that of a control answer of the same shape found nowhere in the prompt (control_answer).
    The gain, answer minus control, is the needle's own same-weights use: above 0 when the model reads the needle,
    however badly it generates. cue "needle": the prompt is followed by the needle's own words before its answer
    (needle_cue), so that the answer is a verbatim copy, as a copied passage is for use, rather than an answer to a
    question worded otherwise. Rows are written as they come (path), so an interrupted run continues."""
    built = built_task(checkpoint, task, length)
    built.build_all_requests(limit=samples)
    record = json.loads(path.read_text()) if path.exists() else {"method": method, "task": task, "length": length,
                                                                   "cue": cue, "samples": []}
    done = {row["doc_id"] for row in record["samples"]}
    started = time.perf_counter()
    for instance in sorted(built.instances, key=lambda one: one.doc_id):
        if instance.doc_id in done:
            continue
        answers = instance.doc["outputs"]
        if len(answers) != 1:
            raise ConfigError(f"--forced scores tasks with one answer per sample (the niah tasks); {task}'s sample "
                              f"{instance.doc_id} has {len(answers)}")
        prompt, delimiter = instance.args[0], built.config.target_delimiter
        if cue == "needle":
            prompt = prompt + delimiter + needle_cue(instance.doc["input"], answers[0])
        control = control_answer(answers[0], prompt, instance.doc_id)
        context, continuation = lm._encode_pair(prompt, delimiter + answers[0])
        _, control_tokens = lm._encode_pair(prompt, delimiter + control)
        (logprob, greedy), (control_logprob, _) = lm.score_continuations(context, [continuation, control_tokens])
        record["samples"].append({"doc_id": instance.doc_id, "answer": answers[0], "greedy": greedy,
                                  "logprob": logprob, "control": control, "control_logprob": control_logprob,
                                  "gain": logprob - control_logprob, "answer_tokens": len(continuation),
                                  "control_tokens": len(control_tokens), "prompt_tokens": len(context)})
        record["seconds"] = record.get("seconds", 0.0) + time.perf_counter() - started
        started = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(results_json(record))
    return record


def annotate_needles(out: Path, checkpoint: str) -> None:
    """Add to each needle cell's samples how far back its needle stands (needle_distances) and what its response
    gives (response_value), once: the samples are the same for every method, so each (task, length) is generated
    once, and a sample whose answer differs from the cell's target is refused rather than annotated."""
    paths = sorted((out / "cells").glob("*/niah_*@*.json")) + sorted(out.glob("forced*/*/niah_*@*.json"))
    pending = {path: json.loads(path.read_text()) for path in paths}
    pending = {path: cell for path, cell in pending.items()
               if cell["samples"] and not all("needle_back" in sample and ("value" in sample or "response" not in
                                                                            sample) for sample in cell["samples"])}
    wanted: dict[tuple[str, int], int] = {}
    for cell in pending.values():
        key = (cell["task"], cell["length"])
        wanted[key] = max(wanted.get(key, 0), max(s["doc_id"] for s in cell["samples"]) + 1)
    generated = {key: needle_distances(checkpoint, *key, count) for key, count in wanted.items()}
    for path, cell in pending.items():
        for sample in cell["samples"]:
            found = generated[(cell["task"], cell["length"])].get(sample["doc_id"])
            expected = sample["answer"] if "answer" in sample else sample["target"][0]
            if found is None or found["answer"] != expected:
                raise ConfigError(f"{path}: sample {sample['doc_id']}'s needle (answer {expected!r}) could not be "
                                  "found again; the samples were generated otherwise")
            sample["needle_back"] = found["needle_back"]
            if "response" in sample:
                sample["value"] = response_value(sample["response"], expected, found["numbers"])
        path.write_text(results_json(cell))


def hf_model(folder: str, max_length: int, dtype: str):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=folder, max_length=max_length, dtype=dtype, device="cpu", batch_size=1)


def yarn_folder(folder: Path, factor: float, trained: int) -> Path:
    """A copy of the hf folder whose config sets YaRN with `factor` (transformers' rope_scaling)."""
    target = folder.with_name(folder.name + f"-yarn{factor:g}")
    if not target.exists():
        shutil.copytree(folder, target)
        config = json.loads((target / "config.json").read_text())
        scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained}
        if isinstance(config.get("rope_parameters"), dict):  # transformers 5 names it rope_parameters
            config["rope_parameters"] = {**config["rope_parameters"], **scaling}
        else:
            config["rope_scaling"] = scaling
        (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.ruler", __doc__)
    add_checkpoint(parser, "a checkpoint with its tokenizer (required)")
    parser.add_argument("--methods", default=NONE, help="inference-time methods (none: as trained)")
    parser.add_argument("--tasks", default=TASKS, help="lm-eval task names (RULER's synthetic ones)")
    parser.add_argument("--lengths", default="4096,8192,16384", help="RULER's max_seq_lengths, one cell each")
    parser.add_argument("--set-for", type=int, default=0,
                        help="the length every method is set for (default: the longest of --lengths)")
    parser.add_argument("--samples", type=int, default=20, help="samples per cell (the task's first)")
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32")
    parser.add_argument("--parity", help="a transformers folder of the same weights (scripts.export_hf): run the "
                                         "cells through lm-eval's hf model as well and compare the responses")
    parser.add_argument("--parity-yarn", action="store_true",
                        help="with --parity: also YaRN, pelab's method against the hf folder's rope_scaling")
    parser.add_argument("--use-results", type=Path,
                        help="experiments.method_grid's results.json: the report's rank correlation of RULER at the "
                             "longest length with same-weights use")
    parser.add_argument("--forced", action="store_true",
                        help="instead of the cells: each needle sample's answer teacher-forced after its prompt "
                             "(OUT/forced), to tell reading the needle from generating the answer")
    parser.add_argument("--cue", choices=("question", "needle"), default="question",
                        help="with --forced: the answer after the task's own question (question), or after the "
                             "question and the needle's own words before its answer (needle: a verbatim copy, "
                             "OUT/forced-needle)")
    parser.add_argument("--report-only", action="store_true", help="run nothing: write the report from OUT/cells")
    parser.add_argument("--minutes", type=float, default=600.0, help="start no new cell after this many minutes")
    add_out(parser, "output folder (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()
    args = parse(build_parser(), argv, "checkpoint", "out")
    if args.report_only:
        annotate_needles(args.out, args.checkpoint)
        write_report(args.out, args.use_results, trained=trained_length(args.checkpoint))
        return 0
    from infer.harness import PelabLM  # an optional extra: make ruler-deps

    trained = trained_length(args.checkpoint)
    lengths = sorted(int(item) for item in comma_list(args.lengths))
    set_for = args.set_for or max(lengths)
    methods = check_methods(comma_list(args.methods))
    if args.samples < 1:
        raise ConfigError("--samples must be at least 1")
    started = time.perf_counter()
    deadline = started + 60 * args.minutes
    models: list[tuple[str, Any]] = [(m, lambda m=m: PelabLM(args.checkpoint, method=m, length=set_for,
                                                            max_length=max(set_for, max(lengths)), dtype=args.dtype))
                                     for m in methods]
    if args.parity:
        folder = Path(args.parity)
        models.append(("hf", lambda: hf_model(str(folder), max(set_for, max(lengths)), args.dtype)))
        if args.parity_yarn:
            factor = set_for / trained
            models += [("yarn", lambda: PelabLM(args.checkpoint, method="yarn", length=set_for,
                                               max_length=max(set_for, max(lengths)), dtype=args.dtype)),
                       ("hf-yarn", lambda: hf_model(str(yarn_folder(folder, factor, trained)),
                                                    max(set_for, max(lengths)), args.dtype))]
    if args.forced and args.parity:
        raise ConfigError("--forced scores pelab's methods; run --parity separately")
    for name, build in dict(models).items():
        lm = None
        for task in comma_list(args.tasks):
            for length in lengths:
                if time.perf_counter() > deadline:
                    continue
                if args.forced:
                    lm = lm or build()
                    path = forced_path(args.out, name, task, length, args.cue)
                    record = forced_answers(lm, args.checkpoint, task, length, args.samples, path, args.cue, name)
                    record.update(set_for=set_for)
                    path.write_text(results_json(record))
                    print(f"{name} {task}@{length} teacher-forced: {sum(s['greedy'] for s in record['samples'])} "
                          f"of {len(record['samples'])}", flush=True)
                    continue
                path = cell_path(args.out, name, task, length)
                if path.exists():
                    continue
                lm = lm or build()
                [cell] = run_cell(lm, args.checkpoint, task, length, args.samples,
                                  args.out / "cache" / name / f"{task}@{length}")
                precision = args.dtype if not hasattr(lm, "amp") else "float32" if lm.amp is None else "bfloat16"
                cell.update(method=name, task=task, length=length, set_for=set_for, dtype=precision)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(results_json(cell))
                print(f"{name} {task}@{length}: {sum(s['score'] == 1 for s in cell['samples'])} of "
                      f"{len(cell['samples'])} ({cell['seconds']:.0f} s)", flush=True)
    annotate_needles(args.out, args.checkpoint)
    write_report(args.out, args.use_results, trained=trained)
    return 0


if __name__ == "__main__":
    sys.exit(main())
