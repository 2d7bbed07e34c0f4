"""gitforge as an MCP stdio server: the `Forge` tools, plus two admin tools for the
harness that are not in tools.json: `reset(scenario)` and `state()`.

Run from this folder: `python server.py`. The state is empty until the first reset.
Tool descriptions come from tools.json so the two cannot drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import FastMCP

from forge import Forge

TOOLS = json.loads((Path(__file__).parent / "tools.json").read_text(encoding="utf-8"))
DESCRIPTIONS = {t["function"]["name"]: t["function"]["description"] for t in TOOLS}

server = FastMCP("gitforge", log_level="WARNING")  # no log line per request on stderr
forge = Forge({})


def tool(fn):
    """Register `fn` under its own name with the description tools.json gives it."""
    return server.tool(name=fn.__name__, description=DESCRIPTIONS.get(fn.__name__))(fn)


# `-> dict[str, Any]` makes FastMCP 1.30 return the dict as structuredContent (and as JSON
# text); a bare `-> dict` would give the text only.


@tool
def list_repos(owner: str) -> dict[str, Any]:
    return forge.list_repos(owner)


@tool
def get_repo(repo: str) -> dict[str, Any]:
    return forge.get_repo(repo)


@tool
def get_branch(repo: str, branch: str) -> dict[str, Any]:
    return forge.get_branch(repo, branch)


@tool
def list_pull_requests(repo: str) -> dict[str, Any]:
    return forge.list_pull_requests(repo)


@tool
def get_pull_request(repo: str, number: int) -> dict[str, Any]:
    return forge.get_pull_request(repo, number)


@tool
def create_issue(repo: str, title: str, labels: list[str]) -> dict[str, Any]:
    return forge.create_issue(repo, title, labels)


@tool
def delete_branch(repo: str, branch: str) -> dict[str, Any]:
    return forge.delete_branch(repo, branch)


@tool
def merge_pull_request(repo: str, number: int) -> dict[str, Any]:
    return forge.merge_pull_request(repo, number)


@tool
def reset(scenario: dict[str, Any]) -> dict[str, Any]:
    """Admin: start a fresh episode from `scenario`."""
    global forge
    forge = Forge(scenario)
    return {"ok": True}


@tool
def state() -> dict[str, Any]:
    """Admin: the whole current state."""
    return forge.state()


if __name__ == "__main__":
    server.run("stdio")
