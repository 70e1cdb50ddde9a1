"""What text an evaluation reads: never a document the model was trained on, unless asked.

`--data` may be a prepared folder (its val.bin: the documents data.prepare held out), or a raw source (a named
source or a path). A raw source that is the checkpoint's own training source (the source its data folder was
prepared from: the same name, or the same resolved path, or a path inside it) is split by the same rule as
data.prepare (a document is held out when the hash of its text falls in the first val_fraction of the hash range;
a source with its own validation split uses that), and only the held-out part is scored, unless all documents are
asked for explicitly. Any other source is scored whole: the model never trained on it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from data.batches import open_split, read_meta
from data.prepare import DEFAULT_VAL_FRACTION, encode_documents, is_validation, split_documents
from data.sources import SOURCE_NAMES, load_source
from data.tokenizer import ENDOFTEXT
from errors import CheckpointError, DataError
from model.checkpoint import load_trainer_state, training_data_dir


def text_tokens(text: str, tokenizer) -> np.ndarray:
    """A text scored whole, for a model that never trained on it: "stdlib" (this machine's Python standard library,
    every document, separated by <|endoftext|>) or a local text file (UTF-8) read whole."""
    if text == "stdlib":
        return load_eval_tokens("stdlib", tokenizer, all_documents=True)
    if not Path(text).is_file():
        raise DataError(f"{text}: no such file; give a local text file (a long book, UTF-8) or stdlib")
    return np.asarray(tokenizer.encode(Path(text).read_text(errors="replace"), add_special_tokens=False), dtype=np.int64)


def is_prepared(data: str | Path) -> bool:
    path = Path(data)
    return path.is_dir() and (path / "meta.json").exists() and (path / "val.bin").exists()


def training_val_fraction(checkpoint: str | Path) -> float | None:
    """The val_fraction that split the checkpoint's training data, when its trainer state records it."""
    try:
        state = load_trainer_state(checkpoint)
    except CheckpointError:
        return None
    if "val_fraction" in state.get("data", {}):
        return float(state["data"]["val_fraction"])
    meta = training_data_meta(checkpoint)
    value = meta.get("val_fraction") if meta else None
    return float(value) if value is not None else None


def training_data_meta(checkpoint: str | Path) -> dict | None:
    """The meta.json of the data the checkpoint was trained on (kept in its trainer state by train.pretrain, else
    read from its data folder), or None when neither is there."""
    try:
        state = load_trainer_state(checkpoint)
    except CheckpointError:
        return None
    if state.get("data", {}).get("source"):
        return state["data"]
    try:
        return read_meta(training_data_dir(checkpoint))
    except DataError:
        return None


def source_path(meta: dict) -> Path | None:
    """The local path a data folder was prepared from: a local source's own path, the folder a local named source
    reads (stdlib: its stdlib_path), or None for a hub source. Data prepared before meta.json recorded the absolute
    path holds the path as given to data.prepare: taken from the current directory."""
    for key in ("source_path", "stdlib_path"):
        if meta.get(key):
            return Path(meta[key])
    source = str(meta.get("source", ""))
    if not source or source in SOURCE_NAMES:
        return None
    return Path(source).resolve()


# How raw --data relates to the checkpoint's training source (training_source_relation).
SAME, INSIDE, HOLDS, UNKNOWN, OTHER = "same", "inside", "holds", "unknown", "other"


