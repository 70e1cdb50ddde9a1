"""Parity of an imported GGUF model with transformers' own model of the same file: logits and mean NLL on real
text (the standard library's first files), plain and under the RoPE scalings both implement, greedy generation
token for token, and what bfloat16 costs on this CPU.

Each scaling is set the same way on both sides: factor 4 with original length 512 (transformers' dynamic NTK reads
it as max_position_embeddings), so on 2,048 tokens every scaling is in its regime, dynamic NTK included. On a model
with layer types (Gemma 3) transformers sets a scaling on its global layers only, as the import does; dynamic NTK is
left out there (how transformers' Gemma 3 grows it per layer type was not compared with ours).

The text starts as the tokenizer starts a text: with its BOS token where it adds one (Gemma's), else with none.
"""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from data.sources import stdlib_files
from data.tokenizer import leading_ids
from infer.gguf import transformers_model, transformers_tokenizer
from model.transformer import Transformer

GREEDY_PROMPT, GREEDY_TOKENS = 64, 64  # greedy generation compared token for token
SCALINGS: list[dict | None] = [None, {"rope_type": "linear", "factor": 4.0},
                               {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 512},
                               {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}]


def stdlib_ids(tokenizer, tokens: int) -> torch.Tensor:
    """(1, tokens + 1) ids of the standard library's files, in their sorted order, concatenated, after the ids the
    tokenizer starts a text with."""
    ids: list[int] = leading_ids(tokenizer)
    for path in stdlib_files():
        ids += tokenizer.encode(path.read_text(errors="replace") + "\n\n", add_special_tokens=False)
        if len(ids) > tokens:
            break
    return torch.tensor([ids[: tokens + 1]])


def with_scaling(hf_model, scaling: dict | None):
    """transformers' model under `scaling` (a shallow copy sharing its layers, with a rotary embedding of its own)."""
    if scaling is None:
        return hf_model
    config = copy.deepcopy(hf_model.config)
    layered = "full_attention" in config.rope_parameters  # per layer type (Gemma 3): the global layers are scaled
    current = config.rope_parameters["full_attention"] if layered else config.rope_parameters
    params = {"rope_theta": current["rope_theta"], **scaling}
    if scaling["rope_type"] == "dynamic":  # transformers' dynamic NTK: the original length is max_position_embeddings
        config.max_position_embeddings = params.pop("original_max_position_embeddings")
    if layered:
        config.rope_parameters = {**config.rope_parameters, "full_attention": params}
    else:
        config.rope_parameters = params
    # shallow copies with module tables of their own: a module's setattr writes into its _modules, which a shallow
    # copy would share with the original (which would then be scaled too)
    view = copy.copy(hf_model)
    view._modules = dict(hf_model._modules)
    view.model = copy.copy(hf_model.model)
    view.model._modules = dict(hf_model.model._modules)
    view.model.rotary_emb = type(hf_model.model.rotary_emb)(config=config)
    return view


