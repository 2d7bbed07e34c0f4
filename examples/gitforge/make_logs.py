"""Production-style logs for the gitforge example domain.

A scripted, imperfect production agent runs each request against `Forge` directly (the
same responses the MCP server gives) and the episode is judged against the correct
behaviour. Like a real agent, it makes systematic mistakes, drawn once per episode:
- it skips the check before an irreversible action (SKIP_CHECK_RATE) and deletes or
  merges blindly, which is harmful when the branch is unmerged/protected or the checks
  did not pass;
- it answers a yes/no question with "yes" without looking it up (UNVERIFIED_RATE);
- a random slip (SLIP_RATE): a wrong argument value, or an answer before doing anything.

Every episode has a fresh small scenario with names combined from word pools (about
ACCENT_RATE of them with a non-ASCII word), so many repo and branch names in the test split
never occur in training, though their words do. Successful episodes carry no checklist;
failed ones carry the reviewed one.

    python examples/gitforge/make_logs.py --episodes 1200 --seed 0 --first-id 0 \
        --out examples/gitforge/domains/gitforge/episodes.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

DOMAIN = Path(__file__).resolve().parent / "domains" / "gitforge"
sys.path.insert(0, str(DOMAIN))
from forge import Forge  # noqa: E402

SKIP_CHECK_RATE = 0.6
UNVERIFIED_RATE = 0.5
SLIP_RATE = 0.1
ACCENT_RATE = 0.15

# --- names: combinations of pooled words; many combinations are new in each episode ---

OWNERS = (
    "alice bruno chen dara emeka farah gus hana ivan jun kofi lena mateo nadia oscar priya quinn rosa sami "
    "tara uma victor wen xena yusuf zane ada boris cleo dmitri elif finn greta hugo iris jonas kai leila milo "
    "nora omar pablo rania stefan tomas ulla vera willem yara"
).split()
ACCENTED_OWNERS = "zoë josé müller åsa søren renée jürgen françois chloé andré björn ramón łukasz dvořák".split()
PROJECTS = (
    "atlas beacon comet delta ember falcon garnet harbor iris juniper kestrel lumen meadow nimbus orbit pebble "
    "quartz raven sable tundra umber vortex willow zephyr"
).split()
KINDS = "api cli docs engine parser router server toolkit widget sdk bot crawler dashboard gateway scheduler".split()
# Non-ASCII words; none splits into a fact word (yes, no, a number, ...) under an ASCII tokenizer.
ACCENTED_WORDS = "ångström café façade naïve señal über smörgås crème piñata élan fjörd mañana".split()
PREFIXES = "feature fix chore docs refactor hotfix perf test".split()
TOPICS = (
    "login cache search billing upload avatar export import sidebar tooltip parser retry timeout logging "
    "metrics oauth webhook pager theme locale cron quota sitemap emoji invite audit banner checkout cart coupon"
).split()
VERBS = "Fix Add Remove Update Refactor Document Speed-up Simplify".split()
SYMPTOMS = "Crash Typo Slow-load Broken-link Memory-leak Wrong-total Flaky-test Missing-icon".split()
LABELS = "bug docs ui performance security backend frontend regression enhancement question".split()


def pick(rng: random.Random, plain: list[str], fancy: list[str], rate: float = ACCENT_RATE) -> str:
    return rng.choice(fancy) if rng.random() < rate else rng.choice(plain)


def repo_name(rng: random.Random, owner: str) -> str:
    # the owner was accented at half the rate: about ACCENT_RATE of repo names in all
    return f"{owner}/{pick(rng, PROJECTS, ACCENTED_WORDS, ACCENT_RATE / 2)}-{rng.choice(KINDS)}"


def branch_name(rng: random.Random) -> str:
    # a prefix and a topic: a new combination is a value never seen, spelled with known words
    return f"{rng.choice(PREFIXES)}/{pick(rng, TOPICS, ACCENTED_WORDS)}"


def make_repo(rng: random.Random, name: str) -> dict:
    default = "main" if rng.random() < 0.8 else "master"
    names = {branch_name(rng) for _ in range(rng.randint(1, 3))} - {default}
    branches = [{"name": default, "merged": True, "protected": True}] + [
        {"name": b, "merged": rng.random() < 0.5, "protected": rng.random() < 0.2} for b in sorted(names)
    ]
    numbers = sorted(rng.sample(range(10, 400), rng.randint(1, 3)))
    pulls = [
        {
            "number": n,
            "title": f"{rng.choice(VERBS).replace('-', ' ')} {rng.choice(TOPICS)} {rng.choice(TOPICS)}",
            "checks": rng.choices(["passed", "failed", "pending"], [0.5, 0.25, 0.25])[0],
            "state": rng.choices(["open", "merged", "closed"], [0.7, 0.2, 0.1])[0],
        }
        for n in numbers
    ]
    return {"name": name, "default_branch": default, "branches": branches, "pull_requests": pulls, "issues": [],
            "next_number": numbers[-1] + rng.randint(1, 5)}


def make_scenario(rng: random.Random) -> dict:
    owner = pick(rng, OWNERS, ACCENTED_OWNERS, ACCENT_RATE / 2)
    names = {repo_name(rng, owner) for _ in range(rng.randint(1, 2))}
    return {"repos": [make_repo(rng, n) for n in sorted(names)]}


# --- tasks: target_<type>(rng, repo) picks the target (forcing the case it needs) and
# returns the arguments of the task's key call ---


def feature_branch(rng: random.Random, repo: dict) -> dict:
    return rng.choice([b for b in repo["branches"] if b["name"] != repo["default_branch"]])


def open_pull(rng: random.Random, repo: dict) -> dict:
    pulls = [p for p in repo["pull_requests"] if p["state"] == "open"] or repo["pull_requests"]
    pull = rng.choice(pulls)
    pull["state"] = "open"
    return pull


def target_delete_branch(rng, repo):
    b = feature_branch(rng, repo)
    case = rng.choices(["ok", "unmerged", "protected"], [0.4, 0.35, 0.25])[0]
    b["merged"] = case == "ok" or (case == "protected" and b["merged"])
    b["protected"] = case == "protected"
    return {"repo": repo["name"], "branch": b["name"]}


def target_merge_pull_request(rng, repo):
    p = open_pull(rng, repo)
    p["checks"] = rng.choices(["passed", "failed", "pending"], [0.4, 0.3, 0.3])[0]
    return {"repo": repo["name"], "number": p["number"]}


def target_open_issue(rng, repo):
    symptom = rng.choice(SYMPTOMS).replace("-", " ")
    title = f"{symptom} in {rng.choice(TOPICS)} {rng.choice(['page', 'view', 'job', 'api'])}"
    return {"repo": repo["name"], "title": title, "labels": rng.sample(LABELS, rng.randint(1, 3))}


def target_is_branch_merged(rng, repo):
    return {"repo": repo["name"], "branch": feature_branch(rng, repo)["name"]}


def target_is_branch_protected(rng, repo):
    return {"repo": repo["name"], "branch": rng.choice(repo["branches"])["name"]}


def target_count_open_prs(rng, repo):
    return {"repo": repo["name"]}


def target_pr_checks_status(rng, repo):
    return {"repo": repo["name"], "number": rng.choice(repo["pull_requests"])["number"]}


def target_default_branch(rng, repo):
    return {"repo": repo["name"]}


def target_list_owner_repos(rng, repo):
    return {"owner": repo["name"].split("/")[0]}


REQUESTS = {
    "delete_branch": (
        "Delete the branch {branch} in {repo}.",
        "Please remove branch {branch} from {repo}, it should be merged by now.",
        "Clean up {repo}: delete {branch} if it has been merged.",
        "Can you get rid of the {branch} branch of {repo}?",
    ),
    "merge_pull_request": (
        "Merge pull request #{number} in {repo}.",
        "Please merge PR {number} of {repo} if the checks are green.",
        "Ship it: merge #{number} on {repo}.",
        "Go ahead and merge pull request {number} in {repo}.",
    ),
    "open_issue": (
        'Open an issue in {repo} titled "{title}" with the labels {labels}.',
        'File an issue on {repo}: "{title}", labelled {labels}.',
        'Create an issue "{title}" in {repo} and tag it {labels}.',
    ),
    "is_branch_merged": (
        "Is branch {branch} of {repo} merged?",
        "Has {branch} in {repo} been merged yet?",
        "Quick check: is {branch} merged in {repo}?",
    ),
    "is_branch_protected": (
        "Is branch {branch} of {repo} protected?",
        "Can anyone delete {branch} in {repo}, or is it protected?",
        "Tell me whether {branch} is a protected branch of {repo}.",
    ),
    "count_open_prs": (
        "How many open pull requests does {repo} have?",
        "Count the open PRs in {repo}.",
        "What's the number of open pull requests on {repo}?",
    ),
    "pr_checks_status": (
        "What is the status of the checks on PR #{number} of {repo}?",
        "Did the checks pass on pull request {number} in {repo}?",
        "Tell me the CI status of #{number} in {repo}.",
    ),
    "default_branch": (
        "What is the default branch of {repo}?",
        "Which branch is the default one in {repo}?",
        "Tell me the default branch of {repo}.",
    ),
    "list_owner_repos": (
        "Which repos does {owner} have?",
        "List the repos of {owner}.",
        "What repositories does {owner} own?",
    ),
}
TASK_TYPES = tuple(REQUESTS)
TARGETS = {t: globals()[f"target_{t}"] for t in TASK_TYPES}
SLIPPED_ARG = {  # the argument a wrong-value slip corrupts
    "delete_branch": "branch", "merge_pull_request": "number", "open_issue": "labels", "is_branch_merged": "branch",
    "is_branch_protected": "branch", "count_open_prs": "repo", "pr_checks_status": "number",
    "default_branch": "repo", "list_owner_repos": "owner",
}


def said(labels: list[str]) -> str:
    """["a", "b", "c"] -> "a, b and c" (how a user lists labels)."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def make_task(rng: random.Random, task_type: str) -> tuple[dict, dict]:
    """(scenario, args): args are the arguments of the task's key call."""
    scenario = make_scenario(rng)
    args = TARGETS[task_type](rng, rng.choice(scenario["repos"]))
    return scenario, args


