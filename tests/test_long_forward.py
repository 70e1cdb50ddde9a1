"""scripts.performance.long_forward: the FLOPs it counts for each mode, and a run on a micro Gemma-shaped model."""
import json

import torch

from data.tokenizer import load_tokenizer
from model.checkpoint import save_checkpoint
from model.transformer import Transformer
from scripts.performance import long_forward
from tests.test_gemma import micro_gemma


def test_flops_count_a_local_layer_by_its_window_and_the_head_by_its_scored_rows():
    model = Transformer(micro_gemma(vocab_size=97))
    layers = sum(m.weight.numel() for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and name.startswith("layers."))
    width, tokens = 2 * 24, 40  # heads x head width
    windowed = long_forward.forward_flops(model, tokens, 8, dense=False)
    dense = long_forward.forward_flops(model, tokens, tokens, dense=True)
    assert windowed == 2 * layers * tokens + 2 * 97 * 32 * 8 + 5 * 4 * width * tokens * 5 + 2 * width * tokens**2
    assert dense == 2 * layers * tokens + 2 * 97 * 32 * tokens + 6 * 2 * width * tokens**2


def test_a_run_times_each_mode_and_writes_its_table(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    save_checkpoint(tmp_path / "ckpt", Transformer(micro_gemma(vocab_size=len(tokenizer))), tokenizer,
                    {"trained_seq_len": 32, "step": 0})
    assert long_forward.main(["--checkpoint", str(tmp_path / "ckpt"), "--tokens", "48,64", "--scored", "16",
                              "--dtype", "float32", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "long_forward.json").read_text())
    assert [(r["tokens"], r["mode"]) for r in result["rows"]] == [
        (t, m) for t in (48, 64) for m in ("dense", "windowed", "windowed+scored")]
    assert [r["scored"] for r in result["rows"][:3]] == [48, 48, 16] and result["precision"] == "fp32"
    assert all(r["seconds"] > 0 and r["of_peak"] > 0 for r in result["rows"])
    assert "windowed+scored | 16 |" in (tmp_path / "out" / "long_forward.md").read_text()
    dense, windowed = result["rows"][0]["paths"], result["rows"][1]["paths"]
    assert not any("window" in path and "no window" not in path for path in dense.values())  # no layer windowed
    assert any(path.startswith("sdpa_mask") for path in windowed.values())


def test_the_gemma_page_quotes_its_records():
    """docs/real_model/gemma3.md shows the parity and cost tables as the committed records render them."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "real_model" / "gemma3.md").read_text()
    cost = json.loads((root / "results" / "gemma3_270m" / "long_forward.json").read_text())
    assert long_forward.table(cost).split("\n\n", 1)[1] in page
    parity = json.loads((root / "results" / "gemma3_270m" / "parity.json").read_text())
    assert parity["table"].split("\n\n")[1] in page and parity["greedy"]["identical"]
    assert parity["greedy"]["cached_identical_prefix"] == parity["greedy"]["new_tokens"]
    # the Xeon's before/after table, each row from the two records of one run, and the CHANGELOG's figures
    before, after = (json.loads((root / "results" / "gemma3_270m" / "forward_xeon" / side / "long_forward.json")
                                .read_text()) for side in ("before", "after"))
    changelog = (root / "CHANGELOG.md").read_text()
    for old, new in zip(before["rows"], after["rows"], strict=True):
        assert (old["tokens"], old["mode"]) == (new["tokens"], new["mode"])
        assert (f"| {old['tokens']:,} | {old['mode']} | {old['seconds']:.1f} | {old['of_peak']:.0%} | "
                f"{new['seconds']:.1f} | {new['of_peak']:.0%} |") in page
        if old["mode"] == "windowed+scored":
            assert f"{old['seconds']:.1f} -> {new['seconds']:.1f} s" in changelog and f"{new['of_peak']:.0%}" in changelog
    assert f"{before['peak_gflops']['bf16']:,.0f} and {after['peak_gflops']['bf16']:,.0f} GFLOP/s" in page


def test_attention_rate_reports_both_precisions(capsys):
    from scripts.performance import attention_rate

    assert attention_rate.attention_rate(256, 2, 1, 16, torch.float32, repeats=1) > 0
    assert attention_rate.main(["--tokens", "256", "--heads", "2", "--kv-heads", "1", "--head-dim", "16"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16: attention" in out and "float32: attention" in out