def scalings_for(hf_model) -> list[dict | None]:
    """SCALINGS, less dynamic NTK on a model with layer types (see the module's docstring)."""
    layered = "full_attention" in hf_model.config.rope_parameters
    return [s for s in SCALINGS if not (layered and s is not None and s["rope_type"] == "dynamic")]


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@torch.inference_mode()
def greedy_agreement(model: Transformer, hf_model, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy continuations of `prompt`: ours through its KV cache against transformers' generate without its cache
    (each token the argmax of its full forward) and with it; how many of `new_tokens` agree before the first
    difference."""
    from infer.generate import generate_tokens

    ours = list(generate_tokens(model, prompt, new_tokens, temperature=0.0))
    theirs = {cached: hf_model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                        do_sample=False, eos_token_id=None, pad_token_id=0,
                                        use_cache=cached)[0, len(prompt):].tolist() for cached in (False, True)}
    return {"prompt_tokens": len(prompt), "new_tokens": new_tokens, "identical_prefix": agreeing_prefix(ours, theirs[False]),
            "identical": ours == theirs[False], "ours": ours, "transformers": theirs[False],
            "transformers_cached": theirs[True], "cached_identical_prefix": agreeing_prefix(ours, theirs[True])}


def greedy_words(prefix: int) -> str:
    return "identical" if prefix == GREEDY_TOKENS else f"first difference at token {prefix + 1}"


def nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


@torch.inference_mode()
def compare(model: Transformer, hf_model, ids: torch.Tensor, scaling: dict | None) -> dict[str, Any]:
    """Max |logit difference| and the mean NLLs of both models on ids (float32), under `scaling`."""
    ours = model.with_rope_scaling(scaling) if scaling is not None else model
    inputs, targets = ids[:, :-1], ids[:, 1:]
    started = time.perf_counter()
    our_logits = ours(inputs)[0].float()
    our_seconds = time.perf_counter() - started
    started = time.perf_counter()
    their_logits = with_scaling(hf_model, scaling)(inputs).logits.float()
    their_seconds = time.perf_counter() - started
    our_nll, their_nll = nll(our_logits, targets), nll(their_logits, targets)
    return {"scaling": (scaling or {"rope_type": "none"})["rope_type"], "settings": scaling,
            "max_abs_logit_diff": (our_logits - their_logits).abs().max().item(),
            "nll_ours": our_nll, "nll_transformers": their_nll, "nll_diff": our_nll - their_nll,
            "seconds_ours": our_seconds, "seconds_transformers": their_seconds}


@torch.inference_mode()
def bfloat16_cost(model: Transformer, ids: torch.Tensor) -> dict[str, float]:
    """Our model under bfloat16 autocast against itself in float32: the NLL and logit differences."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    exact = model(inputs)[0].float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(inputs)[0].float()
    return {"nll_float32": nll(exact, targets), "nll_bfloat16": nll(low, targets),
            "nll_diff": nll(low, targets) - nll(exact, targets), "max_abs_logit_diff": (low - exact).abs().max().item()}


def format_table(rows: list[dict[str, Any]], tokens: int) -> str:
    lines = [f"Parity with transformers on {tokens:,} tokens of the standard library (float32):", "",
             "| scaling | max abs logit diff | mean NLL ours | mean NLL transformers | NLL diff |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {row['scaling']} | {row['max_abs_logit_diff']:.2e} | {row['nll_ours']:.6f} | "
              f"{row['nll_transformers']:.6f} | {row['nll_diff']:+.1e} |" for row in rows]
    return "\n".join(lines)


def parity_report(model: Transformer, gguf_file: Path, tokens: int) -> dict[str, Any]:
    """The parity of `model` (imported from gguf_file) with transformers' model of that file, as a dict with a
    markdown `table`; scalings as SCALINGS; bfloat16's cost on the same tokens."""
    model = model.eval()
    started = time.perf_counter()
    hf_model = transformers_model(gguf_file)
    load_seconds = time.perf_counter() - started
    tokenizer = transformers_tokenizer(gguf_file)
    ids = stdlib_ids(tokenizer, tokens)
    rows = [compare(model, hf_model, ids, scaling) for scaling in scalings_for(hf_model)]
    greedy = greedy_agreement(model, hf_model, ids[0, :GREEDY_PROMPT].tolist(), GREEDY_TOKENS)
    bf16 = bfloat16_cost(model, ids)
    table = format_table(rows, ids.shape[1] - 1) + (
        f"\n\nGreedy generation, {GREEDY_TOKENS} tokens after the first {GREEDY_PROMPT} of the text, ours (KV cache) "
        f"against transformers' generate without its cache: {greedy_words(greedy['identical_prefix'])}; against its "
        f"cached generate: {greedy_words(greedy['cached_identical_prefix'])}"
        f"\n\nbfloat16 autocast (ours against ours in float32): mean NLL {bf16['nll_bfloat16']:.4f} against "
        f"{bf16['nll_float32']:.4f} ({bf16['nll_diff']:+.4f} nats), max abs logit diff {bf16['max_abs_logit_diff']:.3f}")
    return {"gguf": str(gguf_file), "tokens": ids.shape[1] - 1, "text": "the standard library's .py files in sorted "
            "order, concatenated", "starts_with": ids[0, :len(leading_ids(tokenizer))].tolist(),
            "transformers_load_seconds": load_seconds, "rows": rows, "greedy": greedy, "bfloat16": bf16,
            "worst_logit_diff": max(row["max_abs_logit_diff"] for row in rows),
            "worst_nll_diff": max(math.fabs(row["nll_diff"]) for row in rows), "table": table}
