"""Generate text from a checkpoint, streaming tokens as they are sampled (KV-cached decoding).

    python -m scripts.generate --checkpoint runs/demo --prompt "def " --max-new-tokens 200
    python -m scripts.generate --checkpoint runs/demo --prompt "import os" --temperature 0   # greedy
    python -m scripts.generate --checkpoint runs/demo --prompt "class " --top-p 0.9 --seed 1
    python -m scripts.generate --checkpoint runs/demo --prompt "def " --dtype bfloat16 --compile   # fastest
    python -m scripts.generate --checkpoint runs/demo --prompt "def " --max-new-tokens 900 \
        --rope-scaling yarn --rope-factor 4                  # generate past the trained context
    python -m scripts.generate --checkpoint runs/sft_stdlib --chat          # interactive multi-turn chat
    python -m scripts.generate --checkpoint runs/sft_stdlib --chat --prompt "Write the function ..."

Chat mode renders the conversation with the tokenizer's ChatML template, streams the reply until
<|im_end|>, and drops the oldest turns (keeping any system message) so that the prompt plus
--max-new-tokens stays within the model's context (model.max_seq_len).
"""
from __future__ import annotations

import argparse
import sys
import weakref
from typing import Iterator, TextIO

import torch

from data.tokenizer import ENDOFTEXT, IM_END, load_tokenizer
from errors import ConfigError, cli_command
from model.checkpoint import load_model
from model.kv_cache import KVCache, StaticKVCache
from model.runtime import autocast_dtype, resolve_device
from model.transformer import Transformer
from scripts.rope_args import add_rope_scaling_args, apply_rope_scaling_args


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


@torch.inference_mode()
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
) -> Iterator[int]:
    """Yield sampled token ids one by one: one forward over the prompt, then one cached step per token.

    compile: run the one-token steps through torch.compile over a static-shape cache (the prompt still runs
    eagerly); the first call pays the compilation (seconds), later calls on the same model reuse it.
    """
    if not prompt_ids:
        raise ConfigError("the prompt is empty: give at least one token")
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
    forward = model  # the prompt, eagerly
    for _ in range(max_new_tokens):
        logits, _ = forward(tokens, kv_cache=cache)
        forward = step
        next_token = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
        token_id = int(next_token)
        yield token_id
        if token_id in stop_ids:
            return
        tokens = next_token.view(1, 1)


class StreamPrinter:
    """Prints decoded text as tokens arrive, holding back bytes that do not yet form whole UTF-8 characters."""

    def __init__(self, tokenizer, stream: TextIO = sys.stdout) -> None:
        self.tokenizer = tokenizer
        self.stream = stream
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


def chat_reply(model: Transformer, tokenizer, messages: list[dict], max_new_tokens: int, stream: TextIO = sys.stdout,
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


def run_chat(model: Transformer, tokenizer, args: argparse.Namespace) -> None:
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    compile=args.compile)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:  # one turn, for scripts and tests
        chat_reply(model, tokenizer, [*messages, {"role": "user", "content": args.prompt}], args.max_new_tokens,
                   **sampling)
        sys.stdout.write("\n")
        return
    print("chat: an empty line or Ctrl-D ends, /reset starts over", file=sys.stderr)
    while True:
        try:
            text = input("user> ").strip()
        except EOFError:
            break
        if not text:
            break
        if text == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": text})
        sys.stdout.write("assistant> ")
        reply, _ = chat_reply(model, tokenizer, messages, args.max_new_tokens, **sampling)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder (written by train.pretrain)")
    parser.add_argument("--prompt", help="text to continue (with --chat: a single user message)")
    parser.add_argument("--chat", action="store_true", help="chat with the ChatML template (an SFT checkpoint)")
    parser.add_argument("--system", help="with --chat: a system message")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy decoding")
    parser.add_argument("--top-k", type=int, default=0, help="keep only the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | mps")
    parser.add_argument("--dtype", default="float32",
                        help="float32 (default) | bfloat16 | auto: bfloat16 converts the weights (halves the memory "
                             "read per token)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the one-token decoding step (static-shape KV cache; compiles once, "
                             "seconds); fastest with --dtype bfloat16")
    parser.add_argument("--extrapolate", action="store_true", help="allow a prompt longer than the trained context")
    add_rope_scaling_args(parser)
    args = parser.parse_args(argv)
    if args.prompt is None and not args.chat:
        parser.error("--prompt is required (or --chat for an interactive chat)")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0 or args.max_new_tokens <= 0:
        parser.error("need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0 and --max-new-tokens > 0")
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device)
    apply_rope_scaling_args(model, args)
    tokenizer = load_tokenizer(args.checkpoint)
    # Inference converts the weights rather than autocasting them (autocast would re-cast every weight per token).
    dtype = autocast_dtype(device, args.dtype)
    if dtype is not None:
        model.to(dtype)
    if args.chat:
        run_chat(model, tokenizer, args)
        return 0
    prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False)
    if len(prompt_ids) > model.config.max_seq_len and model.config.rope_scaling is None and not args.extrapolate:
        print(
            f"error: the prompt has {len(prompt_ids)} tokens, more than the {model.config.max_seq_len} the model was "
            "trained on; shorten it, pass --rope-scaling yarn --rope-factor S (RoPE), or --extrapolate to run anyway",
            file=sys.stderr,
        )
        return 2
    printer = StreamPrinter(tokenizer)
    sys.stdout.write(args.prompt)
    eos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    tokens = generate_tokens(
        model,
        prompt_ids,
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        stop_ids=(eos,),
        compile=args.compile,
    )
    for token_id in tokens:
        if token_id == eos:
            break
        printer.add(token_id)
    printer.finish()
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
