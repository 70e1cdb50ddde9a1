"""Generate text from a checkpoint, streaming tokens as they are sampled (KV-cached decoding).

    python -m scripts.generate --checkpoint runs/demo --prompt "def " --max-new-tokens 200
    python -m scripts.generate --checkpoint runs/demo --prompt "import os" --temperature 0   # greedy
    python -m scripts.generate --checkpoint runs/demo --prompt "class " --top-p 0.9 --seed 1
    python -m scripts.generate --checkpoint runs/demo --prompt "def " --dtype bfloat16 --compile   # fastest
    python -m scripts.generate --checkpoint runs/demo --prompt "def " --max-new-tokens 900 \
        --rope-scaling yarn --rope-factor 4                  # generate past the trained context
    python -m scripts.generate --checkpoint runs/sft_stdlib --chat          # interactive multi-turn chat
    python -m scripts.generate --checkpoint runs/sft_stdlib --chat --prompt "Write the function ..."
    python -m scripts.generate --checkpoint runs/demo --prompt "def " --temperature 0 --repetition-penalty 1.2 \
        --no-repeat-ngram 4                                  # discourage repeats (chat bans repeated 4-grams)

Chat mode renders the conversation with the tokenizer's ChatML template, streams the reply until
<|im_end|>, and drops the oldest turns (keeping any system message) so that the prompt plus
--max-new-tokens stays within the model's context (model.max_seq_len). --repetition-penalty and
--no-repeat-ngram (infer/repetition.py, as transformers defines them) act on the logits before temperature,
top-k and top-p, over the prompt and the reply so far; off by default, except that chat bans repeated 4-grams
(--no-repeat-ngram 0 turns that off).
"""
from __future__ import annotations

import argparse
import sys

from commands import add_checkpoint, add_device, command_parser, parse
from data.tokenizer import ENDOFTEXT
from errors import ConfigError, cli_command
from infer.generate import StreamPrinter, chat_reply, generate_tokens
from infer.repetition import check_no_repeat_ngram, check_repetition_penalty
from infer.rope_args import add_rope_scaling_args, load_for_inference
from model.runtime import autocast_dtype, configure_runtime
from model.transformer import Transformer

# Repetition controls (infer/repetition.py) when not given: off for plain continuation. In chat, no 4-gram twice:
# measured on the SFT demo (`make demo`, then configs/sft_stdlib.toml) over 11 prompts (7 held-out SFT questions),
# greedy and at temperature 0.8, against penalties 1.1-1.3 and 3-grams, alone and combined. Without controls 1 of 11
# greedy replies looped to the token limit ("the barrier of the barrier of ..."); with 4-grams banned every reply
# ended, with the highest similarity to the held-out reference answers in both modes. A repetition penalty also ended
# the loops but, sampled, made replies less like the references (0.25 against 0.31 at 1.2): code must repeat names.
PLAIN_REPETITION = {"repetition_penalty": 1.0, "no_repeat_ngram": 0}
CHAT_REPETITION = {"repetition_penalty": 1.0, "no_repeat_ngram": 4}


def defaults_shown(name: str) -> str:
    plain, chat = PLAIN_REPETITION[name], CHAT_REPETITION[name]
    return f"{plain:g}" if plain == chat else f"{plain:g}; with --chat {chat:g}"


def run_chat(model: Transformer, tokenizer, args: argparse.Namespace) -> None:
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    compile=args.compile, repetition_penalty=args.repetition_penalty,
                    no_repeat_ngram=args.no_repeat_ngram)
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
            kept = " (the system message is kept)" if args.system else ""
            print(f"chat: conversation reset; the next message starts a new one{kept}", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": text})
        sys.stdout.write("assistant> ")
        reply, _ = chat_reply(model, tokenizer, messages, args.max_new_tokens, **sampling)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.generate", __doc__)
    add_checkpoint(parser, "checkpoint folder (required)", required=True)
    parser.add_argument("--prompt", help="text to continue (with --chat: a single user message)")
    parser.add_argument("--chat", action="store_true", help="chat with the ChatML template (an SFT checkpoint)")
    parser.add_argument("--system", help="with --chat: a system message")
    parser.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy decoding")
    parser.add_argument("--top-k", type=int, default=0, help="keep only the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--repetition-penalty", type=float, default=None, metavar="P",
                        help="divide the positive logits of tokens already in the context by P (multiply negative "
                             "ones), before sampling; 1 = off (default: "
                             f"{defaults_shown('repetition_penalty')})")
    parser.add_argument("--no-repeat-ngram", type=int, default=None, metavar="N",
                        help="never generate an N-gram already in the context; 0 = off (default: "
                             f"{defaults_shown('no_repeat_ngram')})")
    add_device(parser)
    parser.add_argument("--dtype", default="float32",
                        help="float32 | bfloat16 | auto: bfloat16 converts the weights (halves the memory read per "
                             "token)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the one-token decoding step (static-shape KV cache; compiles once, "
                             "seconds); fastest with --dtype bfloat16")
    parser.add_argument("--extrapolate", action="store_true", help="allow a prompt longer than the trained context")
    add_rope_scaling_args(parser)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv)
    if args.prompt is None and not args.chat:
        raise ConfigError("--prompt is required (or --chat for an interactive chat)")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0 or args.max_new_tokens <= 0:
        raise ConfigError("need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0 and --max-new-tokens > 0")
    for name, default in (CHAT_REPETITION if args.chat else PLAIN_REPETITION).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    check_repetition_penalty(args.repetition_penalty)
    check_no_repeat_ngram(args.no_repeat_ngram)
    model, tokenizer, device = load_for_inference(args)
    # Inference converts the weights rather than autocasting them (autocast would re-cast every weight per token).
    dtype = autocast_dtype(device, args.dtype)
    if dtype is not None:
        model.to(dtype)
    if args.chat:
        run_chat(model, tokenizer, args)
        return 0
    prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False)
    total = len(prompt_ids) + args.max_new_tokens
    if total > model.config.max_seq_len and model.config.rope_scaling is None and not args.extrapolate \
            and not model.config.attention_methods:
        raise ConfigError(
            f"the prompt ({len(prompt_ids)} tokens) plus --max-new-tokens {args.max_new_tokens} is {total} tokens, more "
            f"than the {model.config.max_seq_len} the model was trained on; lower --max-new-tokens, shorten the "
            "prompt, pass --rope-scaling yarn --rope-factor S (RoPE), an --attention-method (e.g. selfextend), or "
            "--extrapolate to run past it anyway")
    if args.compile:
        print("compiling the decoding step (once; this can take tens of seconds)...", file=sys.stderr, flush=True)
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
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram=args.no_repeat_ngram,
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
