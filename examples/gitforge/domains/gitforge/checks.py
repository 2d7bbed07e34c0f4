"""gitforge's own rule, on top of each task's checklist: a write is never made twice.

A second identical create_issue opens a duplicate issue, a second delete_branch or
merge_pull_request fails loudly in production. In the real backend the final state shows it;
in an imagined (rehearsed) episode there is no state, so this check says it to the judge.
"""

import json

WRITES = ("create_issue", "delete_branch", "merge_pull_request")


def check(task, calls, answer):
    seen, reasons = set(), []
    for call in calls:
        if not isinstance(call, dict) or call.get("name") not in WRITES:
            continue
        key = json.dumps([call.get("name"), call.get("arguments")], sort_keys=True, default=str)
        if key in seen:
            reasons.append(f"repeated write {call['name']}")
        seen.add(key)
    return reasons
