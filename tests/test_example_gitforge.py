"""The gitforge example domain (examples/gitforge): its logs, its MCP server and its tools.json."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from envace.domains.base import Checklist, Precondition, Task
from envace.judge import failures

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gitforge"
DOMAIN = EXAMPLE / "domains" / "gitforge"
TOOLS = json.loads((DOMAIN / "tools.json").read_text(encoding="utf-8"))
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ADMIN = {"reset", "state"}


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("gitforge") / "episodes.jsonl"
    subprocess.run([sys.executable, str(EXAMPLE / "make_logs.py"), "--episodes", "40", "--seed", "0",
                    "--first-id", "0", "--out", str(out)], check=True, capture_output=True)
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def calls_of(episode: dict) -> list[dict]:
    return [c for m in episode["messages"] for c in m.get("calls", [])]


def responses_of(episode: dict) -> list:
    return [m["response"] for m in episode["messages"] if m["role"] == "tool"]


def test_logs_validate_and_look_like_production(episodes):
    schema = json.loads((ROOT / "envace" / "schemas" / "logged_episode.schema.json").read_text())
    validator = Draft202012Validator(schema)
    for ep in episodes:
        validator.validate(ep)
    assert len(episodes) == 40 and len({ep["id"] for ep in episodes}) == 40
    rate = sum(ep["success"] for ep in episodes) / len(episodes)
    assert 0.3 <= rate <= 0.9
    assert {ep["success"] for ep in episodes} == {True, False}
    # a reviewed checklist on every failure and only there
    assert all(("checklist" in ep) != ep["success"] for ep in episodes)
    assert any(not json.dumps(ep, ensure_ascii=False).isascii() for ep in episodes)


def test_failed_episodes_fail_envaces_judge(episodes):
    """The reviewed checklist really condemns what the agent did."""
    for ep in episodes:
        if not ep["success"]:
            task = Task(ep["id"], "gitforge", ep["task_type"], "", TOOLS, ep["scenario"], Checklist(**ep["checklist"]))
            assert failures(task, calls_of(ep), ep["messages"][-1]["answer"]), ep["id"]


def test_tools_json():
    assert {t["function"]["name"]: (t["risk"], t["read_only"]) for t in TOOLS if t["risk"] == "high"} == {
        "delete_branch": ("high", False), "merge_pull_request": ("high", False)}
    for t in TOOLS:
        Draft202012Validator.check_schema(t["function"]["parameters"])
        assert t["function"]["parameters"]["additionalProperties"] is False
        # envace reads each precondition: prose, or a machine check
        checks = [Precondition(p) if isinstance(p, str) else Precondition(**p) for p in t["preconditions"]]
        assert bool(checks) == (t["risk"] == "high")


def test_logged_calls_match_tools_json(episodes):
    for ep in episodes:
        for call in calls_of(ep):
            Draft202012Validator(PARAMETERS[call["name"]]).validate(call["arguments"])


def test_the_logs_call_every_tool_so_the_gate_can_measure_each(episodes):
    """The rehearsal gate fails a tool with too few held-out calls: a tool the production
    agent never calls (get_repo and list_repos once were) could never pass it."""
    assert {call["name"] for ep in episodes for call in calls_of(ep)} == set(PARAMETERS)


def test_the_scenario_gives_rehearse_the_facts_of_every_logged_call(episodes):
    from envace.domains.base import ScenarioFacts

    for ep in episodes:
        for call in calls_of(ep):
            if ep["success"]:  # (a slip's wrong argument touches nothing)
                assert ScenarioFacts(ep["scenario"]).facts(call)["touched"], (ep["id"], call)


def test_a_list_tools_facts_are_the_collection_it_names(episodes):
    """`list_pull_requests(repo)` is shown the repo's pull requests, not its branches and
    issues: every listed pull request is there, in the order the response lists them."""
    from envace.domains.base import ScenarioFacts

    listed = [(ep, call, response) for ep in episodes if ep["success"]
              for call, response in zip(calls_of(ep), responses_of(ep)) if call["name"] == "list_pull_requests"]
    assert listed
    for ep, call, response in listed:
        (facts,) = ScenarioFacts(ep["scenario"]).facts(call)["touched"]
        assert list(facts) == ["pull_requests"], ep["id"]
        numbers = [p["number"] for p in facts["pull_requests"]]
        shown = [p["number"] for p in response["pull_requests"]]
        assert shown == [n for n in numbers if n in shown], ep["id"]


def test_a_list_tools_elements_are_narrowed_to_what_its_description_says(episodes, tmp_path):
    """"List the open pull requests of a repo (number and title)": the facts keep the open ones
    only, each with its number and title — the response itself, also where the scenario has no
    open pull request at all (`open` is a state in other logged scenarios). `get_repo` ("branch
    names") reads each branch's name, `list_repos` ("full names") each repo's."""
    from envace.domains.folder import load_folder

    folder = tmp_path / "gitforge"
    shutil.copytree(DOMAIN, folder, ignore=shutil.ignore_patterns("episodes.jsonl", "__pycache__"))
    (folder / "episodes.jsonl").write_text("".join(json.dumps(ep) + "\n" for ep in episodes), encoding="utf-8")
    domain = load_folder(folder)
    seen = set()
    for ep in episodes:
        if not ep["success"]:
            continue
        source = domain.fact_source(ep["scenario"])
        for call, response in zip(calls_of(ep), responses_of(ep)):
            touched = source.facts(call)["touched"]
            if call["name"] == "list_pull_requests":
                assert touched == [response], ep["id"]
                seen.add("empty" if not response["pull_requests"] else "listed")
            elif call["name"] == "get_repo":
                assert touched[0]["branches"] == [{"name": b} for b in response["branches"]], ep["id"]
            elif call["name"] == "list_repos":
                assert touched == [{"name": r} for r in response["repos"]], ep["id"]
    assert seen == {"empty", "listed"}
    # a scenario with no open pull request anywhere: `open` is known from the other logs
    ep, call = next((ep, c) for ep in episodes for c in calls_of(ep) if c["name"] == "list_pull_requests")
    closed = json.loads(json.dumps(ep["scenario"]).replace('"state": "open"', '"state": "closed"'))
    assert "open" not in json.dumps(closed)
    assert domain.fact_source(closed).facts(call)["touched"] == [{"pull_requests": []}]


def test_a_tool_is_shown_only_the_collections_its_description_mentions(episodes):
    """`get_repo` ("its default branch and branch names") reads the repo without its pull
    requests and issues; `list_repos` reads each repo without any of its collections."""
    from envace.domains.base import ScenarioFacts

    descriptions = {t["function"]["name"]: t["function"]["description"] for t in TOOLS}
    kept = {"get_repo": set(), "list_repos": set()}
    for ep in episodes:
        for call in calls_of(ep):
            if call["name"] in kept and ep["success"]:
                for obj in ScenarioFacts(ep["scenario"], descriptions).facts(call)["touched"]:
                    kept[call["name"]] |= {k for k, v in obj.items() if isinstance(v, (list, dict))}
    assert kept == {"get_repo": {"branches"}, "list_repos": set()}


def load_forge():
    spec = importlib.util.spec_from_file_location("gitforge_forge", DOMAIN / "forge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Forge


def result_json(result):
    # mcp 1.30: a FastMCP tool annotated `-> dict[str, Any]` returns the dict as
    # structuredContent (and the same JSON as text); a bare `-> dict` returns text only.
    if result.structuredContent is not None:
        return result.structuredContent
    return json.loads(result.content[0].text)


async def replay_over_mcp(episodes: list[dict]) -> tuple[list, list[list[tuple]]]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    server = StdioServerParameters(command=sys.executable, args=["server.py"], cwd=str(DOMAIN))
    replays = []
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = (await session.list_tools()).tools
        for ep in episodes:
            assert result_json(await session.call_tool("reset", {"scenario": ep["scenario"]})) == {"ok": True}
            got = [result_json(await session.call_tool(c["name"], c["arguments"])) for c in calls_of(ep)]
            replays.append((got, result_json(await session.call_tool("state", {}))))
    return listed, replays


def strip_titles(schema: dict) -> dict:
    """FastMCP adds titles (and leaves out additionalProperties); the rest must match."""
    props = {k: {f: v for f, v in p.items() if f != "title"} for k, p in schema["properties"].items()}
    return {"properties": props, "required": sorted(schema.get("required", []))}


def test_mcp_server_replays_logged_episodes(episodes):
    # one episode of each kind of write, each with at least one call
    chosen = [next(ep for ep in episodes if ep["task_type"] == kind and calls_of(ep))
              for kind in ("delete_branch", "merge_pull_request", "open_issue")]
    listed, replays = asyncio.run(asyncio.wait_for(replay_over_mcp(chosen), timeout=30))
    assert {t.name for t in listed} == set(PARAMETERS) | ADMIN
    for t in listed:
        if t.name not in ADMIN:
            assert strip_titles(t.inputSchema) == strip_titles(PARAMETERS[t.name]), t.name
    forge_class = load_forge()
    for ep, (got, state) in zip(chosen, replays):
        assert got == [m["response"] for m in ep["messages"] if m["role"] == "tool"], ep["id"]
        forge = forge_class(ep["scenario"])
        for c in calls_of(ep):
            getattr(forge, c["name"])(**c["arguments"])
        assert state == forge.state()