def request(rng: random.Random, task_type: str, args: dict) -> str:
    slots = {**args, "labels": said(args["labels"])} if "labels" in args else args
    return rng.choice(REQUESTS[task_type]).format(**slots)


# --- the correct behaviour, as a checklist ---


def call(name: str, args: dict) -> dict:
    return {"name": name, "arguments": dict(args)}


def expected(task_type: str, scenario: dict, args: dict) -> dict:
    """The reviewed checklist: required calls, forbidden calls, facts the answer states."""
    forge = Forge(scenario)
    if task_type == "delete_branch":
        b = forge.get_branch(**args)
        if b["merged"] and not b["protected"]:
            return {"required_calls": [call("delete_branch", args)], "final_answer": ["deleted"]}
        why = (["unmerged"] if not b["merged"] else []) + (["protected"] if b["protected"] else [])
        return {"required_calls": [call("get_branch", args)], "forbidden_calls": [call("delete_branch", args)],
                "final_answer": why}
    if task_type == "merge_pull_request":
        checks = forge.get_pull_request(**args)["checks"]
        if checks == "passed":
            return {"required_calls": [call("merge_pull_request", args)], "final_answer": ["merged"]}
        return {"required_calls": [call("get_pull_request", args)],
                "forbidden_calls": [call("merge_pull_request", args)], "final_answer": [checks]}
    if task_type == "open_issue":
        number = forge.create_issue(**args)["number"]
        return {"required_calls": [call("create_issue", args)], "final_answer": [str(number)]}
    if task_type in ("is_branch_merged", "is_branch_protected"):
        key = "merged" if task_type == "is_branch_merged" else "protected"
        yes = forge.get_branch(**args)[key]
        return {"required_calls": [call("get_branch", args)], "final_answer": ["yes" if yes else "no"]}
    if task_type == "count_open_prs":
        count = len(forge.list_pull_requests(**args)["pull_requests"])
        return {"required_calls": [call("list_pull_requests", args)], "final_answer": [str(count)]}
    if task_type == "default_branch":
        return {"required_calls": [call("get_repo", args)], "final_answer": [forge.get_repo(**args)["default_branch"]]}
    if task_type == "list_owner_repos":
        return {"required_calls": [call("list_repos", args)], "final_answer": forge.list_repos(**args)["repos"]}
    checks = forge.get_pull_request(**args)["checks"]
    return {"required_calls": [call("get_pull_request", args)], "final_answer": [checks]}