def training_source_relation(data: str, checkpoint: str | Path) -> tuple[str, str]:
    """(relation, reason for the user): whether raw `data` may hold documents the checkpoint trained on. A named
    source is the training source when the names are equal; a path when it resolves to the training source's path
    (SAME), lies inside it (INSIDE) or holds it (HOLDS). A checkpoint that records no training source may have
    trained on anything (UNKNOWN). Anything else is OTHER: the model never trained on it."""
    meta = training_data_meta(checkpoint)
    if meta is None or not meta.get("source"):
        return UNKNOWN, f"{checkpoint} does not record its training source, so {data} may be it"
    trained = str(meta["source"])
    if data in SOURCE_NAMES:
        if data == trained:
            return SAME, f"{data} is this checkpoint's training source"
        return OTHER, f"{data} is not this checkpoint's training source ({trained})"
    trained_path = source_path(meta)
    given = Path(data).resolve()
    if trained_path is None:
        return OTHER, f"{data} is not this checkpoint's training source ({trained})"
    if given == trained_path:
        return SAME, f"{data} is this checkpoint's training source"
    if trained_path in given.parents:
        return INSIDE, f"{data} lies inside this checkpoint's training source {trained_path}"
    if given in trained_path.parents:
        return HOLDS, f"{data} holds this checkpoint's training source {trained_path}"
    return OTHER, f"{data} is not this checkpoint's training source ({trained_path})"


def load_eval_tokens(
    data: str,
    tokenizer,
    max_tokens: int | None = None,
    val_fraction: float | None = None,
    all_documents: bool = False,
    per_document: bool = False,
) -> np.ndarray:
    """Token ids to evaluate on: a prepared folder's val.bin, or the held-out documents of a raw source tokenized
    with `tokenizer` (all of its documents with all_documents=True). Documents are separated by <|endoftext|>.

    per_document: judge every document by data.prepare's hash rule, even a lone one (which data.prepare would split
    by lines): for a part of a larger source, whose documents were split one by one."""
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
        fraction = val_fraction or DEFAULT_VAL_FRACTION
        if all_documents:
            documents = source.dataset
        elif per_document and source.heldout is None:
            documents = source.dataset.filter(lambda row: is_validation(row["text"], fraction))
            if len(documents) == 0:
                raise DataError(f"none of the {len(source.dataset)} documents of {data} was held out from training "
                                "(all were trained on); pass --all-documents to score them anyway")
        else:
            documents = split_documents(source, fraction)[1]
        eos_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        encoded = encode_documents(documents, tokenizer.backend_tokenizer, eos_id, os.cpu_count() or 1,
                                   "tokenizing eval text")
        ids = np.fromiter((i for row in encoded["ids"] for i in row), dtype=np.int64)
    return ids[: max_tokens + 1] if max_tokens else ids


def checkpoint_eval_tokens(
    data: str,
    checkpoint: str | Path,
    tokenizer,
    max_tokens: int | None = None,
    val_fraction: float | None = None,
    all_documents: bool = False,
) -> tuple[np.ndarray, str]:
    """(token ids, one line saying what is scored and why) for evaluating `checkpoint` on `data`: a prepared folder's
    val.bin; of a raw source, only the held-out documents when it may hold the checkpoint's training documents
    (training_source_relation) unless all_documents, otherwise every document. The one rule of every eval command."""
    if is_prepared(data):
        ids = load_eval_tokens(data, tokenizer)
        line = f"evaluating on {len(ids):,} tokens of {Path(data) / 'val.bin'}: the documents data.prepare held out"
    else:
        relation, reason = training_source_relation(data, checkpoint)
        if relation == OTHER:
            ids = load_eval_tokens(data, tokenizer, all_documents=True)
            line = f"evaluating on all {len(ids):,} tokens: {reason}"
        elif all_documents:
            ids = load_eval_tokens(data, tokenizer, all_documents=True)
            line = f"evaluating on all {len(ids):,} tokens, training documents included (--all-documents): {reason}"
        else:
            fraction = val_fraction or training_val_fraction(checkpoint) or DEFAULT_VAL_FRACTION
            ids = load_eval_tokens(data, tokenizer, val_fraction=fraction, per_document=relation in (INSIDE, HOLDS))
            line = (f"evaluating on held-out documents only ({len(ids):,} tokens; val_fraction {fraction}, "
                    f"data.prepare's rule): {reason} (pass --all-documents to score it whole)")
    if max_tokens and len(ids) > max_tokens + 1:
        ids = ids[: max_tokens + 1]
        line += f"; the first {max_tokens:,} of them (--tokens)"
    return ids, line
