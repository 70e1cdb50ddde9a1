"""List every verdict and reach that differs between the reports at a git revision and the reports now.

    python -m scripts.verdict_changes --before febf8db            # every report under results/, as markdown
    python -m scripts.verdict_changes --before HEAD results/real_model_grid/report.md

Reports are read as tables: a row is matched to the same row at the revision by its first cells (up to the first
cell that holds a number), and a cell "changed" where its verdict word ("uses", "negligible", "none", "cannot tell",
"separated", ...) or, in a column named reach, its value differs. Prose is not compared.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = re.compile(r"\b(uses|negligible|none|cannot tell|separated|not separated)\s*$")


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> dict[tuple[str, ...], tuple[list[str], list[str]]]:
    """(section and header, row labels) -> (header cells, row cells) of every table row; the labels: the leading
    cells before the first that holds a number."""
    found, header, section = {}, None, ""
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.lstrip("# ")
        if not line.lstrip().startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = row
            continue
        if all(re.fullmatch(r":?-+:?", c) for c in row if c):
            continue
        labels = []
        for cell in row:
            if re.search(r"\[|\d\.\d", cell):
                break
            labels.append(cell)
        found[(f"{section}: " + " | ".join(header), *labels)] = (header, row)
    return found


def verdict(cell: str) -> str | None:
    match = WORDS.search(cell)
    return match.group(1) if match else None


def changes(before: str, after: str) -> list[tuple[str, str, str, str]]:
    """(row, column, before, after) for each verdict or reach that differs."""
    old, found = tables(before), []
    for key, (header, row) in tables(after).items():
        if key not in old:
            continue
        _, previous = old[key]
        for index, (then, now) in enumerate(zip(previous, row)):
            column = header[index] if index < len(header) else ""
            if "reach" in column.lower() and then != now:
                found.append((key[0].split(":")[0] + ": " + " / ".join(key[1:]), column, then, now))
            elif verdict(then) != verdict(now) and (verdict(then) or verdict(now)):
                found.append((key[0].split(":")[0] + ": " + " / ".join(key[1:]), column, verdict(then) or then,
                              verdict(now) or now))
    return found


def at_revision(revision: str, path: Path) -> str | None:
    result = subprocess.run(["git", "show", f"{revision}:{path.relative_to(ROOT).as_posix()}"], cwd=ROOT,
                            capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.verdict_changes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="reports (default: every .md under results/)")
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.paths] or sorted((ROOT / "results").rglob("*.md"))
    lines, total = [], 0
    for path in paths:
        before = at_revision(args.before, path)
        found = [] if before is None else changes(before, path.read_text())
        if found:
            total += len(found)
            lines += [f"### {path.relative_to(ROOT).as_posix()}", "", "| row | column | before | now |",
                      "|---|---|---|---|", *[f"| {row} | {column} | {a} | {b} |" for row, column, a, b in found], ""]
    print("\n".join([f"{total} verdicts and reaches changed since {args.before}.", "", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
