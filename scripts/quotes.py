"""Hold every interval the written pages quote to the reports rendered from the records.

    python -m scripts.quotes                      # docs/results.md, README.md, CHANGELOG.md; exit status 1 on a mismatch
    python -m scripts.quotes docs/presets.md      # other pages

A quote is "MEAN [LOW, HIGH]" in a page (across line breaks). The reports under results/ are rendered from their
records (python -m experiments.STUDY --report-only), so a quote is held to its record when some report holds an
interval whose mean and both bounds round to the quote's digits (the quote may print fewer decimals than the
report). A count is "K/N [LOW, HIGH]" or "K of N [LOW, HIGH]", k of n with its interval (as the RULER reports
print it): it is held only by a report count of the same k and n whose bounds round to the quote's. A quote no report
holds is a finding: either the number changed since the page was written, or it was never rendered from a record.
The quotes known to have no committed record are listed, each with why, in scripts/quotes_without_records.toml: they
are reported apart, and an entry whose quote is now held, or gone from its page, is a finding too (the list only
shrinks). tests/test_quotes.py runs it over the repository.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from scripts.interval_ranges import INTERVAL, NUMBER, ROOT

PAGES = ("docs/results.md", "README.md", "CHANGELOG.md")
OTHER_PAGES = ("docs/encodings.md", "docs/presets.md", "docs/baselines.md", "docs/methods.md", "docs/real_model/ruler.md")
WITHOUT_RECORDS = ROOT / "scripts" / "quotes_without_records.toml"
COUNT = re.compile(rf"(?P<k>\d[\d,]*)(?:/|\s+of\s+)(?P<n>\d[\d,]*)\s*\[(?P<low>{NUMBER}),\s*(?P<high>{NUMBER})\]")


@dataclass(frozen=True)
class Quote:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text} is in no report under results/"


def _parts(match: re.Match) -> tuple[tuple[float, int], ...]:
    """(value, decimals) of the mean (of a count: k and n, exact), the low and the high bound."""
    found = [(float(match[name].replace(",", "")), 0) for name in ("k", "n")] if "k" in match.re.groupindex else []
    for name in ("low", "high") if found else ("mean", "low", "high"):
        text = match[name].replace(",", "").replace("\u2212", "-")
        found.append((float(text), len(text.split(".")[1]) if "." in text else 0))
    return tuple(found)


def quoted(text: str) -> list[re.Match]:
    """Every interval and count of a text; an interval that is the tail of a count ("20 [0.26, 0.66]" of
    "9/20 [0.26, 0.66]") is the count's."""
    counts = list(COUNT.finditer(text))
    ends = {match.end() for match in counts}
    return sorted(counts + [match for match in INTERVAL.finditer(text) if match.end() not in ends],
                  key=lambda match: match.start())


def _keys(values: tuple[float, ...], count: bool, near: bool = False) -> list[tuple]:
    """Index keys: a count's k and n; an interval's mean rounded to 1 decimal (`near`: and its neighbours)."""
    if count:
        return [("count", values[0], values[1])]
    return [("mean", round(round(values[0], 1) + step, 1)) for step in ((-0.1, 0, 0.1) if near else (0,))]


def report_intervals(folder: Path) -> dict[tuple, list[tuple[float, ...]]]:
    """Every interval and count of every report under `folder`, by its keys (a coarse index)."""
    index: dict[tuple, list[tuple[float, ...]]] = {}
    for path in sorted(folder.rglob("*.md")):
        for match in quoted(re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))):
            values = tuple(value for value, _ in _parts(match))
            index.setdefault(_keys(values, match.re is COUNT)[0], []).append(values)
    return index


def held(quote: tuple[tuple[float, int], ...], index: dict[tuple, list[tuple[float, ...]]]) -> bool:
    """Whether some report interval (a count: of the same k and n) rounds to the quote at each of its numbers'
    decimals."""
    keys = _keys(tuple(value for value, _ in quote), len(quote) == 4, near=True)
    candidates = [values for key in keys for values in index.get(key, [])]
    return any(all(abs(value - shown) <= 0.5 * 10 ** -digits + 1e-9 for value, (shown, digits) in zip(values, quote))
               for values in candidates)


def check(pages: list[Path], results: Path, root: Path = ROOT) -> list[Quote]:
    index = report_intervals(results)
    findings = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        for match in quoted(text):
            if not held(_parts(match), index):
                line = sum(start <= match.start() for start in starts)
                shown = str(page.relative_to(root)) if page.is_relative_to(root) else str(page)
                findings.append(Quote(shown, line, re.sub(r"\s+", " ", match.group(0))))
    return findings


def listed(path: Path = WITHOUT_RECORDS) -> list[dict]:
    """The quotes known to have no committed record: [{"page", "text", "why"}]."""
    entries = tomllib.loads(path.read_text())["quote"] if path.exists() else []
    missing = [entry for entry in entries if not entry.get("why")]
    if missing:
        raise ValueError(f"{path}: every quote without a record says why; these do not: {missing}")
    return entries


def against_list(findings: list[Quote], known: list[dict]) -> tuple[list[Quote], list[dict], list[Quote]]:
    """(findings not on the list, entries of the list no finding matches (held now, or gone), findings on it)."""
    keys = {(entry["page"], entry["text"]) for entry in known}
    new = [f for f in findings if (f.path, f.text) not in keys]
    found = {(f.path, f.text) for f in findings}
    return new, [entry for entry in known if (entry["page"], entry["text"]) not in found], \
        [f for f in findings if (f.path, f.text) in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.quotes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", type=Path, help=f"pages to check (default: {', '.join(PAGES)})")
    args = parser.parse_args(argv)
    findings = check(args.pages or [ROOT / page for page in (*PAGES, *OTHER_PAGES)], ROOT / "results")
    new, stale, known = against_list(findings, listed())
    for finding in new:
        print(finding)
    for entry in stale:
        print(f"{entry['page']}: {entry['text']} is listed in {WITHOUT_RECORDS.name} but is now held or gone: "
              "take it off the list")
    print(f"{len(new)} quote(s) held to no report; {len(stale)} stale entr(y/ies) of the list; {len(known)} quote(s) "
          f"known to have no committed record ({WITHOUT_RECORDS.relative_to(ROOT)})")
    return 1 if new or stale else 0


if __name__ == "__main__":
    sys.exit(main())
