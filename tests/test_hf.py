"""Export to and import from transformers' Llama format, proven by identical logits and tokens."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data.sft import encode_conversation
from data.tokenizer import load_tokenizer
from errors import ConversionError
from infer.generate import generate_tokens
from infer.hf_convert import from_llama_config
from model import Transformer
from model.checkpoint import load_model, save_checkpoint
from scripts.export_hf import export
from scripts.export_hf import main as export_main
from scripts.import_hf import import_hf
from scripts.import_hf import main as import_main
from tests.conftest import micro_config

SCALINGS = [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0},
            {"rope_type": "yarn", "factor": 4.0}, {"rope_type": "llama3", "factor": 4.0},
            {"rope_type": "ntk", "factor": 2.0}]
YARN_VARIANTS = [{"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
                 {"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 1.0}]
CASES = [dict(n_kv_heads=kv, rope_layout=layout) for kv in (4, 2) for layout in ("half", "interleaved")] + [
    dict(n_kv_heads=2, rope_layout="interleaved", rope_scaling=scaling) for scaling in SCALINGS[1:] + YARN_VARIANTS]


def case_id(case):
    scaling = case.get("rope_scaling") or {"rope_type": "plain"}
    return f"kv{case['n_kv_heads']}-{case['rope_layout']}-" + "-".join(str(value) for value in scaling.values())


def make_checkpoint(folder, tokenizer, **overrides):
    torch.manual_seed(0)
    config = micro_config(vocab_size=len(tokenizer), max_seq_len=16, rope_theta=1000.0, **overrides)
    model = Transformer(config)
    for parameter in model.parameters():  # a less uniform model than the init, so positions matter in the logits
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 16, "step": 0})
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(prepared_data):
    return load_tokenizer(prepared_data)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_exported_model_matches_ours(case, tokenizer, tmp_path):
    model = make_checkpoint(tmp_path / "ours", tokenizer, **case)
    export(tmp_path / "ours", tmp_path / "hf")
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    idx = torch.randint(0, len(tokenizer), (2, 48))  # 3x the trained length
    positions = (100 + 3 * torch.arange(48))[None].expand(2, -1)  # explicit, spread-out, far beyond it
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf_model(idx).logits
        ours_far, theirs_far = model(idx, positions=positions)[0], hf_model(idx, position_ids=positions).logits
    assert (ours - theirs).abs().max() < 1e-4
    assert (ours_far - theirs_far).abs().max() < 1e-4
    prompt = tokenizer.encode("def add(a, b):", add_special_tokens=False)
    eos = (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    ours_tokens = list(generate_tokens(model, prompt, 30, temperature=0, stop_ids=eos))
    with torch.no_grad():
        output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)
    assert output[0, len(prompt):].tolist() == ours_tokens


def test_tokenizer_and_chat_template_parity(tokenizer, tmp_path):
    make_checkpoint(tmp_path / "ours", tokenizer)
    export(tmp_path / "ours", tmp_path / "hf")
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in ["def f(x):\n    return x  # 猫追老鼠 🐍", "plain words", "<|im_start|>user\nhi<|im_end|>"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert exported.encode(text, add_special_tokens=False) == ids
        assert exported.decode(ids) == tokenizer.decode(ids) == text
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write f."},
                    {"role": "assistant", "content": "def f(): pass"}, {"role": "user", "content": "Again, 更短."},
                    {"role": "assistant", "content": "f = lambda: None"}]
    rendered = exported.apply_chat_template(conversation, tokenize=True, return_dict=False)
    assert list(rendered) == encode_conversation(tokenizer, conversation, 10_000).input_ids
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [0, 2] and generation["pad_token_id"] == 3


@pytest.mark.parametrize("scaling", SCALINGS[:5], ids=lambda s: s["rope_type"] if s else "plain")
@pytest.mark.parametrize("tied", [True, False])
def test_export_then_import_is_bit_identical(scaling, tied, tokenizer, tmp_path):
    model = make_checkpoint(tmp_path / "ours", tokenizer, rope_scaling=scaling, tie_word_embeddings=tied)
    export(tmp_path / "ours", tmp_path / "hf")
    imported = import_hf(tmp_path / "hf", tmp_path / "back")
    assert imported.config == model.config
    assert load_model(tmp_path / "back").config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, imported.state_dict()[name]), name
    assert json.loads((tmp_path / "back" / "trainer_state.json").read_text())["trained_seq_len"] == 16


def test_interleaved_and_ntk_round_trip_to_equivalent_models(tokenizer, tmp_path):
    """Layout and static NTK are expressed differently in Llama (permuted rows, larger theta): same logits."""
    model = make_checkpoint(tmp_path / "ours", tokenizer, rope_layout="interleaved",
                            rope_scaling={"rope_type": "ntk", "factor": 2.0})
    export(tmp_path / "ours", tmp_path / "hf")
    imported = import_hf(tmp_path / "hf", tmp_path / "back").eval()
    assert imported.config.rope_layout == "half" and imported.config.rope_scaling is None
    idx = torch.randint(0, len(tokenizer), (1, 40))
    with torch.no_grad():
        assert (imported(idx)[0] - model(idx)[0]).abs().max() < 1e-4


@pytest.mark.parametrize("position", ["alibi", "t5", "shaw", "sinusoidal", "learned", "none", "fire", "kerple",
                                      "xpos", "cope", "ssmax", "fox", "stickbreaking", "dape",
                                      "path", "asentmax", "pope", "fope", "decoupled"])
def test_encodings_llama_cannot_express_are_refused(position, tokenizer, tmp_path, capsys):
    make_checkpoint(tmp_path / "ours", tokenizer, position=position)
    assert export_main(["--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 2
    error = capsys.readouterr().err
    assert f"cannot export position = '{position}' to Llama" in error and "only rope checkpoints" in error
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("setting", [dict(position_args={"rope": {"fraction": 0.5}}),
                                     dict(position_args={"rope": {"p": 0.5}}), dict(position_layers=["rope", "none"]),
                                     dict(attention_window=[8]), dict(attention_methods=[{"method": "logn"}]),
                                     dict(random_positions=4096),
                                     dict(rope_scaling={"rope_type": "resonance", "factor": 1.0}),
                                     dict(qk_norm=[True])])
def test_rope_variants_llama_cannot_express_are_refused(setting, tokenizer, tmp_path, capsys):
    make_checkpoint(tmp_path / "ours", tokenizer, **setting)
    assert export_main(["--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 2
    name = next(iter(setting))
    if name == "position_args":
        name = "position_args.rope." + next(iter(setting[name]["rope"]))
    assert f"cannot export model.{name} = " in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("change, message, command_message", [
    ({"model_type": "gpt2"}, "only Llama-architecture models", "model_type is 'gpt2'; pelab imports ['llama', "
                                                               "'gemma3_text']"),
    ({"attention_bias": True}, "biases in attention or MLP", "biases in attention or MLP"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'", "hidden_act 'gelu'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'", "rope_type 'longrope'"),
])
def test_unsupported_imports_are_refused(change, message, command_message, tokenizer, tmp_path, capsys):
    make_checkpoint(tmp_path / "ours", tokenizer)
    export(tmp_path / "ours", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(ConversionError, match=message):
        from_llama_config({**config, **change})
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    assert import_main(["--checkpoint", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 2
    assert command_message in capsys.readouterr().err
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="pickled .bin weights are not loaded"):
        import_hf(tmp_path / "hf", tmp_path / "back2")


def test_import_refuses_our_own_checkpoints_and_a_non_empty_out(tokenizer, tmp_path, capsys):
    make_checkpoint(tmp_path / "ours", tokenizer)
    assert import_main(["--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 2
    assert "is already a pelab checkpoint" in capsys.readouterr().err
    export(tmp_path / "ours", tmp_path / "hf")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me")
    assert import_main(["--checkpoint", str(tmp_path / "hf"), "--out", str(tmp_path / "taken")]) == 2
    assert "is not empty; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"
    # the former spelling is refused with the name that replaced it, and nothing is written
    with pytest.raises(SystemExit) as stop:
        import_main(["--model", str(tmp_path / "hf"), "--out", str(tmp_path / "taken"), "--overwrite"])
    assert stop.value.code == 2 and "--model was renamed: use --checkpoint" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"
