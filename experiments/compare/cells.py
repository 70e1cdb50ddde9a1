"""How the comparison's tables write a number: one helper for every cell of the report, its probe and task sections
and the scale ladder, and one for an estimate in a results file."""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from eval.stats import Estimate


def cell(estimate: Estimate | None, digits: int = 2, signed: bool = False) -> str:
    """'mean [low, high]' with `digits` decimals (a sign when `signed`), the mean alone without an interval, 'n/a'
    without a number."""
    return "n/a" if estimate is None else estimate.format(digits, signed)


def estimate_dict(estimate: Estimate | None) -> dict | None:
    """An estimate as results.json stores it."""
    return None if estimate is None else {"mean": estimate.mean, "low": estimate.low, "high": estimate.high,
                                          "n": estimate.n}


def header(first: str, columns: list[str]) -> list[str]:
    """A markdown table's header row and its alignment row (numbers right-aligned)."""
    return [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]


Row = TypeVar("Row")
Column = TypeVar("Column")


def table(rows: dict[str, Row], columns: Iterable[Column], titles: list[str],
          value: Callable[[Row, Column], str]) -> list[str]:
    """A table with one row per variant (`rows`: name -> variant) and one column per entry of `columns`, headed
    `titles`: value(variant, column) in each cell."""
    columns = list(columns)
    return header("variant", titles) + [f"| {name} | " + " | ".join(value(row, column) for column in columns) + " |"
                                        for name, row in rows.items()]
