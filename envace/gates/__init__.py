"""Gates are data: Great Expectations suites over tables, each row locatable by `where`.

`run_checks` runs one suite per table and returns one plain dict per expectation: its human
name, GE type, column, success, how many rows broke it and the `where` of the first few.
Stages turn these into metrics, reports and failures. A gate run by the pipeline names itself
(`gate=`): its suites, checkpoints and every validation result are then kept in the project's
GE file context (`gx/`, ignored by git: its ids change each run) and its Data Docs are rebuilt,
offline, at `gx/uncommitted/data_docs/local_site/index.html` (`DATA_DOCS`), with `gates.html`
beside it (`GATE_RUNS`): every gate run, newest first, readable without a network.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WHERE = "where"
DATA_DOCS = Path("gx/uncommitted/data_docs/local_site/index.html")
GATE_RUNS = DATA_DOCS.with_name("gates.html")  # our static index of every gate run (no JavaScript)


@dataclass(frozen=True)
class Check:
    table: str
    name: str
    """What the check means, in words: shown in reports and failure messages."""
    expectation: Any  # a great_expectations.expectations.Expectation


def run_checks(tables: dict, checks: list[Check], max_examples: int = 5, gate: str | None = None) -> list[dict]:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    ctx = gx.get_context(mode="file", project_root_dir=".") if gate else gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = ctx.data_sources.add_or_update_pandas("envace")
    results = []
    for table, frame in tables.items():
        mine = [c for c in checks if c.table == table]
        if not mine:
            continue
        name = f"{gate}.{table}" if gate else table
        for c in mine:  # the result names its check (GE may re-id an updated suite's expectations)
            c.expectation.meta = {**(c.expectation.meta or {}), "check": c.name}
        suite = ctx.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=[c.expectation for c in mine]))
        validation = ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=_whole_frame(source, name), suite=suite))
        result_format = {"result_format": "COMPLETE", "unexpected_index_column_names": [WHERE]}
        if gate:  # a checkpoint keeps the result and rebuilds the Data Docs
            checkpoint = ctx.checkpoints.add_or_update(gx.Checkpoint(
                name=name, validation_definitions=[validation], result_format=result_format,
                actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")]))
            run = next(iter(checkpoint.run(batch_parameters={"dataframe": frame}).run_results.values()))
        else:
            run = validation.run(batch_parameters={"dataframe": frame}, result_format=result_format)
        by_name = {c.name: c for c in mine}
        for r in run.results:
            config = r.expectation_config
            check = by_name[config.meta["check"]]
            bad = r.result.get("unexpected_index_list") or []
            results.append({
                "name": check.name,
                "table": table,
                "expectation": config.type,
                "column": config.kwargs.get("column") or config.kwargs.get("column_A"),
                "success": bool(r.success),
                "unexpected_count": int(r.result.get("unexpected_count") or 0),
                "observed_value": _plain(r.result.get("observed_value")),
                "examples": [str(row.get(WHERE)) for row in bad[:max_examples]],
            })
    if gate:
        write_gate_runs(Path("."))
    order = {c.name: i for i, c in enumerate(checks)}
    return sorted(results, key=lambda r: order[r["name"]])


def write_gate_runs(root: Path) -> Path:
    """`gates.html` beside the Data Docs index: every kept validation result, newest first, with
    its verdict and a link to its Data Docs page. GE's own index fills its tables with scripts
    from CDNs, so offline it shows none; this page and the result pages need no network."""
    import html
    import json

    store, site = root / "gx/uncommitted/validations", (root / GATE_RUNS).parent
    rows = []
    for path in store.rglob("*.json"):
        result = json.loads(path.read_text())
        page = (Path("validations") / path.relative_to(store)).with_suffix(".html").as_posix()
        rows.append((result["meta"]["run_id"]["run_time"], result["suite_name"], result["success"],
                     result["statistics"], page))
    lines = [f'<tr><td>{html.escape(when[:19].replace("T", " "))} UTC</td><td><a href="{html.escape(page)}">'
             f'{html.escape(suite)}</a></td><td>{"passed" if ok else "FAILED"}</td>'
             f'<td>{stats["successful_expectations"]} of {stats["evaluated_expectations"]}</td></tr>'
             for when, suite, ok, stats, page in sorted(rows, key=lambda r: r[:2], reverse=True)]
    text = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>envace gate runs</title></head><body>"
            "<h1>Gate runs (Great Expectations)</h1><p><a href='index.html'>Data Docs index</a></p>"
            "<table border='1' cellpadding='4'><tr><th>run</th><th>suite</th><th>verdict</th>"
            "<th>expectations met</th></tr>" + "".join(lines) + "</table></body></html>\n")
    site.mkdir(parents=True, exist_ok=True)
    (root / GATE_RUNS).write_text(text)
    return root / GATE_RUNS


def _whole_frame(source, name: str):
    """The batch definition of a dataframe asset `name` (created once in a file context)."""
    asset = next((a for a in source.assets if a.name == name), None) or source.add_dataframe_asset(name)
    found = next((b for b in asset.batch_definitions if b.name == name), None)
    return found or asset.add_batch_definition_whole_dataframe(name)


def _plain(value):
    """numpy scalars → JSON-friendly Python values."""
    return value.item() if hasattr(value, "item") else value


def describe_failures(results: list[dict]) -> str:
    lines = []
    for r in results:
        if r["success"]:
            continue
        where = f"{r['table']}.{r['column']}" if r["column"] else r["table"]
        detail = f"{r['unexpected_count']} bad row(s)" if r["unexpected_count"] else f"observed {r['observed_value']}"
        examples = f", e.g. {', '.join(r['examples'])}" if r["examples"] else ""
        lines.append(f"  FAILED {r['name']} [{r['expectation']} on {where}]: {detail}{examples}")
    return "\n".join(lines)