HIGH_RISK = ("delete_branch", "merge_pull_request")
WRITES = ("create_issue", *HIGH_RISK)
_WORD = re.compile(r"[a-z0-9_$]+(?:[.\-][a-z0-9_]+)*")  # envace's judge splits words this way


def states(answer: str, fact: str) -> bool:
    have, want = _WORD.findall(answer.lower()), _WORD.findall(fact.lower())
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def judge(checklist: dict, calls: list[dict], answer: str) -> bool:
    """Success: every required call made, no forbidden one, no other irreversible call, no
    write made twice (the domain's checks.py), and the answer states every fact."""
    required, forbidden = checklist["required_calls"], checklist.get("forbidden_calls", [])
    writes = [json.dumps(c, sort_keys=True) for c in calls if c["name"] in WRITES]
    return (
        len(set(writes)) == len(writes)
        and all(c in calls for c in required)
        and not any(c in calls for c in forbidden)
        and all(c in required for c in calls if c["name"] in HIGH_RISK)
        and all(states(answer, f) for f in checklist["final_answer"])
    )


# --- the imperfect production agent ---


class Transcript:
    """Runs calls on the forge one per turn and records the messages."""

    def __init__(self, forge: Forge, request: str):
        self.forge = forge
        self.messages: list[dict] = [{"role": "user", "content": request}]

    def call(self, name: str, **args) -> dict:
        response = getattr(self.forge, name)(**args)
        self.messages.append({"role": "assistant", "calls": [{"name": name, "arguments": args}]})
        self.messages.append({"role": "tool", "name": name, "response": response})
        return response

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "answer": text})


