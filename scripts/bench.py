"""Speed and memory, side by side with transformers' LlamaForCausalLM of the identical shape and weights.

    python -m scripts.bench                      # tiny shape, writes runs/bench/bench-tiny.json
    python -m scripts.bench --shape small --out runs/bench   # writes runs/bench/bench-small.json
    python -m scripts.bench --compile            # adds torch.compile modes (compile time reported)
    python -m scripts.bench --device cuda --shape research6 --compile --peak-size 8192 --skip long_eval   # on a GPU

Both models run in this one process, alternating mode by mode in every repeat (the order rotates from repeat
to repeat), and each figure is the median over --repeats. Reported:
  - the matmul peak of this machine (GFLOP/s, fp32 and bf16: the fastest of a few shapes, the best timing of each,
    so that no mode of this benchmark can exceed it), measured here, first;
  - training tokens/s: ours in its default mode (the real train.loop step: bf16 autocast where supported,
    fused AdamW, clipping, the loss path the device takes by default) and with the other loss path (full logits
    or the chunked head + loss: train.fused_loss) vs transformers eager fp32 (and eager bf16; compiled in its
    fastest precision here, bf16 where native and else fp32, with --compile), with ratios, model FLOPs utilisation, and the ratio a perfect implementation could reach at the bf16 peak;
  - generation tokens/s at batch 1 with the same sampling settings (ours: scripts.generate's decode loop,
    fp32 eager by default, and bf16 weights eager and with the compiled one-token step; HF generate in
    fp32 and bf16);
  - peak RSS and time of one --long-tokens perplexity window (a fresh process per encoding);
  - with --forward-tokens N, the long forward: one scored window of N tokens of SmolLM2-135M's shape (random
    weights), plain and under a merged-path method, as a fraction of the measured matmul peak (what sets the
    real-model grid's cost).
The shapes, both training steps and the timers are scripts/performance/measure.py's, which the cost tables and
scripts.performance.step_profile share.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from commands import add_device, add_out, comma_list, command_parser, parse
from errors import ConfigError, cli_command
from eval.perplexity import evaluate_stream
from eval.scoring import score_windows
from infer.generate import generate_tokens
from infer.hf_convert import llama_model_from
from model.config import ModelConfig
from model.methods import method_spec
from model.runtime import autocast_dtype, configure_runtime, resolve_device
from model.transformer import Transformer
from scripts.performance.measure import SHAPES, hf_trainer, our_trainer, peak_rss_mib, synchronize

SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rotated(names: list[str], shift: int) -> list[str]:
    """The modes in a different order in every repeat, so that none always runs right after the same other."""
    shift %= len(names)
    return names[shift:] + names[:shift]


def matmul_peak(dtype: torch.dtype, device: torch.device, size: int = 2048, repeats: int = 5,
                budget_s: float = 10.0) -> float:
    """GFLOP/s of the fastest of several matmuls in `dtype` on `device`: square ones of `size` and size / 2 and a
    tall one (4 x size rows against size / 4 columns, the shape of a forward's projections), each the best of
    `repeats` timings. The fastest, not the median, so that it bounds what the model's own matmuls reach (a median
    square matmul measured below a training run's own rate on a Zen 3: an MFU of 104%). A dtype the hardware only
    emulates (bf16 on a CPU without AVX-512 BF16 or AMX: about 100x slower) gets smaller matmuls, so that the
    measurement stays within about budget_s; its peak is then that of the emulation."""
    probe = torch.randn(256, 256, dtype=dtype, device=device)
    probe @ probe
    started = time.perf_counter()
    probe @ probe
    synchronize(device)
    per_matmul = (time.perf_counter() - started) * (size / 256) ** 3
    while size > 256 and per_matmul * 3 * (2 + repeats) > budget_s:
        size //= 2
        per_matmul /= 8
    best = 0.0
    for rows, inner, columns in ((size, size, size), (size // 2, size // 2, size // 2), (4 * size, size, size // 4)):
        a = torch.randn(rows, inner, dtype=dtype, device=device)
        b = torch.randn(inner, columns, dtype=dtype, device=device)
        for _ in range(2):
            a @ b
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            for _ in range(3):
                a @ b
            synchronize(device)
            best = max(best, 3 * 2 * rows * inner * columns / (time.perf_counter() - start) / 1e9)
    return best


def training_flops_per_token(model: Transformer) -> float:
    """6 x matmul parameters (LM head included, embedding lookup not) + 12 x layers x width x context
    (attention scores and values, forward and backward; the PaLM / nanoGPT estimate)."""
    config = model.config
    matmul_params = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))
    return 6 * matmul_params + 12 * config.n_layers * config.n_heads * config.head_dim * config.max_seq_len


def device_of(module: torch.nn.Module) -> str:
    return next(module.parameters()).device.type


def bench_training(shape: dict, args: argparse.Namespace, peaks: dict[str, float], device: torch.device) -> dict:
    model_values, batch = shape["model"], shape["batch"]
    tokens_per_step = batch * model_values["max_seq_len"]
    with tempfile.TemporaryDirectory() as out_dir:
        ours_step, trainer = our_trainer(model_values, batch, False, out_dir + "/ours", device)
        reference = trainer.model
        our_amp = trainer.amp
        our_precision = "bf16" if our_amp == torch.bfloat16 else "fp32"
        modes: dict[str, tuple[Callable[[], None], str, str]] = {
            "ours (default)": (ours_step, our_precision, device_of(reference))}
        # The loss path the device does not take by default (train.fused_loss): full logits on the CPU, the chunked
        # head + loss on CUDA
        other = not trainer.fused_loss
        other_name = "chunked loss" if other else "full logits"
        plain_step, plain = our_trainer(model_values, batch, False, out_dir + "/ours_other_loss", device, other)
        modes[f"ours, {other_name}"] = (plain_step, our_precision, device_of(plain.model))
        for name, amp in (("hf eager fp32", None), ("hf eager bf16", torch.bfloat16)):
            step, hf_model = hf_trainer(reference, batch, amp, False, device)
            modes[name] = (step, "fp32" if amp is None else "bf16", device_of(hf_model))
        if args.compile:
            compiled_step, compiled = our_trainer(model_values, batch, True, out_dir + "/ours_compiled", device)
            modes["ours compiled"] = (compiled_step, our_precision, device_of(compiled.model))
            other_step, other_trainer = our_trainer(model_values, batch, True, out_dir + "/ours_compiled_other", device,
                                                    other)
            modes[f"ours compiled, {other_name}"] = (other_step, our_precision, device_of(other_trainer.model))
            # transformers compiled in its fastest precision here: bf16 where the device computes it natively,
            # else float32 (an emulated bf16 runs tens of times slower: no baseline to hold anything against)
            fastest = autocast_dtype(device, "auto")
            step, hf_model = hf_trainer(reference, batch, fastest, True, device)
            precision = "bf16" if fastest == torch.bfloat16 else "fp32"
            modes[f"hf compiled {precision}"] = (step, precision, device_of(hf_model))
        first_step = {}
        for name, (step, _, _) in modes.items():
            synchronize(device)
            start = time.perf_counter()
            step()  # compilation happens here for the compiled modes
            synchronize(device)
            first_step[name] = time.perf_counter() - start
            step()
        samples: dict[str, list[float]] = {name: [] for name in modes}
        for repeat in range(args.repeats):
            for name in rotated(list(modes), repeat):
                step = modes[name][0]
                synchronize(device)
                start = time.perf_counter()
                for _ in range(args.train_steps):
                    step()
                synchronize(device)
                samples[name].append(args.train_steps * tokens_per_step / (time.perf_counter() - start))
        fastest = max((name for name in modes if name.startswith("ours")), key=lambda n: statistics.median(samples[n]))
        profile = profile_step(fastest, modes[fastest][0], args, device) if args.profile else None
    flops = training_flops_per_token(reference)
    baseline = statistics.median(samples["hf eager fp32"])
    results = {}
    for name, (_, precision, where) in modes.items():
        tokens_per_s = statistics.median(samples[name])
        results[name] = {
            "device": where,
            "tokens_per_s": tokens_per_s,
            "runs": samples[name],
            "vs_hf_eager_fp32": tokens_per_s / baseline,
            "precision": precision,
            "mfu": tokens_per_s * flops / (peaks[precision] * 1e9),
            "first_step_s": first_step[name],
        }
    # What an implementation running every FLOP at the measured bf16 matmul peak would reach.
    ceiling = peaks["bf16"] * 1e9 / flops
    return {"flops_per_token": flops, "tokens_per_step": tokens_per_step, "modes": results,
            "bf16_peak_tokens_per_s": ceiling, "bf16_peak_vs_hf_eager_fp32": ceiling / baseline, "profile": profile}


def profile_step(name: str, step: Callable[[], None], args: argparse.Namespace, device: torch.device,
                 top: int = 12) -> dict:
    """Where a training step's time goes: torch.profiler over --train-steps steps of our fastest mode, the
    operators and kernels with the most self time on the device (on the CPU, the CPU's)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.train_steps):
            step()
        synchronize(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(event, key) for event in events) or 1.0
    ranked = sorted(events, key=lambda event: getattr(event, key), reverse=True)[:top]
    return {"mode": name, "steps": args.train_steps, "measure": key, "total_ms": total / 1e3,
            "top": [{"name": event.key[:90], "self_ms": getattr(event, key) / 1e3, "share": getattr(event, key) / total,
                     "calls": event.count} for event in ranked]}


def bench_generation(shape: dict, args: argparse.Namespace, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**shape["model"])).eval()
    hf_models = {dtype: llama_model_from(model).to(device, dtype) for dtype in (torch.float32, torch.bfloat16)}
    model.to(device)
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    for hf_model in hf_models.values():
        hf_model.generation_config.eos_token_id = None
    prompt = torch.randint(4, model.config.vocab_size, (args.prompt_tokens,)).tolist()
    new = args.new_tokens

    def ours(chosen: Transformer, compile_step: bool) -> Callable[[], None]:
        def run() -> None:
            produced = list(generate_tokens(chosen, prompt, new, seed=0, compile=compile_step, **SAMPLING))
            assert len(produced) == new
        return run

    def hf(dtype: torch.dtype) -> Callable[[], None]:
        @torch.inference_mode()
        def run() -> None:
            output = hf_models[dtype].generate(torch.tensor([prompt], device=device), max_new_tokens=new,
                                               min_new_tokens=new,
                                               do_sample=True, pad_token_id=0, **SAMPLING)
            assert output.shape[1] == len(prompt) + new
        return run

    modes = {"ours (default fp32)": ours(model, False), "ours bf16": ours(model_bf16, False),
             "ours bf16 compiled": ours(model_bf16, True), "hf generate fp32": hf(torch.float32),
             "hf generate bf16": hf(torch.bfloat16)}
    devices = {"ours (default fp32)": device_of(model), "ours bf16": device_of(model_bf16),
               "ours bf16 compiled": device_of(model_bf16), "hf generate fp32": device_of(hf_models[torch.float32]),
               "hf generate bf16": device_of(hf_models[torch.bfloat16])}
    first_run = {}
    for name, run in modes.items():
        synchronize(device)
        start = time.perf_counter()
        run()  # warm-up (compilation for the compiled mode)
        synchronize(device)
        first_run[name] = time.perf_counter() - start
    samples: dict[str, list[float]] = {name: [] for name in modes}
    for repeat in range(args.repeats):
        for name in rotated(list(modes), repeat):
            synchronize(device)
            start = time.perf_counter()
            modes[name]()
            synchronize(device)
            samples[name].append(new / (time.perf_counter() - start))
    baseline = statistics.median(samples["hf generate fp32"])
    results = {name: {"device": devices[name], "tokens_per_s": statistics.median(values), "runs": values,
                      "first_run_s": first_run[name], "vs_hf_fp32": statistics.median(values) / baseline}
               for name, values in samples.items()}
    return {"batch": 1, "prompt_tokens": len(prompt), "new_tokens": new, "sampling": SAMPLING, "modes": results}


def forward_flops(model: Transformer, tokens: int) -> float:
    """FLOPs of one causal forward over `tokens`: 2 x matmul parameters per token (head included) and, per layer and
    head, 2 x head_dim x tokens^2 for the scores and the values (each over the tokens^2 / 2 causal pairs)."""
    config = model.config
    matmul_params = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))
    return 2 * matmul_params * tokens + 2 * config.n_layers * config.n_heads * config.head_dim * tokens**2


