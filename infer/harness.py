"""pelab as a model that lm-evaluation-harness runs: its LM interface (loglikelihood, rolling loglikelihood and
generate_until with KV-cache decoding) over any checkpoint under any inference-time method.

    make ruler-deps
    python -m infer.harness --model pelab \\
        --model_args pretrained=runs/smollm2,method=yarn,length=16384 \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths":[16384]}' --limit 20 --output_path runs/ruler

This module registers the model "pelab" and hands its arguments to lm-eval's own command line, unchanged: every flag,
task name and results file is lm-eval's. Model arguments (--model_args, comma-separated key=value):

    pretrained   the checkpoint folder (also where RULER's tasks find the tokenizer that sizes their inputs)
    method       an inference-time method (model/methods/; default none: as trained), set for `length`
    length       the length the method is set for (a RoPE scaling's factor = length / L; default: max_length)
    max_length   the longest input + generation (default: length, or L); a longer prompt is cut from the left
                 to max_length - max_gen_toks with a warning, as lm-eval's hf model does
    dtype        auto (bfloat16 autocast where the CPU computes it natively) | bfloat16 | float32
    device       lm-eval's --device: cpu, cuda, cuda:N (its default cuda:0 falls back to the CPU where there is no
                 CUDA device, as its hf model does)

Greedy decoding (the only kind RULER asks for) stops at the tokenizer's end-of-text token or when the text generated
holds one of the request's stop strings; the returned text is cut as lm-eval's hf model cuts it
(lm_eval.models.utils.postprocess_generated_text).
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import torch
import torch.nn.functional as F

from errors import ConfigError

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as error:  # an optional extra, like the real model
    raise ConfigError(f"lm-evaluation-harness is not installed ({error}); run `make ruler-deps`") from error

from data.tokenizer import load_tokenizer
from infer.generate import generate_tokens
from model.checkpoint import load_model, trained_length
from model.kv_cache import KVCache
from model.methods import NONE, check_methods, method_spec
from model.runtime import autocast, autocast_dtype, resolve_device

log = logging.getLogger(__name__)


@register_model("pelab")
class PelabLM(TemplateLM):
    """A pelab checkpoint under one inference-time method, as lm-eval's LM."""

    def __init__(self, pretrained: str, method: str = NONE, length: int | None = None, max_length: int | None = None,
                 dtype: str = "auto", device: str = "cpu", batch_size: int | str = 1, **unknown: Any) -> None:
        super().__init__()
        if unknown:
            raise ConfigError(f"pelab model arguments: {sorted(unknown)} not known; give pretrained, method, length, "
                              "max_length, dtype or device")
        if dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(f"dtype is auto, bfloat16 or float32, not {dtype!r}")
        if str(device).startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default is cuda:0
            log.warning("device %s: no CUDA device here; running on the CPU", device)
            device = "cpu"
        self._device = resolve_device(device)
        self.trained = trained_length(pretrained)
        self._max_length = int(max_length) if max_length else int(length or self.trained)
        self.length = int(length) if length else self._max_length
        [self.method] = check_methods([method])
        self.amp = autocast_dtype(self._device, dtype)
        model = load_model(pretrained, self._device).eval()
        self.model = model.under(method_spec(self.method), self.length, self.trained)
        self.tokenizer = load_tokenizer(pretrained)
        self.pretrained = pretrained

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return 256

    @property
    def tokenizer_name(self) -> str:
        return str(self.pretrained)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        extra = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **extra)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    @torch.inference_mode()
    def _logprobs(self, tokens: list[int], scored: int) -> torch.Tensor:
        """Log-probabilities (scored, vocab) of the positions that predict the last `scored` tokens of `tokens`."""
        inputs = torch.tensor([tokens[:-1]], dtype=torch.long, device=self._device)
        with autocast(self._device, self.amp):
            logits, _ = self.model(inputs, logits_to_keep=scored)
        return F.log_softmax(logits[0, -scored:].float(), dim=-1)

    @torch.inference_mode()
    def score_continuations(self, context: list[int], continuations: list[list[int]]) -> list[tuple[float, bool]]:
        """(log-probability, every token the argmax) of each continuation after `context`: one forward over the
        context into a KV cache, then each continuation's forward from the cache rewound to the context's end."""
        longest = max(len(continuation) for continuation in continuations)
        cache = KVCache.for_model(self.model.config, batch_size=1, max_len=len(context) + longest)
        with autocast(self._device, self.amp):
            logits, _ = self.model(torch.tensor([context], device=self._device), kv_cache=cache, logits_to_keep=1)
            first = F.log_softmax(logits[0, -1:].float(), dim=-1)
            results = []
            for continuation in continuations:
                cache.length = len(context)
                logprobs = first
                if len(continuation) > 1:
                    logits, _ = self.model(torch.tensor([continuation[:-1]], device=self._device), kv_cache=cache)
                    logprobs = torch.cat([first, F.log_softmax(logits[0].float(), dim=-1)])
                target = torch.tensor(continuation, device=logprobs.device)
                results.append((float(logprobs.gather(1, target[:, None]).sum()),
                                bool((logprobs.argmax(-1) == target).all())))
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results = []
        for key, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1):]
            logprobs = self._logprobs(whole, len(continuation))
            target = torch.tensor(continuation, device=logprobs.device)
            answer = (float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all()))
            results.append(answer)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for (string,) in [request.args for request in requests]:
            windows = map(make_disjoint_window, get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1))
            total = sum(score for score, _ in self._loglikelihood_tokens([(None, *window) for window in windows]))
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        results = []
        eos = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        for context, gen_kwargs in [request.args for request in requests]:
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            new_tokens = kwargs.pop("max_gen_toks")
            ids = self.tok_encode(context)
            room = self.max_length - new_tokens
            if len(ids) > room:
                log.warning("Left truncation applied: the prompt holds %d tokens, cut to the last %d (max_length %d "
                            "- max_gen_toks %d)", len(ids), room, self.max_length, new_tokens)
                ids = ids[-room:]
            text = self.tok_decode(self._generate(ids, new_tokens, until, kwargs))
            answer = postprocess_generated_text(generation=text, stop=until, think_end_token=None)
            results.append(answer)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), answer)
        return results

    def _generate(self, ids: list[int], new_tokens: int, until: list[str], kwargs: dict) -> list[int]:
        """Greedy (or, with do_sample, sampled) tokens after `ids` until the end-of-text token, a stop string in the
        text generated so far, or `new_tokens` tokens."""
        temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
        found: list[int] = []
        with autocast(self._device, self.amp):
            for token in generate_tokens(self.model, ids, new_tokens, temperature=temperature,
                                         top_p=float(kwargs.get("top_p", 1.0)), seed=kwargs.get("seed"),
                                         stop_ids=(self.eot_token_id,)):
                found.append(token)
                if token == self.eot_token_id or any(stop in self.tok_decode(found) for stop in until if stop):
                    break
        return found


def build_parser():
    """lm-eval's own parser of `lm-eval run` (what `python -m infer.harness` takes, the model "pelab" registered)."""
    from lm_eval._cli.harness import HarnessCLI
    parser = HarnessCLI()._subparsers.choices["run"]
    parser.prog = "python -m infer.harness"
    parser.usage = (parser.usage or "%(prog)s").replace("lm-eval run", "python -m infer.harness")
    return parser


def main() -> None:
    """lm-eval's command line with the model "pelab" registered."""
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