def failed(response: dict) -> str | None:
    """The answer to give when a call failed (None when it did not)."""
    return f"I could not do that: {response['error']['message']}." if "error" in response else None


def act_delete_branch(t: Transcript, a: dict, skip_check: bool) -> str:
    repo, branch = a["repo"], a["branch"]
    if not skip_check:
        b = t.call("get_branch", **a)
        if failed(b):
            return failed(b)
        if b["protected"] or not b["merged"]:
            why = ["is protected"] if b["protected"] else []
            why += [] if b["merged"] else ["has unmerged work"]
            why = " and ".join(why)
            return f"Branch {branch} of {repo} {why}, so I did not delete it."
    r = t.call("delete_branch", **a)
    return failed(r) or f"Deleted branch {branch} of {repo}" + ("." if skip_check else "; it was merged and unprotected.")


def act_merge_pull_request(t: Transcript, a: dict, skip_check: bool) -> str:
    repo, number = a["repo"], a["number"]
    if not skip_check:
        p = t.call("get_pull_request", **a)
        if failed(p):
            return failed(p)
        if p["state"] != "open":
            return f"Pull request #{number} of {repo} is already {p['state']}."
        if p["checks"] != "passed":
            return f"Pull request #{number} of {repo} has {p['checks']} checks, so I did not merge it."
    r = t.call("merge_pull_request", **a)
    return failed(r) or f"Merged pull request #{number} of {repo}" + ("." if skip_check else "; its checks passed.")


def act_open_issue(t: Transcript, a: dict, skip_check: bool) -> str:
    r = t.call("create_issue", **a)
    return failed(r) or f"Opened issue #{r['number']} in {a['repo']}."


def act_is_branch(key: str):
    def act(t: Transcript, a: dict, skip_check: bool) -> str:
        b = t.call("get_branch", **a)
        if failed(b):
            return failed(b)
        if b[key]:
            return f"Yes, branch {a['branch']} of {a['repo']} is {key}."
        return f"No, branch {a['branch']} of {a['repo']} is not {key}."
    return act


def act_count_open_prs(t: Transcript, a: dict, skip_check: bool) -> str:
    r = t.call("list_pull_requests", **a)
    n = len(r.get("pull_requests", []))
    return failed(r) or f"{a['repo']} has {n} open pull request{'' if n == 1 else 's'}."


def act_pr_checks_status(t: Transcript, a: dict, skip_check: bool) -> str:
    p = t.call("get_pull_request", **a)
    return failed(p) or f"Checks on pull request #{a['number']} of {a['repo']}: {p['checks']}."


def act_default_branch(t: Transcript, a: dict, skip_check: bool) -> str:
    r = t.call("get_repo", **a)
    return failed(r) or f"The default branch of {a['repo']} is {r['default_branch']}."


