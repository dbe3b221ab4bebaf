"""docs/benchmarks.md's tables are the ones loadtest.report makes from the
result files in the repository, so a page and its JSON cannot drift apart."""

import json
from pathlib import Path

import pytest

from loadtest.report.write import DOCS, GENERATED, RESULTS, generated_tables, write_report
from loadtest.report.compare_tables import compare_table


def test_the_page_holds_exactly_the_generated_tables():
    text = DOCS.read_text()
    generated = generated_tables(json.loads((RESULTS / "latest.json").read_text()), RESULTS, "../loadtest/results/")
    assert text[text.index(GENERATED) + len(GENERATED):] == "\n\n" + "\n".join(generated)


def test_every_table_says_its_commit_and_date():
    text = DOCS.read_text().split(GENERATED)[1]
    for block in text.split("\n### ")[1:]:
        # an A/B table's rows are its commits
        assert "commit" in block.lower() or "| revision |" in block, block[:120]
        assert "2026-" in block, block[:120]


def test_a_compare_result_is_tabled_with_its_medians_per_revision():
    data = {"machine": {"date": "2026-01-02T03:04:05+00:00", "cores": 2, "ram_gib": 8, "mongo": "FerretDB",
                        "mysql": "10.11"},
            "clients": 1000, "rate": 100.0, "rounds": 2,
            "runs": {"aaa": [{}, {}], "bbb": [{}, {}]},
            "medians": {"aaa": {"e2e_ms.p50": 50.0, "gap.p50": 9.25}, "bbb": {"e2e_ms.p50": 40.0}}}
    lines = compare_table("compare-aaa-bbb.json", data)
    assert lines[0] == "### `compare-aaa-bbb.json`: aaa against bbb, 1,000 WebSocket clients at 100 msg/s"
    assert "2026-01-02T03:04:05+00:00" in lines[2] and "2 alternating rounds" in lines[2]
    assert lines[-3] == "| aaa | 50.0 | – | – | – | 9.2 | – | – | – |"
    assert lines[-2] == "| bbb | 40.0 | – | – | – | – | – | – | – |"


def test_a_page_without_the_marker_is_refused_and_left_alone(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# hand-written\n")
    with pytest.raises(SystemExit, match="lacks the line"):
        write_report(json.loads((RESULTS / "latest.json").read_text()), tmp_path, page)
    assert page.read_text() == "# hand-written\n"