def bench_long_forward(args: argparse.Namespace, peaks: dict[str, float], device: torch.device) -> dict:
    """One scored forward of --forward-tokens tokens (eval.scoring.score_windows: the per-token losses, as the
    real-model grid computes them) for each of --forward-methods, set for that length, in the device's default
    precision; alternating methods in every repeat, the median; its FLOP rate as a fraction of the matmul peak of
    that precision measured above."""
    torch.manual_seed(0)
    values = SHAPES[args.forward_shape]["model"]
    model = Transformer(ModelConfig(**values)).to(device).eval()
    amp = autocast_dtype(device, "auto")
    precision = "bf16" if amp == torch.bfloat16 else "fp32"
    tokens = args.forward_tokens
    ids = np.random.default_rng(0).integers(4, values["vocab_size"], (1, tokens + 1))
    views = {method: model.under(method_spec(method), tokens, values["max_seq_len"]) for method in args.forward_methods}
    for view in views.values():
        score_windows(view, ids[:, : min(tokens, 512) + 1], amp)  # warm-up
    samples: dict[str, list[float]] = {method: [] for method in views}
    for repeat in range(args.forward_repeats):
        for method in rotated(list(views), repeat):
            synchronize(device)
            start = time.perf_counter()
            score_windows(views[method], ids, amp)
            synchronize(device)
            samples[method].append(time.perf_counter() - start)
    flops = forward_flops(model, tokens)
    return {"shape": args.forward_shape, "tokens": tokens, "precision": precision, "flops": flops, "methods": {
        method: {"seconds": statistics.median(times), "runs": times, "tokens_per_s": tokens / statistics.median(times),
                 "gflops": flops / statistics.median(times) / 1e9,
                 "of_peak": flops / statistics.median(times) / 1e9 / peaks[precision],
                 "path": "; ".join(views[method].attention_paths().values())}
        for method, times in samples.items()}}