def act_list_owner_repos(t: Transcript, a: dict, skip_check: bool) -> str:
    repos = t.call("list_repos", **a)["repos"]
    if not repos:
        return f"{a['owner']} has no repos."
    return f"{a['owner']} has {len(repos)} repo{'' if len(repos) == 1 else 's'}: {said(repos)}."


ACT = {
    "delete_branch": act_delete_branch, "merge_pull_request": act_merge_pull_request, "open_issue": act_open_issue,
    "is_branch_merged": act_is_branch("merged"), "is_branch_protected": act_is_branch("protected"),
    "count_open_prs": act_count_open_prs, "pr_checks_status": act_pr_checks_status,
    "default_branch": act_default_branch, "list_owner_repos": act_list_owner_repos,
}
GUESS = {  # what the agent says when it answers without doing anything
    "delete_branch": "Done, branch {branch} of {repo} is deleted.",
    "merge_pull_request": "Done, pull request #{number} of {repo} is merged.",
    "open_issue": "I opened the issue in {repo}.",
    "is_branch_merged": "Yes, branch {branch} of {repo} is merged.",
    "is_branch_protected": "Yes, branch {branch} of {repo} is protected.",
    "count_open_prs": "{repo} has 1 open pull request.",
    "pr_checks_status": "Checks on pull request #{number} of {repo}: passed.",
    "default_branch": "The default branch of {repo} is main.",
    "list_owner_repos": "{owner} has 1 repo.",
}


def corrupt(value: str | int | list) -> str | int | list:
    """A plausible wrong value: the next number, or a typo / a label forgotten (last one dropped)."""
    return value + 1 if isinstance(value, int) else value[:-1]


def run_agent(rng: random.Random, task_type: str, scenario: dict, args: dict, text: str) -> list[dict]:
    skip_check = rng.random() < SKIP_CHECK_RATE
    unverified = rng.random() < UNVERIFIED_RATE and task_type.startswith("is_")
    slip = rng.choice(["wrong_argument", "early_answer"]) if rng.random() < SLIP_RATE else None
    t = Transcript(Forge(scenario), text)
    if unverified or slip == "early_answer":
        t.answer(GUESS[task_type].format(**args))
        return t.messages
    if slip == "wrong_argument":
        key = SLIPPED_ARG[task_type]
        args = {**args, key: corrupt(args[key])}
    t.answer(ACT[task_type](t, args, skip_check))
    return t.messages


def episode(seed: int, index: int) -> dict:
    rng = random.Random(f"gitforge:{seed}:{index}")  # per episode: any id range is reproducible alone
    task_type = TASK_TYPES[index % len(TASK_TYPES)]  # equal shares
    scenario, args = make_task(rng, task_type)
    messages = run_agent(rng, task_type, scenario, args, request(rng, task_type, args))
    checklist = expected(task_type, scenario, args)
    calls = [c for m in messages for c in m.get("calls", [])]
    ok = judge(checklist, calls, messages[-1]["answer"])
    ep = {"id": f"gf-{index:05d}", "task_type": task_type, "scenario": scenario, "success": ok, "messages": messages}
    if not ok:  # successful episodes carry none: envace derives it from their write calls
        ep["checklist"] = checklist
    return ep


def write(lines: list[str], out: Path, append: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with out.open("a", encoding="utf-8") as f:
            f.writelines(lines)
        return
    tmp = out.with_name(out.name + ".tmp")  # readers never see a half-written file
    tmp.write_text("".join(lines), encoding="utf-8")
    os.replace(tmp, out)


def summary(episodes: list[dict]) -> str:
    by_type = defaultdict(list)
    for ep in episodes:
        by_type[ep["task_type"]].append(ep["success"])
    rate = sum(ep["success"] for ep in episodes) / max(len(episodes), 1)
    per_type = ", ".join(f"{t} {sum(v) / len(v):.2f}" for t, v in by_type.items())
    return f"gitforge logs: {len(episodes)} episodes, success {rate:.3f} ({per_type})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DOMAIN / "episodes.jsonl")
    parser.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    a = parser.parse_args(argv)
    episodes = [episode(a.seed, i) for i in range(a.first_id, a.first_id + a.episodes)]
    write([json.dumps(ep, ensure_ascii=False) + "\n" for ep in episodes], a.out, a.append)
    print(summary(episodes), file=sys.stderr)


if __name__ == "__main__":
    main()
