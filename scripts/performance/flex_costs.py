"""FlexAttention (torch.nn.attention.flex_attention, compiled) against pelab's chunked attention, for the encodings
and masks that take the chunked path: evaluation time and peak memory of one attention layer at 1x and 16x L.

    python -m scripts.performance.flex_costs                 # writes runs/bench/flex_costs.{md,json}
    python -m scripts.performance.flex_costs --cases alibi,window --multiples 1,4 --rounds 1
    python -m scripts.performance.flex_costs --device cuda   # on a GPU: writes runs/bench/flex_costs-cuda.{md,json}

The shape is the cost table's (COST_SHAPE in scripts/performance/measure.py: dim 256, 8 heads, 4 KV heads, L =
256), batch 1, one torch thread, fp32, inference mode. Both paths take the same rotated queries and keys from the
model's own first attention layer; each (case, length, path) runs in a fresh process, so peaks do not mix (flex's
includes what compilation loads), and saves its output, which the parent compares (the max |difference| is in the
table). FlexAttention gets:
  - a distance bias (alibi, t5, kerple: encodings whose bias depends on i - j only) as a score_mod reading a
    (heads, L) table that the encoding's own score_bias fills, plus a causal block mask;
  - Shaw's score part (shaw-score: q_i . a_clip(j - i) / sqrt(d), its value term left out on both paths) as a
    score_mod reading the (heads, time, 2k + 1) products of each query with the k-clipped distance vectors;
  - Shaw whole (shaw: bias and value term): the model's own path (model/attention/flex.py clipped_attention: the k nearest
    keys explicitly, the far ones through FlexAttention with a sink key for their softmax mass);
  - a sliding window (rope, model.attention_window) as a block mask (causal and i - j < window).
The time is the median over --repeats calls after a first, compiling, call (its time is reported apart; the block
mask, built once per length as a model would cache it, is outside the timed calls); each
case is measured --rounds times, in rotating order, and the figures are medians over rounds.

torch 2.13 has no FlexAttention backward on CPU ("FlexAttention does not support backward on CPU"), so training
cannot use it here. `--device cuda` measures the same forwards on a GPU (timed between synchronisations; the peak is
torch.cuda.max_memory_allocated, not the process's resident set). What these figures decided: the
model evaluates one sequence with a distance bias, or Shaw's, through FlexAttention (model/attention/flex.py; batches keep
the chunked path, which shares each chunk's bias between sequences), and keeps windows on the chunked path.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import model.attention.flex as flex
from commands import add_device, add_out, comma_list, command_parser, parse
from errors import ConfigError, cli_command
from model.attention.explicit import Explicit
from model.attention.flex import distance_table
from model.attention.registry import Inputs
from model.attention.sdpa_mask import Masked
from model.config import ModelConfig
from model.runtime import configure_runtime, resolve_device
from model.transformer import Transformer
from scripts.performance.measure import COST_SHAPE, peak_rss_mib, rotating_rounds, synchronize

CASES = {
    "alibi": {"position": "alibi"},
    "t5": {"position": "t5"},
    "kerple": {"position": "kerple"},
    "shaw-score": {"position": "shaw"},
    "shaw": {"position": "shaw"},
    "window": {"position": "rope", "attention_window": [64]},
}


def layer_inputs(settings: dict, length: int, seed: int = 0, device: torch.device | None = None):
    """The first attention layer of a random model with `settings` on `device`, its encoding and state, and the
    rotated (q, k, v) of `length` random tokens."""
    torch.manual_seed(seed)
    device = device or torch.device("cpu")
    config = ModelConfig(**{**COST_SHAPE, **settings, "max_seq_len": COST_SHAPE["max_seq_len"]})
    model = Transformer(config).eval().to(device)
    attention = model.layers[0].attention
    encoding = model.encoding_of(config.layer_encodings[0])
    positions = torch.arange(length, device=device)[None, :]
    state = encoding.prepare(positions, positions)
    tokens = torch.randint(0, config.vocab_size, (1, length)).to(device)
    x = model.layers[0].attention_norm(model.tok_embeddings(tokens))
    batch, heads, kv_heads, head_dim = 1, config.n_heads, config.n_kv_heads, config.head_dim
    q = attention.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
    k = attention.k_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    v = attention.v_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    return attention, encoding, state, encoding.encode_queries(q, state), encoding.encode_keys(k, state), v


def flex_call(attention, encoding, positions, length: int):
    """A compiled FlexAttention call equivalent to the chunked path for this layer (its distance bias read from
    the encoding's score_bias on each call, as a forward would), or a ConfigError."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    window = attention.window
    if encoding.bias_needs_scores:
        raise ConfigError(f"{type(encoding).__name__}: a score-dependent bias is not a score_mod")

    def visible(b, h, i, j):
        return (i >= j) & (i - j < window) if window else i >= j

    block_mask = create_block_mask(visible, None, None, length, length, device=str(positions.device))  # per length
    compiled = torch.compile(flex_attention)
    table = torch.zeros(attention.n_heads, length, device=positions.device)  # (heads, distance): the bias at i - j = distance

    def score_mod(score, b, h, i, j):
        return score + table[h, i - j]

    if hasattr(encoding, "relative_keys"):  # Shaw's score part: per query, its products with the 2k + 1 vectors
        clip = encoding.settings.max_distance
        vectors = encoding.relative_keys[str(attention.layer_index)].weight
        scale = attention.head_dim ** -0.5

        per_distance = torch.zeros(1, attention.n_heads, length, 2 * clip + 1, device=positions.device)  # filled on every call, as table

        def shaw_score(score, b, h, i, j):
            return score + per_distance[b, h, i, torch.clamp(j - i, -clip, clip) + clip] * scale

        def call(q, k, v):
            per_distance.copy_(q @ vectors.T)  # (batch, heads, time, 2k + 1)
            return compiled(q, k, v, score_mod=shaw_score, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])

        return call

    def call(q, k, v):
        if encoding.has_score_bias:  # filled in place on every call (as the model's path fills it): one graph reads it
            table.copy_(distance_table(q, encoding, encoding.prepare(positions, positions), attention.layer_index))
        return compiled(q, k, v, score_mod=score_mod if encoding.has_score_bias else None, block_mask=block_mask,
                        enable_gqa=k.shape[1] != q.shape[1])

    return call