def long_forward_lines(forward: dict) -> list[str]:
    lines = ["", f"long forward ({forward['shape']} shape, {forward['tokens']:,} tokens scored, {forward['precision']}, "
                 f"{forward['flops'] / 1e12:.1f} TFLOP)",
             f"  {'method':<12} {'seconds':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'of peak':>8}  path"]
    for method, row in forward["methods"].items():
        lines.append(f"  {method:<12} {row['seconds']:>8.1f} {row['tokens_per_s']:>9,.0f} {row['gflops']:>8,.0f} "
                     f"{row['of_peak']:>8.1%}  {row['path'][:60]}")
    return lines


def long_eval_child(shape_name: str, position: str, length: int) -> None:
    """One perplexity window of `length` tokens through eval.perplexity; prints JSON with peak RSS and time."""
    values = {**SHAPES[shape_name]["model"], "position": position}
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**values)).eval()
    ids = np.random.default_rng(0).integers(4, values["vocab_size"], length + 1)
    before = peak_rss_mib()
    start = time.perf_counter()
    result = evaluate_stream(model, ids, np.ones(values["vocab_size"], dtype=np.int64), length, progress=False)
    elapsed = time.perf_counter() - start
    print(json.dumps({"position": position, "tokens": result.tokens, "seconds": elapsed, "nll": result.nll,
                      "peak_rss_mib": peak_rss_mib(), "rss_before_mib": before}))


