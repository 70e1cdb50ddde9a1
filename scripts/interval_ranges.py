"""Find intervals in the committed reports that leave the range of the quantity they measure.

    python -m scripts.interval_ranges                     # results/, docs/ and README.md; exit status 1 when one is found
    python -m scripts.interval_ranges results/compare_map  # one folder or file

An interval is "MEAN [LOW, HIGH]" in markdown and {"mean", "low", "high"} in a results .json. Its quantity is read
from where it stands, and these are checked:

    perplexity, ppl, NLL, loss      LOW < 0 is out of range (a perplexity or a loss is never negative)
    ratio (of perplexities)         LOW <= 0
    exact match, accuracy, rate     LOW < 0 or HIGH > 1, or zero width ("1.00 [1.00, 1.00]": seeds that agree
                                    still leave each seed's own sampling)
    perplexity, NLL (again)         LOW exactly 0 with a positive mean: a t interval cut at the range's edge
    a difference of those rates     LOW < -1 or HIGH > 1 (exact match minus its window control, paired)
    any difference (signed)         a zero-width interval of a nonzero mean ("+1.00 [+1.00, +1.00]": draws that all
                                    agree still leave the parts' own uncertainty); in a results file, a difference
                                    {"full", "window", "difference"} narrower than either of its parts
    a mean over 1 or 2 windows      any interval (Student's t at 1 degree of freedom, t = 12.7, says nothing): a
                                    table row whose "windows" column reads 1 or 2, a results row {"windows": 1 or 2}

In a markdown table the column's header names the quantity, else the table's caption (the nearest heading or line of
text above it), and a cell of running text under a header that names none is read as prose; in prose, the words
just before the interval in the same clause (a list "A [..] / B [..]" keeps the first's quantity); in JSON, the nearest key on the
path that names one. A signed quantity (a penalty, a difference, "minus", "paired", a gain, a change, use, ...) is
checked only as a difference; an interval whose quantity is not named is not checked. tests/test_interval_ranges.py
runs it over the repository.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent

NUMBER = r"[+\-\u2212]?\d[\d,]*(?:\.\d+)?"
INTERVAL = re.compile(rf"(?P<mean>{NUMBER})x?\s*\[(?P<low>{NUMBER})x?,\s*(?P<high>{NUMBER})x?\]")

# Words that make a quantity signed (or not one of ours): never checked where they stand.
SIGNED = re.compile(r"penalt|differ|minus|paired|\bgain|change|\bvs\b|versus|delta|\u0394|\u2212 |(?<=\s)- (?=\w)|"
                    r"advantage|effect|slope|\buse\b|\buses\b|benefit|improve|worse|better|cost|excess|drop|shift|"
                    r"lowest - |- control|relative to rope|over rope|\bgap\b|full \u2212|plain\b|rise|"
                    r"correlation|\bcorr\b|log-ratio|log ratio|entropy", re.IGNORECASE)
KINDS = [  # (kind, pattern), first match wins
    ("ratio", re.compile(r"ratio|relative to the same variant|relative to its own|relative to own", re.IGNORECASE)),
    ("positive", re.compile(r"perplexit|\bppl", re.IGNORECASE)),
    ("unit", re.compile(r"exact match|exact_match|accuracy|success rate|retrieval rate|\brate\b|passkey",
                        re.IGNORECASE)),
    ("nonnegative", re.compile(r"\bnll\b|\bloss\b|val loss|held-out loss|cross-entropy", re.IGNORECASE)),
]
JSON_KINDS = {"ppl": "positive", "ppl_1x": "positive", "ppl_longest": "positive", "perplexity": "positive",
              "ratio": "ratio", "exact_match": "unit", "token_accuracy": "unit", "accuracy": "unit", "rate": "unit",
              "nll": "nonnegative", "loss": "nonnegative", "val_loss": "nonnegative", "first_copy": "nonnegative",
              "second_copy": "nonnegative"}
JSON_SIGNED = re.compile(r"differ|penalt|gain|change|paired|minus|use|control|advantage|delta|rise", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 1-based; in JSON, 0 and `where` holds the key path
    kind: str
    text: str
    where: str = ""

    def __str__(self) -> str:
        place = f"{self.path}:{self.line}" if self.line else f"{self.path} at {self.where}"
        return f"{place}: {self.kind} interval {self.text} leaves its range"


def number(text: str) -> float:
    return float(text.replace(",", "").replace("\u2212", "-"))


UNIT = re.compile(r"exact match|exact_match|accuracy", re.IGNORECASE)  # a rate whose difference is checked


def out_of_range(kind: str, low: float, high: float, mean: float | None = None) -> bool:
    if kind in ("positive", "nonnegative"):  # at 0 with a positive mean: a t interval cut at the range's edge
        return low < 0 or (low == 0 and mean is not None and mean > 0)
    if kind == "ratio":
        return low <= 0
    if kind == "unit":  # a zero-width rate: draws that all agree still leave each draw's own sampling
        return low < 0 or high > 1 or low == high
    zero_width = mean is not None and mean != 0 and low == high
    if kind == "unit difference":
        return low < -1 or high > 1 or zero_width
    if kind == "difference":
        return zero_width
    return False


def kind_of(text: str) -> str | None:
    """The quantity `text` names: a difference where it names a signed one (of a rate: "unit difference"), or None
    where it names none."""
    if SIGNED.search(text):
        return "unit difference" if UNIT.search(text) else "difference"
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return None


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _is_table(line: str) -> bool:
    return line.lstrip().startswith("|")


def scan_markdown(text: str, path: str = "<text>") -> list[Finding]:
    """Every out-of-range interval of a named quantity in markdown `text`."""
    findings: list[Finding] = []
    lines = text.splitlines()
    caption, paragraph, header, in_code = "", "", None, False
    for number_, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if _is_table(line):
            cells = _cells(line)
            if header is None:
                header = cells
                continue
            if all(re.fullmatch(r":?-+:?", cell) for cell in cells if cell):
                continue
            label = cells[0] if cells else ""
            findings += _few_windows(cells, header, path, number_)
            for column, cell in enumerate(cells[1:], 1):
                title = header[column] if column < len(header) else ""
                kind = _column_kind(title, caption, label)
                # a cell of running text under a header that names no quantity: read as prose
                findings += _check(cell, kind, path, number_) if kind is not None or not re.search(r"[a-z]{3}", cell) \
                    else _scan_prose(cell, path, number_)
            continue
        header = None
        if line.strip():
            findings += _scan_prose(line, path, number_, paragraph)
            paragraph, caption = f"{paragraph} {line.strip()}", line
        else:
            paragraph = ""
    return sorted(set(findings), key=lambda f: (f.path, f.line, f.text))


def _column_kind(title: str, caption: str, label: str) -> str | None:
    """A table cell's quantity: its column's header names it, else the table's caption, else the row's label; a
    signed word in the first of these that names anything makes it a difference (of a rate where the header or the
    caption names one)."""
    for text in (title, caption, label):
        if SIGNED.search(text):
            return "unit difference" if UNIT.search(title) or UNIT.search(caption) else "difference"
        kind = kind_of(text)
        if kind is not None:
            return kind
    return None


def _check(cell: str, kind: str | None, path: str, line: int) -> list[Finding]:
    if kind is None:
        return []
    found = []
    for match in INTERVAL.finditer(cell):
        if out_of_range(kind, number(match["low"]), number(match["high"]), number(match["mean"])):
            found.append(Finding(path, line, kind, match.group(0)))
    return found


FEW_WINDOWS = ("1", "2")  # a "windows" column reading these: a t interval at 0 or 1 degree of freedom


def _few_windows(cells: list[str], header: list[str], path: str, line: int) -> list[Finding]:
    """Any interval in a table row whose "windows" column reads 1 or 2."""
    if "windows" not in header:
        return []
    column = header.index("windows")
    if column >= len(cells) or cells[column] not in FEW_WINDOWS:
        return []
    return [Finding(path, line, "t at 1 degree of freedom", match.group(0)) for cell in cells
            for match in INTERVAL.finditer(cell)]


def _scan_prose(line: str, path: str, number_: int, before_line: str = "") -> list[Finding]:
    """Intervals in running text: the words between the previous clause break (or interval) and this one name the
    quantity; where they name none, the nearest word before it in the same sentence that names one (`before_line`:
    the paragraph's earlier lines)."""
    found, start, kind = [], 0, None
    for match in INTERVAL.finditer(line):
        before = line[start:match.start()]
        start = match.end()
        if not re.fullmatch(r"\s*/\s*", before):  # "A [..] / B [..]": a list of the same quantity keeps its kind
            clause = re.split(r"[;:(),.](?!\d)|\bthan\b|\band\b|\bwhile\b", before)[-1]
            kind = kind_of(clause) if len(clause) <= 80 else None
            if kind is None:
                sentence = re.split(r"\.\s+(?=[A-Z(])|\s-\s(?=\*\*|[A-Z])", f"{before_line} {line[:match.start()]}")[-1]
                kind = _plausible(_nearest_kind(sentence), match)
        found += _check(match.group(0), kind, path, number_)
    return found


def _plausible(kind: str | None, match: re.Match) -> str | None:
    """A quantity read from further back in the sentence, kept only where the interval's mean could be one: a signed
    mean ("+0.02") is a difference; a rate lies in [0, 1], a ratio or a perplexity above 0 (otherwise the word
    named something else: nothing to check)."""
    mean = number(match["mean"])
    if kind is None or match["mean"][0] in "+-\u2212":
        return "difference" if kind is not None else None
    if (kind == "unit" and not 0 <= mean <= 1) or (kind in ("ratio", "positive", "nonnegative") and mean <= 0) or \
            kind in ("difference", "unit difference"):  # a difference is written signed
        return None
    return kind


def _nearest_kind(text: str) -> str | None:
    """The quantity named last in `text`: the kind of the word that stands nearest its end (a signed word: a
    difference), or None."""
    found = [(m.end(), "difference") for m in SIGNED.finditer(text)]
    found += [(m.end(), kind) for kind, pattern in KINDS for m in pattern.finditer(text)]
    if not found:
        return None
    end, kind = max(found, key=lambda item: item[0])
    if kind == "difference" and UNIT.search(text):
        return "unit difference"
    return kind


def _walk(value: Any, keys: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict]]:
    if isinstance(value, dict):
        if {"mean", "low", "high"} <= value.keys():
            yield keys, value
        for key, item in value.items():
            yield from _walk(item, (*keys, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*keys, str(index)))


