"""A micro study for the engine's tests (tests/test_engine.py, tests/test_cluster.py): cell i's record is i squared,
after `sleep` seconds; cells listed in `fail` raise."""
from __future__ import annotations

import time
from dataclasses import dataclass

from experiments.engine import Context, Records, Study, option
from experiments.render import write


@dataclass
class Settings:
    cells: int = option(4, "how many cells")
    sleep: float = option(0.0, "seconds each cell sleeps")
    fail: list = option([], "the cells that raise")
    scale: int = option(1, "a setting that changes every cell")
    out: str = option("runs/toy", "the study's folder")
    table: dict = option({}, "a table setting")
    title: str = option("", "a heading for the report: a reading of the records, not of the cells")


def cells(settings: Settings, context: Context) -> list[dict]:
    return [{"name": f"c{i}", "value": i, "scale": settings.scale, "sleep": settings.sleep,
             "fail": i in settings.fail, "local": {"note": "not part of the address"}} for i in range(settings.cells)]


def measure(cell: dict, context: Context) -> dict:
    time.sleep(cell["sleep"])
    if cell["fail"]:
        raise ValueError(f"cell {cell['name']} fails on purpose")
    return {"square": cell["value"] ** 2 * cell["scale"], "threads": context.threads}


def report(records: Records) -> None:
    heading = f"# {records.settings.title}\n" if records.settings.title else ""
    write(records.out, "report.md", heading + "\n".join(f"{cell['name']}: {record['square']}"
                                                         for cell, record in records.done()) + "\n")


STUDY = Study("tests.toy_study", Settings, cells, measure, report, doc="A micro study for the engine's tests.",
              section="toy")