def bench_long_eval(shape_name: str, args: argparse.Namespace) -> list[dict]:
    results = []
    for position in args.long_positions:
        command = [sys.executable, "-m", "scripts.bench", "--long-eval-child", shape_name, position, str(args.long_tokens)]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            raise RuntimeError(f"the {position} long evaluation failed:\n{finished.stderr[-2000:]}")
        results.append(json.loads(finished.stdout.strip().splitlines()[-1]))
    return results


def report(results: dict) -> str:
    peaks, train, gen = results["matmul_peak_gflops"], results["training"], results["generation"]
    lines = [
        f"shape {results['shape']} ({results['parameters']:,} parameters), {results['device']}, "
        f"{results['threads']} threads, median of {results['repeats']} runs",
        f"matmul peak ({results.get('peak_size', 2048)}^3 or less, see matmul_peak): fp32 {peaks['fp32']:.0f} GFLOP/s, "
    f"bf16 {peaks['bf16']:.0f} GFLOP/s",
    ]
    if train:
        lines += training_lines(train)
    if gen:
        lines += generation_lines(gen)
    if results.get("long_forward"):
        lines += long_forward_lines(results["long_forward"])
    if results["long_eval"]:
        lines += ["", "long evaluation (one window, fresh process, float32)"]
    for run in results["long_eval"]:
        lines.append(f"  {run['position']:<8} {run['tokens']:,} tokens: {run['seconds']:.1f}s, peak RSS "
                     f"{run['peak_rss_mib']:,.0f} MiB (model built: {run['rss_before_mib']:,.0f} MiB)")
    return "\n".join(lines)


