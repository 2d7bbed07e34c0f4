"""The rehearsal gate: per-tool rehearsal exact match against a threshold (GE suite).

One row per core tool (a tool with at least `gate.min_tool_examples` held-out calls);
`where` names the tool and its accuracy, so a failure message lists the tools that fall
short with their accuracies.
"""

from __future__ import annotations

import pandas as pd

from envace.config import GateConfig
from envace.gates import WHERE, Check


def core_tools(per_tool: dict, min_examples: int) -> dict[str, float]:
    """Exact match of the tools with enough held-out calls to be judged."""
    return {tool: r["exact"] for tool, r in per_tool.items() if r["n"] >= min_examples}


def tool_table(per_tool: dict, cfg: GateConfig) -> pd.DataFrame:
    rows = [{WHERE: f"{tool} ({exact:.3f} on {per_tool[tool]['n']} calls)", "tool": tool, "exact": exact,
             "n": per_tool[tool]["n"]}
            for tool, exact in core_tools(per_tool, cfg.min_tool_examples).items()]
    return pd.DataFrame(rows, columns=[WHERE, "tool", "exact", "n"])


def checks(cfg: GateConfig) -> list[Check]:
    import great_expectations.expectations as gxe

    return [
        Check("tools", "there is at least one core tool", gxe.ExpectTableRowCountToBeBetween(min_value=1)),
        Check("tools", f"every core tool rehearses at least {cfg.min_rehearsal_accuracy} exact match",
              gxe.ExpectColumnValuesToBeBetween(column="exact", min_value=cfg.min_rehearsal_accuracy)),
    ]
