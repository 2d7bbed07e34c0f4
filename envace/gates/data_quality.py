"""The data gate: tables built from the prepared files and the expectations over them.

Tables (every row has `where` = "<file>:<line>" or a split/domain label):
- episodes: one row per line — parses, matches the log schema, id, domain, split, keys;
- calls:    one row per recorded call — names an offered tool, schema-valid arguments;
- responses: one row per tool message — a JSON object, paired with the call before it;
- keys:     one row per distinct request / scenario — how many splits it appears in;
- splits:   one row per split — size, minimum size, share error;
- domains:  one row per (split, domain) — share error against the domain's overall share.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd

from envace.config import Params
from envace.data.episodes import episode_error
from envace.data.splits import scenario_key
from envace.domains import use_domains
from envace.domains.base import argument_error, Tool
from envace.gates import WHERE, Check

SPLITS = ("train", "val", "test")


def _is_json(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def _offered_tools(task: dict) -> dict[str, Tool]:
    out = {}
    for t in task.get("tools", []):
        fn = t.get("function", {})
        if isinstance(fn.get("name"), str):
            out[fn["name"]] = Tool(fn["name"], fn.get("description", ""), fn.get("parameters", {}))
    return out


def build_tables(folder: Path, params: Params) -> dict[str, pd.DataFrame]:
    episodes, calls, responses = [], [], []
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                where = f"{path.name}:{lineno}"
                row = {WHERE: where, "file_split": split, "parses": True, "schema_error": None,
                       "id": None, "domain": None, "task_type": None, "split": None, "request": None, "scenario": None}
                try:
                    ep = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):  # not UTF-8, or not JSON: does not parse
                    episodes.append({**row, "parses": False, "matches_schema": False})
                    continue
                error = episode_error(ep)
                row.update(schema_error=error, matches_schema=error is None)
                if error is None:
                    task = ep["task"]
                    row.update(id=ep["id"], domain=task["domain"], task_type=task["task_type"],
                               split=task.get("split"), request=task["request"], scenario=scenario_key(task["scenario"]) if task["scenario"] else None)
                    calls_here, responses_here = _traffic(ep, where)
                    calls += calls_here
                    responses += responses_here
                episodes.append(row)
    episodes_df = pd.DataFrame(episodes)
    return {
        "episodes": episodes_df,
        "calls": pd.DataFrame(calls, columns=[WHERE, "tool", "offered", "arguments_valid", "problem"]),
        "responses": pd.DataFrame(responses, columns=[WHERE, "tool", "is_json", "paired_with_call"]),
        "keys": _keys(episodes_df),
        "splits": _splits(episodes_df, params),
        "domains": _domains(episodes_df),
    }


def _traffic(ep: dict, where: str) -> tuple[list[dict], list[dict]]:
    tools = _offered_tools(ep["task"])
    calls, responses, pending = [], [], []
    for m in ep["messages"]:
        if "calls" in m:
            pending = [c["name"] for c in m["calls"]]
            for c in m["calls"]:
                tool = tools.get(c["name"])
                problem = argument_error(tool, c["arguments"]) if tool else None
                calls.append({WHERE: where, "tool": c["name"], "offered": tool is not None,
                              "arguments_valid": problem is None if tool else None, "problem": problem})
        elif m.get("role") == "tool":
            expected = pending.pop(0) if pending else None
            responses.append({WHERE: where, "tool": m["name"], "is_json": _is_json(m["response"]),
                              "paired_with_call": expected == m["name"]})
    return calls, responses


def _keys(episodes: pd.DataFrame) -> pd.DataFrame:
    seen: dict[tuple, dict] = {}
    for row in episodes.itertuples():
        if row.request is None:
            continue
        for kind in ("request", "scenario"):
            if getattr(row, kind) is None:  # logs without a scenario
                continue
            key = (kind, getattr(row, kind))
            entry = seen.setdefault(key, {"kind": kind, "splits": set(), WHERE: []})
            entry["splits"].add(row.file_split)  # where it is, whatever its tag says
            entry[WHERE].append(getattr(row, WHERE))
    rows = [{"kind": e["kind"], "n_splits": len(e["splits"]), WHERE: " & ".join(e[WHERE][:3])} for e in seen.values()]
    return pd.DataFrame(rows, columns=["kind", "n_splits", WHERE])


def _splits(episodes: pd.DataFrame, params: Params) -> pd.DataFrame:
    total = max(len(episodes), 1)
    fraction = {"val": params.prepare.val_fraction, "test": params.prepare.test_fraction}
    fraction["train"] = 1 - fraction["val"] - fraction["test"]
    counts = Counter(episodes["file_split"])
    rows = [{WHERE: s, "n": counts.get(s, 0), "min_n": params.validate_data.min_split_sizes.get(s, 0),
             "share_error": abs(counts.get(s, 0) / total - fraction[s])} for s in SPLITS]
    return pd.DataFrame(rows)


def _domains(episodes: pd.DataFrame) -> pd.DataFrame:
    """Each domain's share of each split against its share of all episodes: imported logs need not
    be balanced, but every split must see the domains as the whole dataset does."""
    known = episodes.dropna(subset=["domain"])
    domains = sorted(set(known["domain"]))
    overall = Counter(known["domain"])
    per_split: dict[str, Counter] = defaultdict(Counter)
    for row in known.itertuples():
        per_split[row.file_split][row.domain] += 1
    rows = []
    for split in SPLITS:
        n = sum(per_split[split].values()) or 1
        for d in domains:
            share = overall[d] / max(len(known), 1)
            rows.append({WHERE: f"{split}/{d}", "share_error": abs(per_split[split][d] / n - share)})
    return pd.DataFrame(rows, columns=[WHERE, "share_error"])


def checks(params: Params) -> list[Check]:
    import great_expectations.expectations as gxe

    cfg = params.validate_data
    domains = [d.name for d in use_domains(params.collect.domains)]
    return [
        Check("episodes", "every line is valid JSON", gxe.ExpectColumnValuesToBeInSet(column="parses", value_set=[True])),
        Check("episodes", "every line matches the episode schema",
              gxe.ExpectColumnValuesToBeInSet(column="matches_schema", value_set=[True])),
        Check("episodes", "task ids are unique", gxe.ExpectColumnValuesToBeUnique(column="id")),
        Check("episodes", "domains are the configured ones", gxe.ExpectColumnValuesToBeInSet(column="domain", value_set=domains)),
        Check("episodes", "each task sits in the file of its split",
              gxe.ExpectColumnPairValuesToBeEqual(column_A="split", column_B="file_split", ignore_row_if="either_value_is_missing")),
        Check("calls", "every call names an offered tool", gxe.ExpectColumnValuesToBeInSet(column="offered", value_set=[True])),
        Check("calls", "every call has schema-valid arguments",
              gxe.ExpectColumnValuesToBeInSet(column="arguments_valid", value_set=[True])),
        Check("responses", "every response is a JSON value (plain text as a string)",
              gxe.ExpectColumnValuesToBeInSet(column="is_json", value_set=[True])),
        Check("responses", "every response answers the call before it",
              gxe.ExpectColumnValuesToBeInSet(column="paired_with_call", value_set=[True])),
        Check("keys", "no request or scenario is shared across splits",
              gxe.ExpectColumnValuesToBeBetween(column="n_splits", min_value=1, max_value=1)),
        Check("splits", "every split has its minimum size",
              gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="n", column_B="min_n", or_equal=True)),
        Check("splits", "split shares match the configured fractions",
              gxe.ExpectColumnValuesToBeBetween(column="share_error", max_value=cfg.max_split_share_error)),
        Check("domains", "every split holds each domain in its overall share",
              gxe.ExpectColumnValuesToBeBetween(column="share_error", max_value=cfg.max_domain_share_error)),
    ]