def training_lines(train: dict) -> list[str]:
    lines = [
        "",
        f"training ({train['tokens_per_step']:,} tokens/step, {train['flops_per_token'] / 1e6:.1f} MFLOP/token)",
        f"  {'mode':<26} {'tokens/s':>9} {'vs HF fp32':>10} {'MFU':>6} {'first step':>10}",
    ]
    for name, mode in train["modes"].items():
        lines.append(f"  {name:<26} {mode['tokens_per_s']:>9,.0f} {mode['vs_hf_eager_fp32']:>9.2f}x "
                     f"{mode['mfu']:>6.1%} {mode['first_step_s']:>9.1f}s")
    over = [name for name, mode in train["modes"].items() if mode["mfu"] > 1]
    if over:
        lines.append(f"  NOTE: MFU above 100% for {', '.join(over)}: the measured peak is not a ceiling here")
    lines.append(f"  every FLOP at the bf16 peak: {train['bf16_peak_tokens_per_s']:,.0f} tokens/s = "
                 f"{train['bf16_peak_vs_hf_eager_fp32']:.2f}x HF eager fp32 (the ceiling on this machine)")
    profile = train.get("profile")
    if profile:
        lines += ["", f"where {profile['mode']}'s time goes ({profile['steps']} steps, {profile['measure']}, "
                      f"{profile['total_ms']:.1f} ms in all)"]
        lines += [f"  {row['share']:>6.1%} {row['self_ms']:>9.2f} ms {row['calls']:>6}x  {row['name']}"
                  for row in profile["top"]]
    return lines


def generation_lines(gen: dict) -> list[str]:
    lines = ["", f"generation (batch 1, {gen['prompt_tokens']}-token prompt, {gen['new_tokens']} new tokens, "
                  f"temperature {SAMPLING['temperature']}, top_k {SAMPLING['top_k']})"]
    lines.append(f"  {'mode':<20} {'tokens/s':>9} {'vs HF fp32':>10} {'first run':>10}")
    for name, mode in gen["modes"].items():
        lines.append(f"  {name:<20} {mode['tokens_per_s']:>9,.0f} {mode['vs_hf_fp32']:>9.2f}x {mode['first_run_s']:>9.1f}s")
    return lines


