"""What text an evaluation reads: never a document the model was trained on, unless asked.

`--data` may be a prepared folder (its val.bin: the documents data.prepare held out), or a raw source (a named
source or a path). A raw source is split by the same rule as data.prepare (a document is held out when the hash
of its text falls in the first val_fraction of the hash range; a source with its own validation split uses that),
and only the held-out part is scored, unless all documents are asked for explicitly.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from data.batches import open_split, read_meta
from data.prepare import DEFAULT_VAL_FRACTION, encode_documents, split_documents
from data.sources import load_source
from data.tokenizer import ENDOFTEXT
from errors import CheckpointError, DataError
from model.checkpoint import load_trainer_state


def is_prepared(data: str | Path) -> bool:
    path = Path(data)
    return path.is_dir() and (path / "meta.json").exists() and (path / "val.bin").exists()


def training_data_dir(checkpoint: str | Path) -> str:
    """The prepared data folder a checkpoint was trained on, from its trainer state."""
    try:
        state = load_trainer_state(checkpoint)
    except CheckpointError:
        state = {}
    data_dir = state.get("run_config", {}).get("data", {}).get("dir")
    if not data_dir:
        raise DataError(
            f"{checkpoint} does not record the data it was trained on (e.g. it was imported); pass --data: "
            "a prepared folder, a named source or a text path"
        )
    return data_dir


def training_val_fraction(checkpoint: str | Path) -> float | None:
    """The val_fraction that split the checkpoint's training data, when its trainer state records it."""
    try:
        state = load_trainer_state(checkpoint)
    except CheckpointError:
        return None
    if "val_fraction" in state.get("data", {}):
        return float(state["data"]["val_fraction"])
    data_dir = state.get("run_config", {}).get("data", {}).get("dir")
    if data_dir and (Path(data_dir) / "meta.json").exists():
        value = read_meta(data_dir).get("val_fraction")
        return float(value) if value is not None else None
    return None


def load_eval_tokens(
    data: str,
    tokenizer,
    max_tokens: int | None = None,
    val_fraction: float | None = None,
    all_documents: bool = False,
) -> np.ndarray:
    """Token ids to evaluate on: a prepared folder's val.bin, or the held-out documents of a raw source tokenized
    with `tokenizer` (all of its documents with all_documents=True). Documents are separated by <|endoftext|>."""
    if is_prepared(data):
        path = Path(data)
        meta = read_meta(path)
        if int(meta["vocab_size"]) != len(tokenizer):
            raise DataError(
                f"{path} was tokenized with a {meta['vocab_size']}-token vocabulary but the checkpoint's tokenizer "
                f"has {len(tokenizer)}; pass the raw text instead so it is tokenized with the checkpoint's tokenizer"
            )
        ids = np.asarray(open_split(path, "val", meta).tokens)
    else:
        source = load_source(data)
        if all_documents:
            documents = source.dataset
        else:
            documents = split_documents(source, val_fraction or DEFAULT_VAL_FRACTION)[1]
        eos_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        encoded = encode_documents(documents, tokenizer.backend_tokenizer, eos_id, os.cpu_count() or 1,
                                   "tokenizing eval text")
        ids = np.fromiter((i for row in encoded["ids"] for i in row), dtype=np.int64)
    return ids[: max_tokens + 1] if max_tokens else ids


def describe_eval_data(data: str, all_documents: bool, val_fraction: float | None) -> str:
    if is_prepared(data):
        return f"{data} (val.bin: the held-out documents)"
    if all_documents:
        return f"{data} (all documents, training documents included: --all-documents)"
    return f"{data} (held-out documents only: val_fraction {val_fraction or DEFAULT_VAL_FRACTION}, data.prepare's rule)"
