"""The rehearsal gate: per-tool rehearsal exact match against a threshold (GE suite).

It fails closed: every tool the agent can call is gated — it needs at least
`gate.min_tool_examples` held-out calls *and* `gate.min_rehearsal_accuracy` exact match. A
tool too rare in the held-out data fails naming itself rather than passing unmeasured; only
the tools a user lists in `gate.exempt_tools` are left out, and the report says so.
`where` names the tool, its accuracy and its calls, so a failure lists what falls short.
"""

from __future__ import annotations

import pandas as pd

from envace.config import GateConfig
from envace.gates import WHERE, Check


def core_tools(per_tool: dict, min_examples: int) -> dict[str, float]:
    """Exact match of the tools with enough calls to be judged (warmup's per-epoch check on a
    slice of val, where rarer tools cannot be judged yet)."""
    return {tool: r["exact"] for tool, r in per_tool.items() if r["n"] >= min_examples}


def offered_tools(episodes: list[dict]) -> set[str]:
    """Every tool the agent is offered in these episodes' tasks."""
    return {t["function"]["name"] for e in episodes for t in e["task"]["tools"]}


def tool_table(per_tool: dict, offered: set[str], cfg: GateConfig) -> pd.DataFrame:
    """One row per gated tool: offered or called, not exempt; a tool never called has n = 0."""
    rows = []
    for tool in sorted((offered | set(per_tool)) - set(cfg.exempt_tools)):
        exact, n = per_tool.get(tool, {}).get("exact", 0.0), per_tool.get(tool, {}).get("n", 0)
        rows.append({WHERE: f"{tool} ({exact:.3f} on {n} calls)", "tool": tool, "exact": exact, "n": n})
    return pd.DataFrame(rows, columns=[WHERE, "tool", "exact", "n"])


def checks(cfg: GateConfig) -> list[Check]:
    import great_expectations.expectations as gxe

    return [
        Check("tools", "there is at least one gated tool", gxe.ExpectTableRowCountToBeBetween(min_value=1)),
        Check("tools", f"every tool has at least {cfg.min_tool_examples} held-out calls",
              gxe.ExpectColumnValuesToBeBetween(column="n", min_value=cfg.min_tool_examples)),
        Check("tools", f"every tool rehearses at least {cfg.min_rehearsal_accuracy} exact match",
              gxe.ExpectColumnValuesToBeBetween(column="exact", min_value=cfg.min_rehearsal_accuracy)),
    ]


def verdict(tool: str, exact: float, n: int, cfg: GateConfig) -> str:
    """The report's word for one tool: passed, failed (why) or not gated (why)."""
    if tool in cfg.exempt_tools:
        return "not gated (listed in gate.exempt_tools)"
    if n < cfg.min_tool_examples:
        return f"failed: {n} held-out calls < {cfg.min_tool_examples}"
    if exact < cfg.min_rehearsal_accuracy:
        return f"failed: {exact:.3f} < {cfg.min_rehearsal_accuracy}"
    return "passed"
