"""GGUF import: a tiny Llama written with the gguf package's writer imports with transformers' logits; other
architectures are refused by name; the real model (SmolLM2-135M, optional packages) matches transformers."""
import importlib.metadata
import importlib.util
import json

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from errors import ConversionError
from infer.gguf import PACKAGED, resolve_gguf
from model import Transformer
from model.checkpoint import load_model
from scripts.import_hf import import_hf
from scripts.import_hf import main as import_main
from tests.conftest import micro_config

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (make real-model-deps)")
pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate (make real-model-deps)")


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py's LlamaModel.permute), which transformers undoes."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_gguf(path, model: Transformer, tokenizer, architecture: str = "llama") -> None:
    """`model` as llama.cpp writes a Llama: its metadata, float32 tensors, the BPE tokenizer."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.ffn_dim)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in spec["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    state = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    names = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    per_layer = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k", "attention.v_proj": "attn_v",
                 "attention.o_proj": "attn_output", "ffn.gate_proj": "ffn_gate", "ffn.up_proj": "ffn_up",
                 "ffn.down_proj": "ffn_down", "attention_norm": "attn_norm", "ffn_norm": "ffn_norm"}
    for layer in range(config.n_layers):
        for ours, theirs in per_layer.items():
            names[f"layers.{layer}.{ours}.weight"] = f"blk.{layer}.{theirs}.weight"
    for ours, theirs in names.items():
        tensor = state[ours]
        if theirs.endswith("attn_q.weight"):
            tensor = llama_cpp_permute(tensor, config.n_heads)
        elif theirs.endswith("attn_k.weight"):
            tensor = llama_cpp_permute(tensor, config.n_kv_heads)
        writer.add_tensor(theirs, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tokenizer(prepared_data):
    return load_tokenizer(prepared_data)


@pytest.fixture
def tiny_gguf(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=64, rope_theta=1000.0,
                                     tie_word_embeddings=True)).eval()
    for parameter in model.parameters():  # less uniform than the init, so positions matter in the logits
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    path = tmp_path / "tiny" / "tiny-llama.F32.gguf"
    path.parent.mkdir()
    write_gguf(path, model, tokenizer)
    return path, model


def test_tiny_gguf_imports_with_transformers_logits(tiny_gguf, tokenizer, tmp_path):
    from infer.gguf import transformers_model

    path, original = tiny_gguf
    imported = import_hf(path.parent, tmp_path / "ours").eval()  # a folder holding one GGUF file
    assert imported.config.n_kv_heads == 2 and imported.config.rope_theta == 1000.0
    assert imported.config.tie_word_embeddings
    for name, tensor in original.state_dict().items():  # the file's float32 weights, q/k order restored
        assert torch.equal(tensor, imported.state_dict()[name]), name
    hf_model = transformers_model(path)
    idx = torch.randint(0, len(tokenizer), (2, 192))  # 3x the context in the file's metadata
    with torch.no_grad():
        assert (imported(idx)[0] - hf_model(idx).logits).abs().max() < 1e-4
    loaded = load_model(tmp_path / "ours")
    assert loaded.config == imported.config
    state = json.loads((tmp_path / "ours" / "trainer_state.json").read_text())
    assert state["trained_seq_len"] == 64 and state["imported_from"] == str(path)
    ours = load_tokenizer(tmp_path / "ours")  # kept as tokenizer.json
    assert (tmp_path / "ours" / "tokenizer.json").exists()
    text = "def f(x):\n    return x + 1"
    assert ours.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)


def test_parity_report_on_a_tiny_gguf(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    assert import_main(["--checkpoint", str(path), "--out", str(tmp_path / "ours"), "--parity-tokens", "200"]) == 0
    report = json.loads((tmp_path / "ours" / "parity.json").read_text())
    assert [row["scaling"] for row in report["rows"]] == ["none", "linear", "dynamic", "yarn"]
    assert report["worst_logit_diff"] < 1e-4 and report["worst_nll_diff"] < 1e-5


def test_other_architectures_are_refused_by_name(tiny_gguf, tokenizer, tmp_path, capsys):
    _, model = tiny_gguf
    path = tmp_path / "qwen.gguf"
    write_gguf(path, model, tokenizer, architecture="qwen2")
    with pytest.raises(ConversionError, match="GGUF architecture 'qwen2' is not imported"):
        import_hf(path, tmp_path / "out")
    assert import_main(["--checkpoint", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "only ['llama', 'gemma3'] map onto pelab's decoder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_gguf_sources_are_resolved_or_refused(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ConversionError, match="holds 2 GGUF files"):
        resolve_gguf(tmp_path)
    assert resolve_gguf(tmp_path / "a.gguf") == tmp_path / "a.gguf"
    assert resolve_gguf(tmp_path / "missing") is None
    (tmp_path / "c.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ConversionError, match="not a readable GGUF file"):
        import_hf(tmp_path / "c.gguf", tmp_path / "out")


def smollm2_missing() -> str | None:
    """Why the real model's test cannot run here, or None."""
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            return f"the optional package {module} is not installed (make real-model-deps)"
    try:
        importlib.metadata.distribution(PACKAGED["smollm2"].package)
    except importlib.metadata.PackageNotFoundError:
        return f"the optional package {PACKAGED['smollm2'].package} (the model file) is not installed " \
               "(make real-model-deps)"
    return None