@torch.inference_mode()
def measure_one(case: str, length: int, path: str, repeats: int, output: Path, device: str = "cpu") -> dict:
    torch.set_num_threads(1)
    device = torch.device(device)
    attention, encoding, state, q, k, v = layer_inputs(CASES[case], length, device=device)
    if case == "shaw-score":
        encoding.has_value_term = False  # the score part only, on both paths
    positions = torch.arange(length, device=device)[None, :]
    if path == "flex" and case == "shaw":
        def call(q, k, v):  # the model's own path (a fresh state, as each forward prepares one)
            return flex.attention(q, k, v, encoding, encoding.prepare(positions, positions), attention.layer_index)
    elif path == "flex":
        call = flex_call(attention, encoding, positions, length)
    else:
        # The chunked backend a no-grad forward takes without FlexAttention: explicit steps where the probabilities
        # are needed, SDPA with the bias as a mask otherwise (model/attention/registry.py).
        explicit = encoding.has_value_term or encoding.bias_needs_scores or encoding.own_weights
        chunked = (Explicit if explicit else Masked)("the chunked path, for comparison")

        def call(q, k, v):  # a fresh state, as each forward prepares one (T5's shared bias is built again)
            return chunked.attend(attention, Inputs(q, k, v, encoding, encoding.prepare(positions, positions)))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    started = time.perf_counter()
    y = call(q, k, v)
    synchronize(device)
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call(q, k, v)
        synchronize(device)
        times.append(time.perf_counter() - started)
    torch.save(y.cpu(), output)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mib()
    return {"case": case, "length": length, "path": path, "first_s": first, "seconds": statistics.median(times),
            "peak_mib": peak, "device": device.type}


def run_one(case: str, length: int, path: str, repeats: int, folder: Path, device: str) -> dict:
    output = folder / f"{case}-{length}-{path}.pt"
    command = [sys.executable, "-m", "scripts.performance.flex_costs", "--one",
               json.dumps([case, length, path, repeats, str(output), device])]
    failed = {"case": case, "length": length, "path": path}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {**failed, "error": "timed out after 600 s"}
    lines = (done.stderr if done.returncode else done.stdout).strip().splitlines()
    if done.returncode:
        return {**failed, "error": (lines[-1] if lines else f"exit status {done.returncode}")[:300]}
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {**failed, "error": f"no result line in the output: {lines[-1:]}"}


