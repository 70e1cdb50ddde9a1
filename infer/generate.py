"""Text generation from a Transformer: sampling (with optional repetition controls), KV-cached decoding (optionally
compiled), streaming decoded text, and chat turns fitted to the context. Used by scripts.generate, eval.passkey and
scripts.bench."""
from __future__ import annotations

import sys
import weakref
from typing import Iterator, TextIO

import torch

from data.tokenizer import ENDOFTEXT, IM_END
from errors import ConfigError
from infer.repetition import repetition_processors
from model.kv_cache import KVCache, StaticKVCache
from model.transformer import Transformer


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (batch,) from last-position logits (batch, vocab). temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth_largest = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass (the first always stays).
        drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


STATIC_CACHE_GRANULE = 128  # static caches are sized in multiples of this
_COMPILED_STEPS: "weakref.WeakKeyDictionary[Transformer, torch.nn.Module]" = weakref.WeakKeyDictionary()


def compiled_step(model: Transformer) -> torch.nn.Module:
    """`model` compiled for one-token steps over a StaticKVCache (compiled once per model, then reused)."""
    if model not in _COMPILED_STEPS:
        _COMPILED_STEPS[model] = torch.compile(model, dynamic=False)
    return _COMPILED_STEPS[model]


# no_grad, not inference_mode: under inference_mode autocast keeps no cast of the weights, so each decoding step cast
# every weight to bf16 again (60% of a step's time on SmolLM2); under no_grad it casts them once per call.
@torch.no_grad()
def generate_tokens(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_ids: tuple[int, ...] = (),
    compile: bool = False,
    repetition_penalty: float = 1.0,
    no_repeat_ngram: int = 0,
) -> Iterator[int]:
    """Yield sampled token ids one by one: one forward over the prompt, then one cached step per token.

    compile: run the one-token steps through torch.compile over a static-shape cache (the prompt still runs
    eagerly); the first call pays the compilation (seconds), later calls on the same model reuse it.
    repetition_penalty, no_repeat_ngram: see infer/repetition.py; applied to each step's logits (over the prompt and
    the tokens generated so far) before temperature, top-k and top-p.
    """
    if not prompt_ids:
        raise ConfigError("the prompt is empty: give at least one token")
    processors = repetition_processors(repetition_penalty, no_repeat_ngram)
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    max_len = len(prompt_ids) + max_new_tokens
    if compile:  # a few cache sizes, so later calls (chat turns) reuse the compiled step
        max_len = -(-max_len // STATIC_CACHE_GRANULE) * STATIC_CACHE_GRANULE
    cache = (StaticKVCache if compile else KVCache).for_model(model.config, batch_size=1, max_len=max_len)
    step = compiled_step(model) if compile else model
    tokens = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    context = torch.zeros((1, len(prompt_ids) + max_new_tokens), dtype=torch.long, device=device)  # (1, time)
    context[:, : len(prompt_ids)] = tokens
    filled = len(prompt_ids)
    forward = None  # the prompt: the model itself, eagerly
    for _ in range(max_new_tokens):
        # the prompt's forward keeps the last row's logits only (a 32k prompt's would be 6 GB)
        logits, _ = model(tokens, kv_cache=cache, logits_to_keep=1) if forward is None else forward(
            tokens, kv_cache=cache)
        forward = step
        next_logits = logits[:, -1]  # (1, vocab)
        for process in processors:
            next_logits = process(context[:, :filled], next_logits.float())
        next_token = sample_next(next_logits, temperature, top_k, top_p, generator)
        token_id = int(next_token)
        yield token_id
        if token_id in stop_ids:
            return
        tokens = next_token.view(1, 1)
        context[:, filled] = next_token
        filled += 1


class StreamPrinter:
    """Prints decoded text as tokens arrive, holding back bytes that do not yet form whole UTF-8 characters."""

    def __init__(self, tokenizer, stream: TextIO | None = None) -> None:
        self.tokenizer = tokenizer
        self.stream = stream or sys.stdout  # looked up when printing starts, so a redirected stdout is used
        self.ids: list[int] = []
        self.printed = 0

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            self.stream.write(text[self.printed :])
            self.stream.flush()
            self.printed = len(text)

    def finish(self) -> str:
        """Write whatever is still held back (an incomplete character shows as U+FFFD); return the full text."""
        text = self.tokenizer.decode(self.ids)
        self.stream.write(text[self.printed :])
        self.stream.flush()
        self.printed = len(text)
        return text

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)


def fit_conversation(tokenizer, messages: list[dict], budget: int) -> tuple[list[int], list[dict]]:
    """Prompt ids for the conversation (with the assistant header), dropping the oldest turns to fit `budget`."""
    kept = list(messages)
    while True:
        ids = tokenizer.apply_chat_template(kept, tokenize=True, add_generation_prompt=True, return_dict=False)
        if len(ids) <= budget:
            return list(ids), kept
        droppable = [i for i, message in enumerate(kept[:-1]) if message["role"] != "system"]
        if not droppable:
            raise ConfigError(
                f"the last message alone takes {len(ids)} tokens, more than the {budget} the context allows "
                "after --max-new-tokens; shorten it or lower --max-new-tokens"
            )
        del kept[droppable[0]]


def chat_reply(model: Transformer, tokenizer, messages: list[dict], max_new_tokens: int, stream: TextIO | None = None,
               **sampling) -> tuple[str, bool]:
    """Stream the assistant's reply to `messages`; returns (reply, whether it ended with <|im_end|>)."""
    budget = model.config.max_seq_len - max_new_tokens
    if budget <= 0:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} leaves no room in the {model.config.max_seq_len}-token context")
    prompt_ids, _ = fit_conversation(tokenizer, messages, budget)
    stops = (tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT))
    printer = StreamPrinter(tokenizer, stream)
    ended = False
    for token_id in generate_tokens(model, prompt_ids, max_new_tokens, stop_ids=stops, **sampling):
        if token_id in stops:
            ended = token_id == stops[0]
            break
        printer.add(token_id)
    return printer.finish(), ended