def _dicts(value: Any, keys: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    if isinstance(value, dict):
        yield keys, value
        for key, item in value.items():
            yield from _dicts(item, (*keys, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _dicts(item, (*keys, str(index)))


def _width(estimate: Any) -> float | None:
    if isinstance(estimate, dict) and isinstance(estimate.get("low"), (int, float)) and \
            isinstance(estimate.get("high"), (int, float)):
        return estimate["high"] - estimate["low"]
    return None


def scan_json_structure(data: Any, path: str = "<json>") -> list[Finding]:
    """A paired difference {"full", "window", "difference"} narrower than either part, or leaving [-1, 1] for a
    rate; any interval in a row of one or two windows."""
    findings = []
    for keys, entry in _dicts(data):
        where = "/".join(keys)
        if {"full", "window", "difference"} <= entry.keys() and isinstance(entry["difference"], dict):
            for metric, difference in entry["difference"].items():
                width = _width(difference)
                parts = [_width((entry[part] or {}).get(metric)) for part in ("full", "window")]
                if width is None:
                    continue
                if any(part is not None and width < part - 1e-9 for part in parts) or \
                        (JSON_KINDS.get(metric) == "unit" and (difference["low"] < -1 or difference["high"] > 1)):
                    findings.append(Finding(path, 0, "difference", f"{difference['mean']:.4g} [{difference['low']:.4g}, "
                                                                   f"{difference['high']:.4g}]",
                                            f"{where}/difference/{metric}"))
        windows = entry.get("windows")
        if isinstance(windows, int) and 0 < windows < 3 and not isinstance(entry.get("settings"), dict):
            bounds = [key for key in entry if key == "low" or key.endswith("_low")]
            if any(isinstance(entry[key], (int, float)) for key in bounds):
                findings.append(Finding(path, 0, "t at 1 degree of freedom", f"{windows} windows", where))
    return findings


def scan_json(data: Any, path: str = "<json>") -> list[Finding]:
    """Every out-of-range {"mean", "low", "high"} of a named quantity in a results file's `data`, and the findings of
    scan_json_structure."""
    findings = scan_json_structure(data, path)
    for keys, estimate in _walk(data, ()):
        if any(JSON_SIGNED.search(key) for key in keys):
            continue
        kind = next((JSON_KINDS[key] for key in reversed(keys) if key in JSON_KINDS), None)
        low, high = estimate.get("low"), estimate.get("high")
        if kind is None or not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
            continue
        if out_of_range(kind, low, high):
            findings.append(Finding(path, 0, kind, f"{estimate['mean']:.4g} [{low:.4g}, {high:.4g}]",
                                    "/".join(keys)))
    return findings


def report_files(paths: list[Path]) -> list[Path]:
    """The markdown files and results .json files under `paths` (files given by name are taken as they are)."""
    found = []
    for path in paths:
        if path.is_file():
            found.append(path)
        else:
            found += sorted(p for p in path.rglob("*") if p.suffix in (".md", ".json") and p.is_file())
    return found


def scan(paths: list[Path], root: Path = ROOT) -> list[Finding]:
    findings = []
    for path in report_files(paths):
        shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            findings += scan_json(json.loads(text), shown)
        else:
            findings += scan_markdown(text, shown)
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.interval_ranges", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (default: results/, docs/ and README.md)")
    args = parser.parse_args(argv)
    findings = scan(args.paths or [ROOT / "results", ROOT / "docs", ROOT / "README.md", ROOT / "CHANGELOG.md"])
    for finding in findings:
        print(finding)
    kinds = {}
    for finding in findings:
        kinds[finding.kind] = kinds.get(finding.kind, 0) + 1
    print(f"{len(findings)} out-of-range interval(s)" + (f": {kinds}" if kinds else ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
