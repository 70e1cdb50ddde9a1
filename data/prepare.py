"""Tokenize a text source into packed token files.

    python -m data.prepare --data stdlib --out runs/data/stdlib
    python -m data.prepare --data ../shared/data/books --out runs/data/books --vocab-size 8192

Writes OUT/tokenizer.json (+ tokenizer_config.json, chat template), train.bin and val.bin (token ids,
uint16 when the vocabulary fits, each document followed by <|endoftext|>) and meta.json.
The train/val split is per document and deterministic: a document goes to val when the hash of its text
falls in the first --val-fraction of the hash range. A source with a single document is split at the line
boundary nearest (1 - val_fraction) of its length instead. A source with its own validation split (pg19,
wikitext103) uses that split as val. Hub sources are streamed: --max-documents caps the training documents.
An --out folder that already holds any of these files is refused unless --overwrite, as training refuses a run
folder that holds a run; with --overwrite the command says what it replaced.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from commands import add_out, command_parser, parse, renamed
from data.sources import ENCODING_ERRORS, HUB_SOURCES, TextSource, load_source
from data.tokenizer import ENDOFTEXT, batched, load_tokenizer, train_bpe, wrap_tokenizer
from errors import ConfigError, cli_command

HASH_BUCKETS = 1_000_000
DEFAULT_VAL_FRACTION = 0.05


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def is_validation(text: str, val_fraction: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()
    return int(digest[:12], 16) % HASH_BUCKETS < val_fraction * HASH_BUCKETS


def split_documents(source: TextSource, val_fraction: float) -> tuple[Any, Any]:
    """(train, val) datasets: the source's own validation split when it has one; otherwise split per document by
    hash (a single document is split by lines)."""
    if source.heldout is not None:
        return source.dataset, source.heldout
    dataset = source.dataset
    if len(dataset) == 1:
        text = dataset[0]["text"]
        cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction)))
        cut = cut if cut > 0 else int(len(text) * (1 - val_fraction))
        name = dataset[0]["name"] if "name" in dataset.column_names else "document"
        whole = dataset.from_dict({"text": [text[:cut], text[cut:]], "name": [f"{name} (head)", f"{name} (tail)"]})
        return whole.select([0]), whole.select([1])
    flags = [is_validation(text, val_fraction) for text in dataset["text"]]
    val_rows = [index for index, flag in enumerate(flags) if flag]
    train_rows = [index for index, flag in enumerate(flags) if not flag]
    if not val_rows:  # too few documents for the fraction: hold out the one with the smallest hash
        first = min(range(len(dataset)), key=lambda i: hashlib.sha256(dataset[i]["text"].encode()).hexdigest())
        val_rows = [first]
        train_rows = [index for index in train_rows if index != first]
    return dataset.select(train_rows), dataset.select(val_rows)


def _encode_batch(batch: dict[str, list], tokenizer: Any, eos_id: int) -> dict[str, list]:
    encodings = tokenizer.encode_batch(batch["text"], add_special_tokens=False)
    return {
        "ids": [encoding.ids + [eos_id] for encoding in encodings],
        "bytes": [len(text.encode("utf-8")) for text in batch["text"]],
    }


def encode_documents(dataset: Any, tokenizer: Any, eos_id: int, num_proc: int, desc: str) -> Any:
    """A dataset with columns "ids" (each document's ids followed by eos) and "bytes", via datasets.map."""
    num_proc = max(1, min(num_proc, len(dataset)))
    environ = os.environ
    try:
        return dataset.map(
            _encode_batch,
            batched=True,
            batch_size=16,
            num_proc=num_proc if num_proc > 1 else None,
            fn_kwargs={"tokenizer": tokenizer, "eos_id": eos_id},
            remove_columns=dataset.column_names,
            desc=desc,
        )
    finally:
        # datasets' map with num_proc rebinds os.environ to a deep copy of itself (seen in datasets 5.2,
        # arrow_dataset.py: `os.environ = prev_env`); code holding the real mapping (pytest's monkeypatch, a
        # caller's saved reference) then edits a dict the process no longer reads. Put the real one back.
        os.environ = environ


def write_tokens(dataset: Any, tokenizer: Any, eos_id: int, path: Path, dtype: np.dtype, num_proc: int) -> dict:
    """Tokenize with datasets.map (several processes) and append the ids to `path`. Returns counts."""
    encoded = encode_documents(dataset, tokenizer, eos_id, num_proc, f"tokenizing {path.name}")
    tokens = 0
    with open(path, "wb") as handle:
        for rows in tqdm(encoded.iter(batch_size=256), total=(len(encoded) + 255) // 256, desc=f"writing {path.name}"):
            array = np.fromiter((i for ids in rows["ids"] for i in ids), dtype=dtype)
            array.tofile(handle)
            tokens += int(array.size)
    return {"documents": len(dataset), "tokens": tokens, "bytes": int(sum(encoded["bytes"]))}


def prepare(
    source_name: str,
    out: Path,
    vocab_size: int = 4096,
    tokenizer_path: str | None = None,
    val_fraction: float = 0.05,
    num_proc: int | None = None,
    errors: str = "strict",
    max_documents: int | None = None,
) -> dict:
    if not 0 < val_fraction < 1:
        raise ConfigError(f"--val-fraction must be between 0 and 1, got {val_fraction}")
    source = load_source(source_name, errors, max_documents)
    train_docs, val_docs = split_documents(source, val_fraction)
    print(f"{source_name}: {len(source.dataset)} documents -> {len(train_docs)} train, {len(val_docs)} val")

    if tokenizer_path:
        tokenizer = load_tokenizer(tokenizer_path)
    else:
        texts = (text for batch in batched(iter(train_docs["text"]), 64) for text in batch)
        tokenizer = wrap_tokenizer(train_bpe(texts, vocab_size=vocab_size))
    vocab = len(tokenizer)
    dtype = token_dtype(vocab)
    eos_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)

    # Everything is written into a temporary folder beside OUT and moved in at the end, so an error or an
    # interruption never leaves a half-written data folder over a good one.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer.save_pretrained(str(staging))
        num_proc = num_proc or os.cpu_count() or 1
        splits = {}
        for name, docs in (("train", train_docs), ("val", val_docs)):
            splits[name] = write_tokens(docs, tokenizer.backend_tokenizer, eos_id, staging / f"{name}.bin", dtype, num_proc)
        names = val_docs["name"] if "name" in val_docs.column_names else []
        meta = {
            **source.meta,
            "val_names": names[:50],
            "vocab_size": vocab,
            "dtype": dtype.name,
            "eos_id": eos_id,
            "val_fraction": val_fraction,
            "split": "the source's validation split" if source.heldout is not None else "document hash",
            "tokenizer": "trained here" if not tokenizer_path else str(tokenizer_path),
            **{f"{split}_{key}": value for split, counts in splits.items() for key, value in counts.items()},
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


WRITTEN = ("tokenizer.json", "tokenizer_config.json", "train.bin", "val.bin", "meta.json")  # what prepare() writes


def existing_preparation(out: Path) -> str | None:
    """What of prepare()'s files `out` already holds, described in a few words (its source and token counts when it
    is a prepared folder), or None."""
    present = [name for name in WRITTEN if (out / name).exists()]
    if not present:
        return None
    try:
        meta = json.loads((out / "meta.json").read_text())
        return (f"prepared data of {meta.get('source', 'an unknown source')!r} ({meta.get('train_tokens', 0):,} train "
                f"tokens, vocab {meta.get('vocab_size')})")
    except (OSError, ValueError):
        return ", ".join(present)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("data.prepare", __doc__)
    parser.add_argument("--data", default="stdlib", metavar="SOURCE",
                        help=f"stdlib (offline), {', '.join(HUB_SOURCES)} (hub), or a local file or folder")
    renamed(parser, "--source", "--data")
    add_out(parser, "output folder (tokenizer, train.bin, val.bin, meta.json)", required=True, type=Path)
    parser.add_argument("--overwrite", action="store_true", help="replace the prepared data already in --out")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size")
    parser.add_argument("--tokenizer", help="reuse this tokenizer.json or tokenizer folder instead of training one")
    parser.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                        help="share of documents held out (a source with its own validation split uses that)")
    parser.add_argument("--max-documents", type=int, help="hub sources: training documents to stream (default: the "
                                                          "source's own cap)")
    parser.add_argument("--num-proc", type=int, default=None, help="tokenizer processes (default: CPU count)")
    parser.add_argument("--errors", choices=ENCODING_ERRORS, default="strict",
                        help="bytes that are not UTF-8: strict refuses the file naming byte and line; "
                             "replace reads them as U+FFFD")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    replaced = existing_preparation(args.out)
    if replaced is not None and not args.overwrite:
        raise ConfigError(f"{args.out} already holds {replaced}; pass --overwrite to replace it, or choose another "
                          "--out")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    meta = prepare(args.data, args.out, args.vocab_size, args.tokenizer, args.val_fraction, args.num_proc,
                   args.errors, args.max_documents)
    print(
        f"wrote {args.out}: {meta['train_tokens']:,} train tokens, {meta['val_tokens']:,} val tokens, "
        f"vocab {meta['vocab_size']}, {meta['dtype']}"
    )
    if replaced is not None:
        print(f"replaced what {args.out} held: {replaced}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
