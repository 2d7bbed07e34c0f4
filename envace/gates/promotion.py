"""The promotion gate: does the challenger replace the champion? (GE suite)

One row compares the two registered versions on the same held-out test tasks: their
success, its 95% Wilson interval, how many tasks each was scored on, and how many real
backend calls each made in training. Promotion needs every check to pass: more success
on the same number of tasks, and no more real calls in training than the champion made
(envace's promise is an agent trained without the real environment). A champion whose
training calls are unknown is not beaten by default: the check fails naming it.
"""

from __future__ import annotations

import math

import pandas as pd

from envace.evaluate import wilson
from envace.gates import WHERE, Check


def comparison(challenger: dict, champion: dict) -> pd.DataFrame:
    """challenger / champion: {"version", "success", "tasks", "real_calls"} (real_calls None
    when unknown). One row, the interval of each success alongside."""
    row = {WHERE: f"challenger v{challenger['version']} vs champion v{champion['version']}"}
    for who, d in (("challenger", challenger), ("champion", champion)):
        low, high = wilson(round(d["success"] * d["tasks"]), d["tasks"])
        row |= {f"{who}_success": d["success"], f"{who}_ci_low": low, f"{who}_ci_high": high,
                f"{who}_tasks": d["tasks"],
                f"{who}_real_calls": math.nan if d["real_calls"] is None else float(d["real_calls"])}
    return pd.DataFrame([row])


def checks() -> list[Check]:
    import great_expectations.expectations as gxe

    both = {"ignore_row_if": "neither"}  # a missing value fails the check, never skips it
    return [
        Check("promotion", "the challenger's success beats the champion's",
              gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="challenger_success", column_B="champion_success",
                                                          or_equal=False, **both)),
        Check("promotion", "both were scored on the same number of test tasks",
              gxe.ExpectColumnPairValuesToBeEqual(column_A="challenger_tasks", column_B="champion_tasks", **both)),
        Check("promotion", "the challenger made no more real calls in training than the champion",
              gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="champion_real_calls", column_B="challenger_real_calls",
                                                          or_equal=True, **both)),
    ]