def measure(cases: list[str], lengths: list[int], repeats: int, rounds: int, device: str = "cpu") -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        runs: dict[tuple, list[dict]] = {}
        order = [(case, length, path) for case in cases for length in lengths for path in ("chunked", "flex")]
        for round_index, index in rotating_rounds(len(order), rounds, step=2):  # a case's two paths stay adjacent
            case, length, path = order[index]
            result = run_one(case, length, path, repeats, Path(folder), device)
            runs.setdefault((case, length, path), []).append(result)
            print(f"round {round_index + 1}: {case} {length} {path}: "
                  f"{result.get('error') or format(result['seconds'] * 1e3, '.1f') + ' ms'}", flush=True)
        for case in cases:
            for length in lengths:
                row: dict = {"case": case, "length": length}
                for path in ("chunked", "flex"):
                    done = [r for r in runs[(case, length, path)] if "error" not in r]
                    if not done:
                        row[path] = {"error": runs[(case, length, path)][0]["error"]}
                        continue
                    row[path] = {key: statistics.median(r[key] for r in done) for key in ("seconds", "first_s", "peak_mib")}
                    row[path]["all_rounds"] = [r["seconds"] for r in done]
                if "error" not in row["chunked"] and "error" not in row["flex"]:
                    a = torch.load(Path(folder) / f"{case}-{length}-chunked.pt")
                    b = torch.load(Path(folder) / f"{case}-{length}-flex.pt")
                    row["max_abs_diff"] = float((a - b).abs().max())
                    row["speedup"] = row["chunked"]["seconds"] / row["flex"]["seconds"]
                rows.append(row)
    return rows


def table(rows: list[dict], trained: int, peak: str = "peak MiB") -> str:
    lines = [f"| case | length | chunked ms | flex ms | flex speed-up | flex first call s | {peak} chunked / flex | "
             "max abs diff |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        chunked, flex = row["chunked"], row["flex"]
        if "error" in chunked or "error" in flex:
            lines.append(f"| {row['case']} | {row['length'] // trained}x | {chunked.get('error', '')} "
                         f"| {flex.get('error', '')} | | | | |")
            continue
        lines.append(f"| {row['case']} | {row['length'] // trained}x ({row['length']}) | {chunked['seconds'] * 1e3:.1f} "
                     f"| {flex['seconds'] * 1e3:.1f} | {row['speedup']:.2f}x | {flex['first_s']:.1f} "
                     f"| {chunked['peak_mib']:,.0f} / {flex['peak_mib']:,.0f} | {row['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.performance.flex_costs", __doc__)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {list(CASES)}")
    parser.add_argument("--multiples", default="1,16", help="lengths as multiples of L")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per process")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of every case, order rotating")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    add_device(parser, default="cpu")
    add_out(parser, "output folder: flex_costs.md and flex_costs.json (flex_costs-cuda.* on CUDA)",
            default=Path("runs/bench"), type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv)
    if args.one:
        case, length, path, repeats, output, device = json.loads(args.one)
        print(json.dumps(measure_one(case, length, path, repeats, Path(output), device)))
        return 0
    cases = comma_list(args.cases)
    unknown = [case for case in cases if case not in CASES]
    if unknown or not cases:
        raise ConfigError(f"--cases: unknown {unknown}; valid cases are {list(CASES)}")
    try:
        multiples = [int(m) for m in comma_list(args.multiples)]
    except ValueError as error:
        raise ConfigError(f"--multiples are comma-separated integers ({error})") from error
    if not multiples or min(multiples) < 1 or args.repeats < 1 or args.rounds < 1:
        raise ConfigError("--multiples need values >= 1, --repeats and --rounds >= 1")
    device = resolve_device(args.device)
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device}: flex_costs times the CPU or a CUDA GPU, not {device.type}")
    trained = COST_SHAPE["max_seq_len"]
    rows = measure(cases, [m * trained for m in multiples], args.repeats, args.rounds, device.type)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "flex_costs" if device.type == "cpu" else f"flex_costs-{device.type}"
    named = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    (args.out / f"{stem}.json").write_text(json.dumps({"shape": COST_SHAPE, "torch": torch.__version__, "device": named,
                                                      "rows": rows}, indent=1) + "\n")
    shown = table(rows, trained, "peak MiB" if device.type == "cpu" else "peak allocated MiB")
    (args.out / f"{stem}.md").write_text(f"device: {named}\n\n" + shown)
    print(shown + f"wrote {args.out / (stem + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