SECTIONS = ["training", "generation", "long_eval", "long_forward"]


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.bench", __doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                        help="tiny (configs/tiny.toml's 4.0M model), small (26M), micro (smoke tests), research6 "
                             "(the gpu preset's model: 6 layers, d 384, L 128, batch 128) and research8 (8 layers, "
                             "d 512, L 512, batch 32)")
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="side of the square matmul that measures the peak (8192 saturates an H100; a CPU "
                             "that only emulates bf16 gets a smaller one)")
    add_out(parser, "output folder; writes OUT/bench-SHAPE.json (default: runs/bench)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per mode; the median is reported")
    parser.add_argument("--train-steps", type=int, default=5, help="optimizer steps per timed training run")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile'd training (ours, with the chunked and the full-logits loss, "
                             "and HF)")
    parser.add_argument("--profile", action="store_true",
                        help="profile our fastest training mode (torch.profiler): the top operators by self time")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length of the generation benchmark")
    parser.add_argument("--new-tokens", type=int, default=200, help="tokens generated per timed run")
    parser.add_argument("--long-tokens", type=int, default=16384, help="window of the long evaluation")
    parser.add_argument("--long-positions", nargs="*", default=["rope", "alibi"],
                        help="comma-separated encodings of the long evaluation (none to skip)")
    parser.add_argument("--forward-shape", choices=sorted(SHAPES), default="smollm2",
                        help="shape of the long forward section (default: SmolLM2-135M's, random weights)")
    parser.add_argument("--forward-tokens", type=int, default=0,
                        help="tokens of the long forward section (0: skip it; 16384 is the real-model grid's window)")
    parser.add_argument("--forward-methods", default="none,selfextend",
                        help="inference-time methods of the long forward (selfextend: the merged attention path)")
    parser.add_argument("--forward-repeats", type=int, default=3, help="runs per method of the long forward")
    parser.add_argument("--skip", nargs="*", default=[], help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    add_device(parser, default="cpu")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--long-eval-child"]:
        long_eval_child(argv[1], argv[2], int(argv[3]))
        return 0
    args = parse(build_parser(), argv)
    if args.repeats < 1 or args.train_steps < 1 or args.new_tokens < 1 or args.peak_size < 256:
        raise ConfigError("--repeats, --train-steps and --new-tokens must be positive, and --peak-size at least 256")
    args.long_positions = comma_list(args.long_positions)
    args.skip = comma_list(args.skip)
    unknown = sorted(set(args.skip) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"--skip takes {','.join(SECTIONS)}, got {unknown}")
    device = resolve_device(args.device)
    if args.out and Path(args.out).suffix == ".json":
        raise ConfigError(f"--out takes a folder (it writes bench-{args.shape}.json there), got the file {args.out}")
    out = Path(args.out or "runs/bench") / f"bench-{args.shape}.json"
    shape = SHAPES[args.shape]
    torch.manual_seed(0)
    results = {
        "shape": args.shape, "model": shape["model"], "batch": shape["batch"], "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": args.repeats,
        "parameters": Transformer(ModelConfig(**shape["model"])).num_parameters(),
        "default_autocast": str(autocast_dtype(device, "auto")), "long_eval_device": "cpu",
    }
    peaks = {"fp32": matmul_peak(torch.float32, device, args.peak_size),
             "bf16": matmul_peak(torch.bfloat16, device, args.peak_size)}
    results["matmul_peak_gflops"], results["peak_size"] = peaks, args.peak_size
    results["training"] = bench_training(shape, args, peaks, device) if "training" not in args.skip else None
    results["generation"] = bench_generation(shape, args, device) if "generation" not in args.skip else None
    args.forward_methods = comma_list(args.forward_methods)
    results["long_forward"] = bench_long_forward(args, peaks, device) \
        if args.forward_tokens > 0 and "long_forward" not in args.skip else None
    positions = [position for position in args.long_positions if position != "none"]
    results["long_eval"] = bench_long_eval(args.shape, argparse.Namespace(**{**vars(args), "long_positions": positions})) \
        if "long_eval" not in args.skip else []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
