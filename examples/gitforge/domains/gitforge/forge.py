"""gitforge: a small code-hosting service (repos, branches, pull requests, issues).

Pure Python and deterministic: `Forge(scenario)` holds the whole state, one method per
tool returns a JSON-able dict, and errors come back as `{"error": {"code", "message"}}`
(never raised) because that is what the agent sees from the real service.

Scenario (and `state()`):
    {"repos": [{"name": "owner/repo", "default_branch": "main",
                "branches": [{"name": "main", "merged": true, "protected": true}, ...],
                "pull_requests": [{"number": 12, "title": "...", "checks": "passed", "state": "open"}, ...],
                "issues": [{"number": 13, "title": "...", "labels": ["bug"], "state": "open"}, ...]}]}

Two tools are irreversible: `delete_branch` and `merge_pull_request`. Like a real forge,
the API only refuses what it must (a protected branch, a PR that is not open); whether
the branch was merged or the checks passed is for the caller to check first.
"""

from __future__ import annotations

import copy


def error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


class Forge:
    def __init__(self, scenario: dict):
        self.repos: list[dict] = copy.deepcopy(scenario.get("repos", []))

    def state(self) -> dict:
        return {"repos": copy.deepcopy(self.repos)}

    # --- lookups of the state (None when absent) ---

    def _repo(self, repo: str) -> dict | None:
        return next((r for r in self.repos if r["name"] == repo), None)

    @staticmethod
    def _branch(repo: dict, branch: str) -> dict | None:
        return next((b for b in repo["branches"] if b["name"] == branch), None)

    @staticmethod
    def _pull(repo: dict, number: int) -> dict | None:
        return next((p for p in repo["pull_requests"] if p["number"] == number), None)

    # --- read-only tools ---

    def list_repos(self, owner: str) -> dict:
        return {"repos": [r["name"] for r in self.repos if r["name"].split("/")[0] == owner]}

    def get_repo(self, repo: str) -> dict:
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        return {"name": r["name"], "default_branch": r["default_branch"], "branches": [b["name"] for b in r["branches"]]}

    def get_branch(self, repo: str, branch: str) -> dict:
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        b = self._branch(r, branch)
        if b is None:
            return error("branch_not_found", f"no branch {branch} in {repo}")
        return {"name": b["name"], "merged": b["merged"], "protected": b["protected"]}

    def list_pull_requests(self, repo: str) -> dict:
        """The open pull requests only (as a forge lists them by default)."""
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        return {"pull_requests": [{"number": p["number"], "title": p["title"]}
                                  for p in r["pull_requests"] if p["state"] == "open"]}

    def get_pull_request(self, repo: str, number: int) -> dict:
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        p = self._pull(r, number)
        if p is None:
            return error("pull_request_not_found", f"no pull request #{number} in {repo}")
        return {"number": p["number"], "title": p["title"], "checks": p["checks"], "state": p["state"]}

    # --- writes ---

    def create_issue(self, repo: str, title: str, labels: list[str]) -> dict:
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        if not title.strip():
            return error("invalid_title", "an issue needs a title")
        # issues and pull requests share one sequence of numbers, as on GitHub: the repo's counter
        number = r.get("next_number") or 1 + max((x["number"] for x in r["pull_requests"] + r["issues"]), default=0)
        r["next_number"] = number + 1
        r["issues"].append({"number": number, "title": title, "labels": list(labels), "state": "open"})
        return {"number": number}

    def delete_branch(self, repo: str, branch: str) -> dict:
        """Irreversible. Refused only for a protected branch: unmerged work is lost."""
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        b = self._branch(r, branch)
        if b is None:
            return error("branch_not_found", f"no branch {branch} in {repo}")
        if b["protected"]:
            return error("branch_protected", f"branch {branch} is protected")
        r["branches"].remove(b)
        return {"deleted": branch}

    def merge_pull_request(self, repo: str, number: int) -> dict:
        """Irreversible. Refused only when the PR is not open: failing checks do not stop it."""
        r = self._repo(repo)
        if r is None:
            return error("repo_not_found", f"no repo {repo}")
        p = self._pull(r, number)
        if p is None:
            return error("pull_request_not_found", f"no pull request #{number} in {repo}")
        if p["state"] != "open":
            return error("not_open", f"pull request #{number} is {p['state']}")
        p["state"] = "merged"
        return {"number": number, "state": "merged"}
