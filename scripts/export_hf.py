"""Export a checkpoint to a transformers Llama folder (no custom code, no trust_remote_code).

    python -m scripts.export_hf --checkpoint runs/tiny --out runs/tiny-hf
    python -c "from transformers import AutoModelForCausalLM, AutoTokenizer; \\
               AutoModelForCausalLM.from_pretrained('runs/tiny-hf'); AutoTokenizer.from_pretrained('runs/tiny-hf')"

Writes config.json (LlamaConfig; rope theta and scaling in the installed transformers' key names),
model.safetensors, generation_config.json and the tokenizer files with the chat template. An interleaved
RoPE checkpoint is exported with its q/k rows permuted to transformers' half-split layout; static NTK is
exported as plain RoPE with the enlarged base. Encodings Llama cannot express are refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safetensors.torch import save_file
from transformers import GenerationConfig

from commands import add_checkpoint, add_out, command_parser, parse
from data.tokenizer import ENDOFTEXT, IM_END, load_tokenizer
from errors import ConversionError, cli_command
from infer.hf_convert import to_hf_state_dict, to_llama_config
from model.checkpoint import load_model, model_state_dict, write_atomically


def export(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> None:
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConversionError(f"{out} is not empty; pass --overwrite to replace its files, or choose another --out")
    model = load_model(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    eos_ids = [tokenizer.convert_tokens_to_ids(ENDOFTEXT), tokenizer.convert_tokens_to_ids(IM_END)]
    special = {"bos_token_id": None, "eos_token_id": eos_ids[0], "pad_token_id": tokenizer.pad_token_id}
    config = to_llama_config(model.config, special)
    state = to_hf_state_dict(model_state_dict(model), model.config)
    generation = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=False)
    write_atomically(out, {
        "config.json": lambda path: path.write_text(json.dumps(config, indent=2) + "\n"),
        "model.safetensors": lambda path: save_file(state, str(path), metadata={"format": "pt"}),
        "generation_config.json": lambda path: path.write_text(generation.to_json_string()),
        "": lambda path: tokenizer.save_pretrained(str(path)),
    })


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.export_hf", __doc__)
    add_checkpoint(parser, "our checkpoint folder, a RoPE model (required)", required=True)
    add_out(parser, "folder for the transformers model (required)", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace files in a non-empty --out")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    export(args.checkpoint, args.out, args.overwrite)
    print(f"wrote {args.out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(args.out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