@pytest.mark.integration
def test_smollm2_matches_transformers(tmp_path):
    """The real model: imported from the installed package's file, equal to transformers' model of that file on
    512 tokens of real text, plain and under linear, dynamic and yarn."""
    reason = smollm2_missing()
    if reason:
        pytest.skip(reason)
    from infer.parity import parity_report

    model = import_hf("smollm2", tmp_path / "smollm2")
    assert (model.config.n_layers, model.config.dim, model.config.n_heads, model.config.n_kv_heads) == (30, 576, 9, 3)
    report = parity_report(model, resolve_gguf("smollm2"), 512)
    assert report["worst_logit_diff"] <= 1e-3, report["table"]
    assert report["worst_nll_diff"] <= 1e-5, report["table"]


# A SentencePiece vocabulary as Gemma's GGUF files spell theirs (tokenizer.ggml.model "llama", no merges: transformers
# rebuilds them from the order of the tokens): the five special tokens at Gemma's ids, then pieces.
GEMMA_PIECES = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581t", "he", "\u2581the",
                "\u2581a", "in", "\u2581in", "er", "on", "\u2581of"]


def write_gemma_gguf(path, model: Transformer) -> None:
    """A Gemma-shaped `model` as llama.cpp writes Gemma 3: gemma3 metadata (no pattern, local theta or query scale:
    those are the architecture's), norms stored as 1 + weight, q/k rows as they are, float32 tensors."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.ffn_dim)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_sliding_window(max(config.layer_windows))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(GEMMA_PIECES)
    writer.add_token_scores([0.0] * 5 + [-float(i) for i in range(len(GEMMA_PIECES) - 5)])
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.NORMAL] * (len(GEMMA_PIECES) - 5))
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    state = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    names = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    per_layer = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k", "attention.v_proj": "attn_v",
                 "attention.o_proj": "attn_output", "attention.q_norm": "attn_q_norm",
                 "attention.k_norm": "attn_k_norm", "ffn.gate_proj": "ffn_gate", "ffn.up_proj": "ffn_up",
                 "ffn.down_proj": "ffn_down", "attention_norm": "attn_norm", "attention_out_norm": "post_attention_norm",
                 "ffn_norm": "ffn_norm", "ffn_out_norm": "post_ffw_norm"}
    for layer in range(config.n_layers):
        for ours, theirs in per_layer.items():
            names[f"layers.{layer}.{ours}.weight"] = f"blk.{layer}.{theirs}.weight"
    for ours, theirs in names.items():
        tensor = state[ours] + 1.0 if "norm" in theirs else state[ours]
        writer.add_tensor(theirs, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.integration
def test_a_micro_gemma_gguf_imports_with_transformers_logits_and_tokenizer(tmp_path):
    """A 6-layer Gemma 3 written by llama.cpp's conventions: imported through the same command as SmolLM2, its
    pattern, thetas, window, query scale and norms read from the file and the architecture; logits equal to
    transformers' Gemma3ForCausalLM of the file past the window; the file's tokenizer kept, BOS first."""
    from infer.gemma import from_gemma3_config
    from infer.gguf import read_gguf_config, transformers_model
    from tests.test_gemma import micro_gemma, perturbed

    gemma_defaults = dict(attention_scale_dim=256, rope_theta_layers=[1e4] * 5 + [1e6], vocab_size=len(GEMMA_PIECES))
    original = perturbed(micro_gemma(**gemma_defaults))
    path = tmp_path / "micro-gemma3.F32.gguf"
    write_gemma_gguf(path, original)
    config, trained = from_gemma3_config(read_gguf_config(path))
    read, written = config.to_dict(), original.config.to_dict()
    assert read.pop("norm_eps") == pytest.approx(written.pop("norm_eps"))  # stored as float32 in the file
    assert read == written and trained == 32
    assert import_main(["--checkpoint", str(path), "--out", str(tmp_path / "ours"), "--parity-tokens", "60"]) == 0
    imported = load_model(tmp_path / "ours").eval()
    for name, tensor in original.state_dict().items():
        assert torch.allclose(tensor, imported.state_dict()[name], atol=1e-6), name
    idx = torch.randint(0, len(GEMMA_PIECES), (2, 50))
    with torch.no_grad():
        assert (imported(idx)[0] - transformers_model(path)(idx).logits).abs().max() < 2e-5
    report = json.loads((tmp_path / "ours" / "parity.json").read_text())
    assert report["starts_with"] == [2] and report["greedy"]["identical"]
    assert [row["scaling"] for row in report["rows"]] == ["none", "linear", "yarn"]  # dynamic NTK: not per layer type
    assert report["worst_nll_diff"] < 1e-5
    ours = load_tokenizer(tmp_path / "ours")
    assert ours.encode("the a in", add_special_tokens=True)[0] == 2
