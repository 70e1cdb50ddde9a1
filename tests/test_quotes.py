"""Every interval the written pages quote is held to a report rendered from the records (scripts/quotes.py): the
repository's pages against the list of quotes known to have no record, and a planted mismatch that makes the check
fail. Fast tier: it reads files only."""
from scripts.interval_ranges import ROOT
from scripts.quotes import OTHER_PAGES, PAGES, against_list, check, listed


def test_every_interval_the_pages_quote_is_in_a_report_or_listed_as_without_a_record():
    findings = check([ROOT / page for page in (*PAGES, *OTHER_PAGES)], ROOT / "results")
    new, stale, _ = against_list(findings, listed())
    assert not new, "quotes held to no report:\n" + "\n".join(str(f) for f in new)
    assert not stale, "listed as without a record, but held now or gone: " + str(stale)


def planted(tmp_path, report: str, page: str):
    """The findings of `check` on a page beside one report, both written under tmp_path."""
    results = tmp_path / "results" / "study"
    results.mkdir(parents=True)
    (results / "report.md").write_text(report)
    (tmp_path / "results.md").write_text(page)
    return check([tmp_path / "results.md"], tmp_path / "results", root=tmp_path)


def test_a_planted_mismatch_fails_and_a_quote_at_fewer_decimals_holds(tmp_path):
    findings = planted(tmp_path, "| a | +0.1234 [+0.0987, +0.1481] |\n| b | 71.68 [70.74, 72.63] |\n",
                       "Use +0.123 [+0.099, +0.148] nats; perplexity 71.7\n[70.7, 72.6]; a drifted quote +0.124 "
                       "[+0.099, +0.148].\n")
    assert [(f.path, f.line, f.text) for f in findings] == [("results.md", 2, "+0.124 [+0.099, +0.148]")]
    # on the list: reported apart; a listed quote that is held (or gone) is stale
    known = [{"page": "results.md", "text": "+0.124 [+0.099, +0.148]", "why": "planted"},
             {"page": "results.md", "text": "+0.123 [+0.099, +0.148]", "why": "held: stale"}]
    new, stale, on_list = against_list(findings, known)
    assert new == [] and [entry["why"] for entry in stale] == ["held: stale"] and len(on_list) == 1


def test_a_count_is_held_only_by_a_report_count_of_the_same_k_and_n(tmp_path):
    findings = planted(tmp_path, "| plain RoPE | 9/20 [0.26, 0.66] (1739 s) |\n| mean | +20.0 [0.1, 0.9] |\n",
                       "answers 9 of 20 [0.26, 0.66], or 9/20 [0.26, 0.66];\ndrifted: 10 of 20 [0.26, 0.66], 9/21 "
                       "[0.26, 0.66], 9 of 20 [0.26, 0.67]; an interval is not a count: 20 [0.1, 0.9].\n")
    assert [(f.line, f.text) for f in findings] == [(2, "10 of 20 [0.26, 0.66]"), (2, "9/21 [0.26, 0.66]"),
                                                    (2, "9 of 20 [0.26, 0.67]")]


def test_verdict_changes_pair_rows_by_their_labels_within_a_section():
    from scripts.verdict_changes import changes
    before = "\n".join(["## book one", "", "| method | use d = 10 | reach |", "|---|---:|---|",
                        "| yarn | +0.30 [+0.20, +0.40] uses | 10 |", "| ntk | +0.10 [+0.05, +0.15] negligible | none |",
                        "", "## book two", "", "| method | use d = 10 | reach |", "|---|---:|---|",
                        "| yarn | +0.31 [+0.21, +0.41] uses | 10 |"])
    after = before.replace("+0.30 [+0.20, +0.40] uses | 10", "+0.30 [+0.20, +0.40] cannot tell | none")
    assert changes(before, after) == [("book one: yarn", "use d = 10", "uses", "cannot tell"),
                                      ("book one: yarn", "reach", "10", "none")]
    assert changes(before, before) == []
