"""Import a local transformers Llama folder (safetensors) as our checkpoint.

    python -m scripts.import_hf --checkpoint path/to/llama-folder --out runs/imported
    python -m scripts.generate --checkpoint runs/imported --prompt "Hello"

Supported: Llama architecture with SwiGLU/silu, no biases, grouped-query attention, tied or untied head,
RoPE default/linear/dynamic/yarn/llama3, a fast (tokenizer.json) tokenizer. Weights are read from
model.safetensors or a sharded model.safetensors.index.json (never from pickled .bin files) and stored
in float32. Anything else is refused with the reason.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoTokenizer

from commands import add_checkpoint, add_out, command_parser, parse, renamed
from errors import ConversionError, cli_command
from infer.hf_convert import from_hf_state_dict, from_llama_config
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


def read_llama_config(folder: Path) -> tuple:
    if not (folder / "config.json").exists():
        raise ConversionError(f"{folder}: no config.json; expected a local transformers model folder")
    try:
        values = json.loads((folder / "config.json").read_text())
        if "model_type" not in values and "position" in values and "dim" in values:
            raise ConversionError(f"{folder} is already a pelab checkpoint: use it as it is (--checkpoint {folder}); "
                                  "import_hf converts transformers Llama folders")
        return from_llama_config(values)
    except json.JSONDecodeError as error:
        raise ConversionError(f"{folder / 'config.json'} is not valid JSON ({error})") from error
    except KeyError as error:
        raise ConversionError(f"{folder / 'config.json'} lacks the key {error}, which a Llama config has") from error


def import_hf(model_dir: str | Path, out: str | Path) -> Transformer:
    folder = Path(model_dir)
    config, trained = read_llama_config(folder)
    try:
        weights = read_safetensors(folder)
    except (SafetensorError, OSError) as error:
        raise ConversionError(f"{folder}: unreadable safetensors weights ({error})") from error
    state = {name: tensor.to(torch.float32) for name, tensor in
             from_hf_state_dict(weights, config).items() if not name.endswith("rotary_emb.inv_freq")}
    model = load_state_into(Transformer(config), state, str(folder), "a Llama of its config.json")
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
    add_checkpoint(parser, "a local transformers Llama folder (required)")
    renamed(parser, "--model", "--checkpoint")
    add_out(parser, "our checkpoint folder to write (required)", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace files in a non-empty --out")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv, "checkpoint")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise ConversionError(f"{out} is not empty; pass --overwrite to replace its files, or choose another --out")
    model = import_hf(args.checkpoint, out)
    print(f"wrote {out}: {model.num_parameters():,} parameters")
    return 0

if __name__ == "__main__":
    sys.exit(main())
