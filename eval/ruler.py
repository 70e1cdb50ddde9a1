"""RULER's synthetic tasks on one checkpoint through lm-evaluation-harness (an optional extra: make ruler-deps): one
task at one length through lm_eval.simple_evaluate, on pelab's model "pelab" (infer/harness.py) under a method or on
lm-eval's own hf model of an exported folder, each sample kept with what a report reads of it.

A sample: its target, response, RULER's score (string_match_all) and prompt tokens; for a needle task (niah_*), how
far back its needle stands (tokens from the first place its answer appears in the prompt to the prompt's end) and
what its response gives (response_value). lm-eval's response cache (`cache`) keeps each response as it is
generated, so that an interrupted run continues. experiments.ruler runs a grid of them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from data.tokenizer import load_tokenizer


def first_number(response: str) -> str | None:
    found = re.search(r"\d+", response)
    return found.group() if found else None


def response_value(response: str, answer: str, numbers: set[str]) -> str | None:
    """What a needle sample's response gives for a numeric answer: "answer" (it holds the answer), "held" (its first
    number is one the prompt holds, another needle's value say: the model read the haystack's needles but not which
    one was asked), "invented" (a number the prompt does not hold), "none" (no number); None for an answer that is
    not a number (a report says nothing of it)."""
    if not answer.isdigit():
        return None
    if answer in response:  # RULER's own match, as the score reads it
        return "answer"
    first = first_number(response)
    return "none" if first is None else "held" if first in numbers else "invented"


def sample_row(sample: dict, task: str, length: int, tokenizer: Any, prompt_tokenizer: Any) -> dict:
    """One sample logged by simple_evaluate (log_samples) as a record keeps it; `tokenizer` (the checkpoint's) counts
    how far back the needle stands, `prompt_tokenizer` (the model's) the prompt's tokens."""
    prompt = sample["arguments"][0][0] if sample["arguments"] else ""
    row = {"doc_id": sample["doc_id"], "target": sample["target"], "response": sample["resps"][0][0],
           "score": float(sample[str(length)]), "prompt_tokens": len(prompt_tokenizer.encode(prompt))}
    text, answers = sample["doc"].get("input", ""), sample["doc"].get("outputs", [])
    if task.startswith("niah") and answers and answers[0] in text:
        row["needle_back"] = len(tokenizer.encode(text[text.find(answers[0]):]))
        row["value"] = response_value(row["response"], answers[0], set(re.findall(r"\d+", text)))
    return row


def yarn_folder(folder: Path, factor: float, trained: int, work: Path) -> Path:
    """The hf folder with YaRN at `factor` in its config (transformers' rope_parameters, rope_scaling before
    transformers 5): WORK/NAME-yarnF, its other files links to the folder's."""
    folder = folder.resolve()
    target = work / f"{folder.name}-yarn{factor:g}"
    if not target.exists():
        staging = work / f".{target.name}.{os.getpid()}"
        staging.mkdir(parents=True)
        for item in folder.iterdir():
            if item.name != "config.json":
                (staging / item.name).symlink_to(item)
        config = json.loads((folder / "config.json").read_text())
        scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained}
        if isinstance(config.get("rope_parameters"), dict):
            config["rope_parameters"] = {**config["rope_parameters"], **scaling}
        else:
            config["rope_scaling"] = scaling
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        try:
            staging.rename(target)
        except OSError:  # another process made it first
            shutil.rmtree(staging)
    return target


def language_model(checkpoint: str, method: str, set_for: int, max_length: int, dtype: str, device: str,
                   hf_folder: str | None = None) -> tuple[Any, str]:
    """lm-eval's model and the precision it computes in: pelab's checkpoint under `method` set for `set_for` tokens,
    or (hf_folder) lm-eval's hf model on a transformers folder."""
    import torch

    if hf_folder is not None:
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=hf_folder, max_length=max_length, dtype=dtype, batch_size=1,
                    device="cuda" if torch.cuda.is_available() else "cpu"), dtype
    from infer.harness import PelabLM

    lm = PelabLM(checkpoint, method=method, length=set_for, max_length=max_length, dtype=dtype, device=device)
    return lm, "float32" if lm.amp is None else "bfloat16"


def run_task(lm: Any, checkpoint: str, task: str, length: int, samples: int, cache: Path, first: int = 0) -> dict:
    """The task's samples `first` to `first + samples - 1` at `length` tokens (generated from the checkpoint's
    tokenizer): each sample (sample_row, doc_id its index in the task), the seconds, and how many responses the
    cache held before (an earlier, interrupted run)."""
    import lm_eval

    cache.parent.mkdir(parents=True, exist_ok=True)
    database, cached = Path(f"{cache}_rank0.db"), 0  # lm-eval's name for rank 0's cache
    if database.exists():
        with sqlite3.connect(database) as connection:
            cached = connection.execute("SELECT count(*) FROM unnamed").fetchone()[0]
    started = time.perf_counter()
    # lm-eval takes the first `limit` samples, or those listed in `samples` (logged with their own index as doc_id)
    chosen = {"limit": samples} if not first else {"samples": {task: list(range(first, first + samples))}}
    result = lm_eval.simple_evaluate(model=lm, tasks=[task], log_samples=True, use_cache=str(cache),
                                     metadata={"pretrained": checkpoint, "max_seq_lengths": [length]}, **chosen)
    seconds = time.perf_counter() - started
    [logged] = result["samples"].values()
    tokenizer = load_tokenizer(checkpoint)
    return {"seconds": seconds, "from_cache": cached,
            "samples": [sample_row(sample, task, length, tokenizer, lm.tokenizer)
                        for sample in sorted(logged, key=lambda one: one["doc_id"])]}
