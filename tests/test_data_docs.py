"""A gate run by the pipeline keeps its Great Expectations suites and validation results in the
project's file context, and its Data Docs are built offline and readable in a browser."""

from __future__ import annotations

import json
import re

import pandas as pd

from tests.browser import png_size, render, visible_text


def _checks():
    import great_expectations as gx

    from envace.gates import Check

    return [Check("tools", "every tool reaches the bar", gx.expectations.ExpectColumnValuesToBeBetween(
        column="exact", min_value=0.8, max_value=1.0))]


def test_a_named_gate_keeps_its_results_and_builds_data_docs(tmp_path, monkeypatch):
    from envace.gates import DATA_DOCS, GATE_RUNS, run_checks

    monkeypatch.chdir(tmp_path)
    passed = run_checks({"tools": pd.DataFrame({"exact": [0.9, 1.0], "where": ["a", "b"]})}, _checks(),
                        gate="rehearsal_gate")
    failed = run_checks({"tools": pd.DataFrame({"exact": [0.9, 0.5], "where": ["a", "transfer"]})}, _checks(),
                        gate="rehearsal_gate")
    assert [r["success"] for r in passed + failed] == [True, False] and failed[0]["examples"] == ["transfer"]
    suite = json.loads((tmp_path / "gx/expectations/rehearsal_gate/tools.json").read_text())
    assert [e["type"] for e in suite["expectations"]] == ["expect_column_values_to_be_between"]
    kept = list((tmp_path / "gx/uncommitted/validations/rehearsal_gate/tools").rglob("*.json"))
    assert len(kept) == 2  # both runs' results, not just the last
    assert (tmp_path / DATA_DOCS).is_file() and (tmp_path / GATE_RUNS).is_file()
    # without a gate name nothing is written (unit checks stay ephemeral)
    monkeypatch.chdir(tmp_path / "gx")
    run_checks({"tools": pd.DataFrame({"exact": [0.9], "where": ["a"]})}, _checks())
    assert not (tmp_path / "gx/gx").exists()


def test_data_docs_show_every_gate_run_offline_in_a_browser(chromium, tmp_path, monkeypatch):
    from envace.gates import DATA_DOCS, GATE_RUNS, run_checks

    monkeypatch.chdir(tmp_path)
    for exact in (0.9, 0.5):
        run_checks({"tools": pd.DataFrame({"exact": [exact], "where": ["a"]})}, _checks(), gate="rehearsal_gate")
    index = visible_text(render((tmp_path / DATA_DOCS).as_uri(), tmp_path / "data_docs_index.png", virtual_time_ms=5_000))
    assert "Validation Results" in index and "Expectation Suites" in index  # GE's index (its tables need CDN scripts)
    runs = render((tmp_path / GATE_RUNS).as_uri(), tmp_path / "gate_runs.png", virtual_time_ms=5_000)
    text = visible_text(runs)
    assert text.count("rehearsal_gate.tools") == 2 and "FAILED" in text and "passed" in text, text
    newest = re.search(r'href="(validations/[^"]+)"', runs).group(1)  # the failed run, listed first
    page = visible_text(render((tmp_path / DATA_DOCS.parent / newest).as_uri(), tmp_path / "validation.png",
                               virtual_time_ms=5_000))
    assert "Expectation Validation Result" in page and "rehearsal_gate.tools" in page and "Failed" in page, page[:1500]
    assert all(png_size(tmp_path / f"{shot}.png")[0] > 0 for shot in ("data_docs_index", "gate_runs", "validation"))
