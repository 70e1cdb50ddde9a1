"""Named text sources, read as records with a "text" field (a `datasets.Dataset`).

  stdlib               the offline default: this machine's Python standard library (.py sources without test
                       folders, plus the pydoc_data topics). Needs nothing outside the machine.
  PATH                 a local .txt / .jsonl / .json / .parquet file, or a folder of them, read with `datasets`.
                       A .txt file is one document, split further on lines holding only <|endoftext|>.
                       .jsonl/.json/.parquet records need a "text" field (MiniMind's pretrain format).
  pg19, wikitext103, tinystories, minimind
                       Hugging Face hub datasets for online users, streamed with a document cap. pg19 and
                       wikitext103 bring their own validation split, which is the held-out set. With
                       PELAB_HUB_MIRROR=DIR they are read from DIR/OWNER/NAME (the hub repository's layout, e.g.
                       made by `huggingface-cli download --repo-type dataset emozilla/pg19 --local-dir
                       DIR/emozilla/pg19`) and need no network.
"""
from __future__ import annotations

import itertools
import os
import socket
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import datasets

from commands import did_you_mean
from errors import SourceError

DOCUMENT_SEPARATOR = "<|endoftext|>"
LOCAL_EXTENSIONS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def file_kind(path: Path) -> str:
    """How a local file is read: by its extension (LOCAL_EXTENSIONS), and any other file named on its own as
    plain text (a .py or .md file the user points at; a folder is read for the extensions above only)."""
    return LOCAL_EXTENSIONS.get(path.suffix, "text")
STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


ENCODING_ERRORS = ("strict", "replace")


def check_utf8(path: Path, chunk_size: int = 1 << 20) -> None:
    """Raise SourceError at the first byte of `path` that is not UTF-8, naming its offset and line."""
    pending, offset, lines = b"", 0, 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(chunk_size)
            data = pending + chunk
            try:
                data.decode("utf-8")
                pending = b""
            except UnicodeDecodeError as error:
                # A character split across chunks: carry its first bytes over to the next chunk.
                if chunk and error.reason == "unexpected end of data" and error.start >= len(data) - 3:
                    pending = data[error.start :]
                    data = data[: error.start]
                else:
                    line = lines + data[: error.start].count(b"\n") + 1
                    bad = data[error.start : error.start + 4]
                    raise SourceError(
                        f"{path}: not UTF-8 at byte {offset + error.start} (line {line}: {bad!r}...); re-encode the "
                        "file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass --errors replace to read such bytes "
                        "as U+FFFD"
                    ) from None
            if not chunk:
                return
            offset += len(data)
            lines += data.count(b"\n")


def readable_copy(path: Path, errors: str, scratch: Path) -> Path:
    """`path` itself when it is UTF-8; with errors="replace", a UTF-8 copy in `scratch` with U+FFFD for
    undecodable bytes."""
    if errors == "strict":
        check_utf8(path)
        return path
    try:
        check_utf8(path)
        return path
    except SourceError:
        copy = Path(tempfile.mkdtemp(dir=scratch)) / path.name
        copy.write_text(path.read_bytes().decode("utf-8", errors="replace"), encoding="utf-8")
        print(f"{path}: bytes that are not UTF-8 were replaced by U+FFFD (--errors replace)", file=sys.stderr)
        return copy


@dataclass
class TextSource:
    dataset: datasets.Dataset  # one row per document, column "text" (the training documents when heldout is set)
    meta: dict[str, Any] = field(default_factory=dict)
    heldout: datasets.Dataset | None = None  # the source's own validation split, if it has one


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted, skipping test folders and site-packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name not in STDLIB_SKIP_DIRS)
        files.extend(Path(folder) / name for name in sorted(names) if name.endswith(".py"))
    return files


def load_stdlib() -> TextSource:
    import pydoc_data.topics

    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    texts = [path.read_bytes().decode("utf-8", errors="replace") for path in files]
    names = [str(path.relative_to(root)) for path in files]
    topics = pydoc_data.topics.topics
    for topic in sorted(topics):
        texts.append(topics[topic])
        names.append(f"pydoc_data/topics/{topic}")
    dataset = datasets.Dataset.from_dict({"text": texts, "name": names})
    meta = {
        "python_version": sys.version.split()[0],
        "stdlib_path": str(root),
        "file_count": len(files),
        "pydoc_topics": len(topics),
    }
    return TextSource(dataset, meta)


