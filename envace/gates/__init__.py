"""Gates are data: Great Expectations suites over tables, each row locatable by `where`.

`run_checks` runs one suite per table in an ephemeral GE context and returns one plain
dict per expectation: its human name, GE type, column, success, how many rows broke it
and the `where` of the first few. Stages turn these into metrics, reports and failures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

WHERE = "where"


@dataclass(frozen=True)
class Check:
    table: str
    name: str
    """What the check means, in words: shown in reports and failure messages."""
    expectation: Any  # a great_expectations.expectations.Expectation


def run_checks(tables: dict, checks: list[Check], max_examples: int = 5) -> list[dict]:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = ctx.data_sources.add_pandas("envace")
    results = []
    for table, frame in tables.items():
        mine = [c for c in checks if c.table == table]
        if not mine:
            continue
        batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe(table)
        suite = ctx.suites.add(gx.ExpectationSuite(name=table))
        for c in mine:
            suite.add_expectation(c.expectation)
        validation = ctx.validation_definitions.add(gx.ValidationDefinition(name=table, data=batch, suite=suite))
        run = validation.run(
            batch_parameters={"dataframe": frame},
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": [WHERE]},
        )
        by_id = {c.expectation.id: c for c in mine}
        for r in run.results:
            check = by_id[r.expectation_config.id]
            bad = r.result.get("unexpected_index_list") or []
            results.append({
                "name": check.name,
                "table": table,
                "expectation": r.expectation_config.type,
                "column": r.expectation_config.kwargs.get("column") or r.expectation_config.kwargs.get("column_A"),
                "success": bool(r.success),
                "unexpected_count": int(r.result.get("unexpected_count") or 0),
                "observed_value": _plain(r.result.get("observed_value")),
                "examples": [str(row.get(WHERE)) for row in bad[:max_examples]],
            })
    order = {c.name: i for i, c in enumerate(checks)}
    return sorted(results, key=lambda r: order[r["name"]])


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