def _split_on_separator(batch: dict[str, list]) -> dict[str, list]:
    texts, names = [], []
    for text, name in zip(batch["text"], batch["name"]):
        pieces = [piece.strip() for piece in text.split(DOCUMENT_SEPARATOR)]
        pieces = [piece for piece in pieces if piece]
        texts.extend(pieces)
        names.extend(name if len(pieces) == 1 else f"{name}#{index}" for index in range(len(pieces)))
    return {"text": texts, "name": names}


def load_local(path: str | Path, errors: str = "strict") -> TextSource:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_EXTENSIONS)
        if not files:
            raise SourceError(f"{path}: folder holds no {'/'.join(LOCAL_EXTENSIONS)} files")
    elif path.is_file():
        files = [path]
    else:
        raise SourceError(f"{path}: no such file or folder")
    empty = [str(p) for p in files if p.stat().st_size == 0]
    if empty:
        raise SourceError(f"{', '.join(empty)}: empty file; give a file with text (or remove it from the folder)")
    with tempfile.TemporaryDirectory(prefix="pelab-utf8-") as scratch:
        files = [readable_copy(p, errors, Path(scratch)) if file_kind(p) != "parquet" else p for p in files]
        dataset = _load_files(files)
    # The absolute path tells an evaluation whether a --data path is this source (eval/heldout.py).
    return TextSource(dataset, {"files": len(files), "source_path": str(path.resolve())})


def _load_files(files: list[Path]) -> datasets.Dataset:
    parts = []
    for builder in sorted(set(file_kind(p) for p in files)):
        group = [str(p) for p in files if file_kind(p) == builder]
        if builder == "text":
            dataset = datasets.load_dataset("text", data_files=group, sample_by="document", split="train")
            if len(dataset) == len(group):  # one row per file, in order: keep the file names
                dataset = dataset.add_column("name", [Path(name).name for name in group])
            else:
                dataset = dataset.add_column("name", [f"{Path(group[0]).parent.name}[{i}]" for i in range(len(dataset))])
            dataset = dataset.map(_split_on_separator, batched=True, remove_columns=dataset.column_names)
        else:
            dataset = datasets.load_dataset(builder, data_files=group, split="train")
            if "text" not in dataset.column_names:
                raise SourceError(
                    f"{', '.join(group)}: records have no 'text' field (found {dataset.column_names}); "
                    "pretraining data needs one string field 'text' per record"
                )
            dataset = dataset.select_columns(["text"])
            dataset = dataset.add_column("name", [f"record {i}" for i in range(len(dataset))])
        parts.append(dataset)
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


HUB_MIRROR_ENV = "PELAB_HUB_MIRROR"


def _hub_is_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """WikiText rows are lines; an article starts at a top-level heading line " = Title = "."""
    article: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("= ") and stripped.endswith(" =") and not stripped.startswith("= ="):
            text = "".join(article).strip()
            if text:
                yield text
            article = []
        article.append(line)
    text = "".join(article).strip()
    if text:
        yield text


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face hub dataset, streamed: the first max_documents documents of its train split, and (when it
    has one) the first validation_documents of its validation split as the held-out set."""

    repo: str
    data_files: dict[str, str] | None = None  # split -> file pattern inside the repository (None: the hub's config)
    max_documents: int | None = None
    validation_split: str | None = None
    validation_documents: int | None = None
    group_lines: Callable[[Iterable[str]], Iterator[str]] | None = None  # rows are lines: join them into documents
    kwargs: dict[str, Any] = field(default_factory=dict)

    def location(self) -> str:
        mirror = os.environ.get(HUB_MIRROR_ENV)
        if mirror:
            local = Path(mirror) / self.repo
            if not local.is_dir():
                raise SourceError(f"{HUB_MIRROR_ENV}={mirror} has no folder {self.repo}; download the dataset there "
                                  f"(huggingface-cli download --repo-type dataset {self.repo} --local-dir {local})")
            return str(local)
        if not _hub_is_reachable():
            raise SourceError(
                f"source {self.repo!r} is on the Hugging Face hub, which cannot be reached (offline). "
                "Offline alternatives: --data stdlib (the default), a local .txt/.jsonl/.parquet file or folder "
                f"(e.g. Gutenberg books as .txt files), or a downloaded copy of the dataset via {HUB_MIRROR_ENV}"
            )
        return self.repo

    def documents(self, location: str, split: str, limit: int | None) -> datasets.Dataset:
        files = {split: self.data_files[split]} if self.data_files else None
        stream = datasets.load_dataset(location, split=split, streaming=True, data_files=files, **self.kwargs)
        texts: Iterable[str] = (row["text"] for row in stream)
        if self.group_lines is not None:
            texts = self.group_lines(texts)
        texts = (text for text in texts if text.strip())
        kept = list(itertools.islice(texts, limit)) if limit else list(texts)
        return datasets.Dataset.from_dict({"text": kept, "name": [f"{split} {i}" for i in range(len(kept))]})

    def load(self, max_documents: int | None = None) -> TextSource:
        location = self.location()
        limit = max_documents or self.max_documents
        dataset = self.documents(location, "train", limit)
        heldout = None
        if self.validation_split:
            heldout = self.documents(location, self.validation_split, self.validation_documents)
        meta = {"hub_repo": self.repo, "max_documents": limit, "validation_split": self.validation_split}
        return TextSource(dataset, meta, heldout)


HUB_SOURCES: dict[str, HubSource] = {
    # PG-19 (Rae et al. 2020): Gutenberg books before 1919, the standard long-document LM benchmark. 60 training
    # books (about 6M tokens with a 4k BPE); the 50 validation books are the held-out set.
    "pg19": HubSource("emozilla/pg19", {"train": "data/train-*.parquet", "validation": "data/validation-*.parquet"},
                      max_documents=60, validation_split="validation"),
    # WikiText-103 (Merity et al. 2016), the ALiBi paper's benchmark: 1,500 training articles (about 4M tokens);
    # the 60 validation articles are the held-out set.
    "wikitext103": HubSource("Salesforce/wikitext",
                             {"train": "wikitext-103-raw-v1/train-*.parquet",
                              "validation": "wikitext-103-raw-v1/validation-*.parquet"},
                             max_documents=1500, validation_split="validation", group_lines=wikitext_articles),
    "tinystories": HubSource("roneneldan/TinyStories"),
    "minimind": HubSource("jingyaogong/minimind_dataset", {"train": "pretrain_hq.jsonl"}),
}

SOURCES: dict[str, Callable[[], TextSource]] = {"stdlib": load_stdlib}
SOURCE_NAMES = [*SOURCES, *HUB_SOURCES]


def load_source(name_or_path: str, errors: str = "strict", max_documents: int | None = None) -> TextSource:
    """Records for a named source or a local path. Raises SourceError with what to do instead.

    errors: "strict" refuses local files that are not UTF-8 (naming the byte and line); "replace" reads
    undecodable bytes as U+FFFD. max_documents caps a hub source's training documents (default: its own cap).
    """
    if errors not in ENCODING_ERRORS:
        raise SourceError(f"--errors must be one of {ENCODING_ERRORS}, got {errors!r}")
    if max_documents is not None and max_documents < 1:
        raise SourceError(f"the document cap must be positive, got {max_documents}")
    if name_or_path in SOURCES:
        source = SOURCES[name_or_path]()
    elif name_or_path in HUB_SOURCES:
        source = HUB_SOURCES[name_or_path].load(max_documents)
    elif Path(name_or_path).exists():
        source = load_local(name_or_path, errors)
    elif "/" in name_or_path or Path(name_or_path).suffix:
        raise SourceError(f"{name_or_path}: no such file or folder (or use a named source: {', '.join(SOURCE_NAMES)})")
    else:
        raise SourceError(
            f"unknown source {name_or_path!r}: not a named source ({', '.join(SOURCE_NAMES)}) nor an existing path"
            + did_you_mean(name_or_path, SOURCE_NAMES)
        )
    source.meta = {"source": name_or_path, **source.meta}
    if len(source.dataset) == 0 or (source.heldout is not None and len(source.heldout) == 0):
        raise SourceError(f"source {name_or_path!r} holds no text" + (" in its validation split" if len(source.dataset) else ""))
    return source
