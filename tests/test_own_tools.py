"""Your own tools: domains as plug-ins, imported logs, MCP servers as the real backend."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from envace.data.logs import LogError, import_logs
from envace.domains import DOMAINS, DomainError, get_domain, load_domain, use_domains
from envace.domains.base import Domain, is_error
from tests.conftest import make_project, write_params

ROOT = Path(__file__).resolve().parents[1]
GITFORGE = ROOT / "examples" / "gitforge" / "domains" / "gitforge"
MAKE_LOGS = ROOT / "examples" / "gitforge" / "make_logs.py"


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Path:
    """The gitforge folder with 30 freshly produced logs."""
    folder = tmp_path_factory.mktemp("own") / "gitforge"
    shutil.copytree(GITFORGE, folder, ignore=shutil.ignore_patterns("episodes.jsonl", "__pycache__"))
    subprocess.run([sys.executable, str(MAKE_LOGS), "--episodes", "30", "--seed", "3", "--out",
                    str(folder / "episodes.jsonl")], check=True, capture_output=True)
    return folder


def lines_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- the registry

@pytest.fixture(scope="module")
def every_domain(logged) -> list[Domain]:
    return [get_domain(name) for name in DOMAINS] + [load_domain(str(logged))]


def test_contract_of_every_registered_domain(every_domain):
    """What every domain, built-in or not, must offer the pipeline."""
    from jsonschema import Draft202012Validator

    for domain in every_domain:
        names = [t.name for t in domain.tools]
        assert len(names) == len(set(names)) and names, domain.name
        for tool, schema in zip(domain.tools, domain.schemas()):
            Draft202012Validator.check_schema(tool.parameters)
            json.dumps(schema)
            assert tool.risk != "high" or tool.preconditions, f"{domain.name}.{tool.name}: high risk, no preconditions"
            for p in tool.preconditions:
                assert p.evidence is None or p.evidence["tool"] in names
        assert domain.backend_kind in ("python", "mcp", "none")
        assert (domain.logs is not None) or (domain.demonstrate is not None and domain.make_task is not None)


def test_a_domain_from_package_module_object(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(textwrap.dedent("""
        from envace.domains.base import Backend, Domain, Tool, params, STR
        class Clock(Backend):
            tools = (Tool("now", "The time.", params(), read_only=True),)
            def tool_now(self):
                return {"time": self.scenario["time"]}
        DOMAIN = Domain("clock", Clock, logs="logs.jsonl")
        NOT_A_DOMAIN = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    [clock] = use_domains(["my_tools:DOMAIN"])
    assert get_domain("clock") is clock and clock.real({"time": "9:00"}).execute({"name": "now", "arguments": {}}) \
        == {"time": "9:00"}
    with pytest.raises(DomainError, match="my_tools:NOT_A_DOMAIN.*not an envace Domain"):
        load_domain("my_tools:NOT_A_DOMAIN")
    with pytest.raises(DomainError, match="cannot load 'nowhere:DOMAIN'"):
        load_domain("nowhere:DOMAIN")
    with pytest.raises(DomainError, match="not a built-in domain"):
        load_domain("casino")
    with pytest.raises(DomainError, match="two domains are named bank"):
        use_domains(["bank", "envace.domains.bank:DOMAIN"])


def test_the_example_folder_is_a_domain_without_python(logged):
    domain = load_domain(str(logged))
    assert domain.name == "gitforge" and domain.backend_kind == "mcp" and domain.facts_from == "scenario"
    assert domain.policy and {t.name for t in domain.tools if t.risk == "high"} == {"delete_branch", "merge_pull_request"}
    logs_only = use_domains([str(logged)], real_backends=False)[0]
    assert logs_only.backend is None and logs_only.facts_from == "none"
    assert logs_only.fact_source({"repos": []}).facts({"name": "get_repo", "arguments": {"repo": "a/b"}}) is None
    use_domains([str(GITFORGE)])


# ---------------------------------------------------------------- imported logs

def test_imported_logs_become_judgeable_episodes(logged):
    from envace.data.episodes import answer_of, calls_of
    from envace.domains.base import Task
    from envace.judge import failures

    domain = load_domain(str(logged))
    episodes, report = import_logs(domain)
    raw = lines_of(logged)
    assert report["episodes"] == len(raw) == len(episodes)
    assert report["checklist_given"] == sum("checklist" in r for r in raw) and report["checklist_derived"] > 0
    for ep, line in zip(episodes, raw):
        task = ep["task"]
        assert task["domain"] == "gitforge" and task["policy"] == domain.policy and task["request"]
        assert all(m["role"] in ("user", "act", "tool") for m in ep["messages"])
        if "checklist" not in line:  # derived from the successful episode: it passes its own checklist
            assert failures(Task.from_dict(task), calls_of(ep["messages"]), answer_of(ep["messages"])) == []
            writes = [c for m in line["messages"] for c in m.get("calls", [])
                      if c["name"] not in {t.name for t in domain.tools if t.read_only}]
            assert all(w in task["checklist"]["required_calls"] for w in writes)
            if line.get("task_type") in ("is_branch_merged", "is_branch_protected"):  # a yes/no question
                assert task["checklist"]["final_answer"] in (["yes"], ["no"])
    # the derived "yes"/"no" is checked: the opposite answer fails
    question = next(ep for ep, line in zip(episodes, raw) if "checklist" not in line
                    and line.get("task_type") == "is_branch_merged")
    said = question["task"]["checklist"]["final_answer"][0]
    wrong = {"yes": "No, it is not.", "no": "Yes, it is."}[said]
    assert failures(Task.from_dict(question["task"]), calls_of(question["messages"]), wrong)


def test_a_failed_episode_without_checklist_is_left_out_and_counted(logged, tmp_path):
    folder = tmp_path / "gitforge"
    shutil.copytree(logged, folder)
    rows = lines_of(logged)
    failed = next(r for r in rows if not r["success"])
    del failed["checklist"]
    (folder / "episodes.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    episodes, report = import_logs(load_domain(str(folder)))
    assert report["dropped_unjudgeable"] == 1 and len(episodes) == len(rows) - 1


def _bad(rows: list[dict], index: int, edit) -> list:
    rows = json.loads(json.dumps(rows))
    edit(rows[index])
    return rows


def _first_call(row: dict) -> dict:
    return next(m for m in row["messages"] if "calls" in m)["calls"][0]


def _drop_first_call(row: dict) -> None:
    """The assistant message with the calls goes, its responses stay: answers to no call."""
    i = next(i for i, m in enumerate(row["messages"]) if "calls" in m)
    del row["messages"][i]


BAD_LOGS = {  # case -> (edit of line 2, or a raw text for line 2; expected message)
    "not JSON": ('{"id": "x", "success": tru', r"episodes.jsonl:2: not valid JSON"),
    "not UTF-8": (b'{"id": "\xff"}', r"episodes.jsonl:2: not UTF-8"),
    "missing field": (lambda r: r.pop("success"), r"episodes.jsonl:2: \(line\): 'success' is a required property"),
    "missing call arguments": (lambda r: _first_call(r).pop("arguments"),
                               r"episodes.jsonl:2: messages\.1\.calls\.0: 'arguments' is a required property"),
    "unknown tool": (lambda r: _first_call(r).update(name="drop_database"),
                     r"episodes.jsonl:2: messages\.1\.calls\.0\.name: unknown tool 'drop_database'"),
    "arguments break the schema": (lambda r: _first_call(r)["arguments"].update(repo=7),
                                   r"episodes.jsonl:2: messages\.1\.calls\.0\.arguments: repo: 7 is not of type 'string'"),
    "response for a call never made": (_drop_first_call,
                                       r"episodes.jsonl:2: messages\.1: a response for a call that was never made"),
    "no final answer": (lambda r: r["messages"].pop(), r"episodes.jsonl:2: messages\.\d+: the episode must end with"),
    "duplicate id": (lambda r: r.update(id="gf-00000"), r"episodes.jsonl:2: id: 'gf-00000' is already the id of line 1"),
}


@pytest.mark.parametrize("case", BAD_LOGS)
def test_bad_log_line_is_one_clear_error_and_nothing_is_written(case, logged, tmp_path, monkeypatch):
    from envace.config import parse_params
    from envace.stages import collect

    folder = tmp_path / "domains" / "gitforge"
    shutil.copytree(logged, folder)
    edit, expected = BAD_LOGS[case]
    raw = (folder / "episodes.jsonl").read_bytes().splitlines()
    raw[1] = edit if isinstance(edit, bytes) else edit.encode() if isinstance(edit, str) else \
        json.dumps(_bad(lines_of(logged), 1, edit)[1], ensure_ascii=False).encode()
    (folder / "episodes.jsonl").write_bytes(b"\n".join(raw) + b"\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LogError, match=expected):
        collect.run(parse_params({"collect": {"domains": ["domains/gitforge"]}}))
    assert not Path("data").exists() and not Path("metrics").exists()


INVALID_TOOLS = {
    "parameters not a JSON schema": (lambda t: t[1]["function"].update(parameters={"type": "objekt"}),
                                     r"tools.json:\d+: tool 'get_repo': function.parameters is not a valid JSON Schema"),
    "high risk without preconditions": (lambda t: t[6].pop("preconditions"),
                                        r"tools.json:\d+: high-risk tool 'delete_branch' must declare its preconditions"),
    "unknown precondition op": (lambda t: t[6]["preconditions"][0].update(op="~"),
                                r"tools.json:\d+: precondition .*unknown op '~'"),
    "unknown key": (lambda t: t[0].update(danger=True), r"tools.json:\d+: unknown key\(s\) danger"),
    "not JSON": ("[{", r"tools.json:1: not valid JSON"),
    "interchangeable names no parameter": (lambda t: t[1].update(interchangeable=["owner"]),
                                           r"tools.json:\d+: tool 'get_repo': interchangeable names no parameter of it: owner"),
    "interchangeable not a list": (lambda t: t[1].update(interchangeable="repo"),
                                   r"tools.json:\d+: tool 'get_repo': interchangeable is a list"),
}


@pytest.mark.parametrize("case", INVALID_TOOLS)
def test_an_invalid_tool_schema_names_file_and_line(case, logged, tmp_path):
    folder = tmp_path / "gitforge"
    shutil.copytree(logged, folder)
    edit, expected = INVALID_TOOLS[case]
    if isinstance(edit, str):
        (folder / "tools.json").write_text(edit)
    else:
        tools = json.loads((folder / "tools.json").read_text())
        assert tools[6]["function"]["name"] == "delete_branch"
        edit(tools)
        (folder / "tools.json").write_text(json.dumps(tools, indent=2))
    with pytest.raises(DomainError, match=expected):
        load_domain(str(folder))


def test_a_response_field_named_like_an_interchangeable_argument_is_renamed_too(logged, tmp_path):
    """A pull request's title in a response is the same kind of name as `create_issue`'s
    `title`: declared interchangeable there, the titles' words (their verbs too) are renamed."""
    from envace.data.logs import import_logs
    from envace.train.data import argument_names

    folder = shutil.copytree(logged, tmp_path / "gitforge")
    tools = json.loads((folder / "tools.json").read_text(encoding="utf-8"))
    for title_too in (False, True):
        for t in tools:
            if t["function"]["name"] == "create_issue":
                t["interchangeable"] = ["repo", "title"] if title_too else ["repo"]
        (folder / "tools.json").write_text(json.dumps(tools), encoding="utf-8")
        domain = load_domain(str(folder))
        episodes = import_logs(domain)[0]
        verbs = {r["title"].split()[0] for e in episodes for m in e["messages"] if m.get("role") == "tool"
                 for r in [m["response"]] if isinstance(r, dict) and "title" in r}
        assert verbs
        assert (verbs <= set(argument_names(domain, episodes)[1])) is title_too, title_too


def test_interchangeable_arguments_are_renamed_consistently_and_numbers_stay_numbers(logged):
    """The words and numbers the declared arguments take in the logs are renamed within an
    episode, the same way everywhere in it; the tools' and the policy's words never are."""
    import random

    from envace.data.logs import import_logs
    from envace.roles import MinimalTemplate
    from envace.train.data import argument_names, episode_segments, relabel

    domain = load_domain(str(logged))
    use_domains([str(logged)], logged.parent, real_backends=False)
    episodes = [e for e in import_logs(domain)[0] if any(m.get("calls") for m in e["messages"])]
    numbers, words = argument_names(domain, episodes)
    assert numbers and all(n.isdigit() for n in numbers) and words and not any(w.isdigit() for w in words)
    assert not {"repo", "branch", "merged", "protected"} & set(words)  # words of the schemas and the policy
    # a name the policy mentions is an instruction, no longer a renamable name
    (logged.parent / "with-policy").mkdir(exist_ok=True)
    folder = shutil.copytree(logged, logged.parent / "with-policy" / "gitforge", dirs_exist_ok=True)
    (folder / "policy.md").write_text(f"Never touch anything of {words[0]}.\n", encoding="utf-8")
    assert words[0] not in argument_names(load_domain(str(folder)), episodes)[1]
    episode = next(e for e in episodes if any(c["name"] == "get_pull_request" for m in e["messages"] for c in m.get("calls", [])))
    segments = episode_segments(episode, MinimalTemplate(), random.Random(0), privileged_dropout=0.0)[1]
    renamed = relabel(segments, [list(numbers), list(words)], random.Random(1))
    before, after = "".join(s.text for s in segments), "".join(s.text for s in renamed)
    assert before != after and len(before.split()) == len(after.split())
    call = next(c for m in episode["messages"] for c in m.get("calls", []) if c["name"] == "get_pull_request")
    number = str(call["arguments"]["number"])
    new = {m: n for m, n in zip(re.findall(r'"number":(\d+)', before), re.findall(r'"number":(\d+)', after))}[number]
    assert new.isdigit() and after.count(f'"number":{new}') == before.count(f'"number":{number}')


def test_a_domains_own_check_decides_success_beyond_the_checklist(logged, tmp_path):
    """gitforge's checks.py: a write made twice fails the episode, even one whose checklist holds."""
    from envace.data.episodes import answer_of, calls_of
    from envace.domains.base import Task
    from envace.judge import failures

    use_domains([str(logged)], logged.parent, real_backends=False)
    episode = next(e for e in import_logs(load_domain(str(logged)))[0]
                   if e["success"] and any(c["name"] == "create_issue" for c in calls_of(e["messages"])))
    task, calls, answer = Task.from_dict(episode["task"]), calls_of(episode["messages"]), answer_of(episode["messages"])
    assert failures(task, calls, answer) == []
    write = next(c for c in calls if c["name"] == "create_issue")
    assert failures(task, calls + [write], answer) == ["repeated write create_issue"]


@pytest.mark.parametrize("source, expected", [
    ("def check(task, calls):\n    return []\n\nraise ValueError('no')\n", r"checks.py: cannot load: ValueError: no"),
    ("CHECK = 1\n", r"checks.py: defines no function check"),
])
def test_a_bad_checks_py_is_named(logged, tmp_path, source, expected):
    folder = tmp_path / "gitforge"
    shutil.copytree(logged, folder)
    (folder / "checks.py").write_text(source)
    with pytest.raises(DomainError, match=expected):
        load_domain(str(folder))


def test_a_check_that_raises_names_its_domain(logged):
    from envace.domains.base import Task
    from envace.judge import failures

    folder = logged.parent / "raising" / "gitforge"
    shutil.copytree(logged, folder, dirs_exist_ok=True)
    (folder / "checks.py").write_text("def check(task, calls, answer):\n    return calls[5]\n")
    use_domains([str(folder)], folder.parent, real_backends=False)
    task = Task.from_dict(import_logs(get_domain("gitforge"))[0][0]["task"])
    with pytest.raises(RuntimeError, match=r"domain 'gitforge': its check raised IndexError"):
        failures(task, [], "done")
    use_domains([str(logged)], logged.parent, real_backends=False)


def test_a_bad_log_from_the_command_line_is_one_line_and_exit_1(logged, tmp_path):
    """As DVC runs it: exit code 1, one line naming file:line and field, no traceback."""
    folder = tmp_path / "domains" / "gitforge"
    shutil.copytree(logged, folder)
    with (folder / "episodes.jsonl").open("a") as f:
        f.write('{"id": "late", "success": true}\n')
    write_params(tmp_path / "params.yaml", {"collect": {"domains": ["domains/gitforge"]}})
    proc = subprocess.run([sys.executable, "-m", "envace.stages.collect"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"collect: {folder.relative_to(tmp_path)}/episodes.jsonl:31: (line): " \
                                  "'messages' is a required property"
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- MCP backend

def test_mcp_backend_gives_each_episode_its_own_state(logged):
    """Two episodes interleaved on one server: each sees its own scenario and its own calls."""
    domain = load_domain(str(logged))
    rows = [r for r in lines_of(logged) if r.get("scenario")][:2]
    a, b = (domain.real(r["scenario"]) for r in rows)
    repo_a, repo_b = (r["scenario"]["repos"][0]["name"] for r in rows)
    issue = {"name": "create_issue", "arguments": {"repo": repo_a, "title": "Flaky test", "labels": ["ci", "bug"]}}
    first = a.execute(issue)
    assert not is_error(first)
    assert b.execute({"name": "get_repo", "arguments": {"repo": repo_b}})["name"] == repo_b
    assert is_error(b.execute({"name": "get_repo", "arguments": {"repo": repo_a}})) or repo_a == repo_b
    second = a.execute(issue)
    assert second != first  # a's state kept its first issue through b's calls
    # a call that breaks tools.json never reaches the server
    assert a.execute({"name": "get_repo", "arguments": {"repo": 7}})["error"]["code"] == "invalid_arguments"
    # replaying the logged calls gives the logged responses
    row = rows[0]
    replay = domain.real(row["scenario"])
    calls = [c for m in row["messages"] for c in m.get("calls", [])]
    assert [replay.execute(c) for c in calls] == [m["response"] for m in row["messages"] if m["role"] == "tool"]


def test_mcp_server_missing_a_tool_is_named(logged, tmp_path):
    from envace.domains.mcp import McpError

    folder = tmp_path / "gitforge"
    shutil.copytree(logged, folder)
    tools = json.loads((folder / "tools.json").read_text())
    tools.append({"type": "function", "function": {"name": "fork_repo", "description": "Fork.", "parameters": {"type": "object"}}})
    (folder / "tools.json").write_text(json.dumps(tools))
    domain = load_domain(str(folder))
    with pytest.raises(McpError, match="does not serve fork_repo"):
        domain.real({}).execute({"name": "fork_repo", "arguments": {}})


def test_logs_only_tasks_cannot_be_played_for_real(logged):
    """No backend: the reason evaluate writes (tests/test_own_tools_pipeline.py runs the stage), and no backend built."""
    from envace.domains.base import NoBackend, Task
    from envace.evaluate.real import backend_kind, unavailable

    [domain] = use_domains([str(logged)], real_backends=False)
    tasks = [Task.from_dict(e["task"]) for e in import_logs(domain)[0][:5]]
    assert unavailable(tasks) == "no real backend for domain(s) gitforge (logs only)" and backend_kind(tasks) == "none"
    with pytest.raises(NoBackend, match="'gitforge' has no real backend"):
        domain.real(tasks[0].scenario)
    use_domains([str(logged)])
    assert unavailable(tasks) is None and backend_kind(tasks) == "mcp"
    use_domains([str(GITFORGE)])  # the real one back for later tests


def test_project_dvc_yaml_is_in_sync_with_the_repository():
    """examples/gitforge/dvc.yaml is the root's, re-rooted, with the domain folder as a dep of collect."""
    from envace.project import HEADER, project_dvc_yaml

    example = ROOT / "examples" / "gitforge"
    committed = (example / "dvc.yaml").read_text()
    assert committed.startswith(HEADER)
    project_dvc_yaml(example, ["domains/gitforge"])
    assert (example / "dvc.yaml").read_text() == committed, "regenerate: envace run --project-dir examples/gitforge"
    stages = yaml.safe_load(committed)["stages"]
    assert "domains/gitforge" in stages["collect"]["deps"]
    assert all(not d.startswith("envace/") for s in stages.values() for d in s.get("do", s).get("deps", []))


def test_a_project_of_its_own_leaves_python_byte_code_out_of_its_domain_folder(tmp_path):
    """A project that is its own DVC repository gets the root's byte-code rules in .dvcignore
    (once, keeping its own rules): a later stage importing the domain's modules writes
    __pycache__ into the folder, which must not leave `collect` stale."""
    from envace.project import project_dvc_yaml

    project = make_project(tmp_path / "own")
    shutil.copytree(GITFORGE, project / "domains" / "gitforge", ignore=shutil.ignore_patterns("__pycache__"))
    (project / ".dvcignore").write_text("# mine\nscratch/")  # no newline at the end
    project_dvc_yaml(project, ["domains/gitforge"])
    project_dvc_yaml(project, ["domains/gitforge"])  # again: nothing added twice
    rules = (project / ".dvcignore").read_text().splitlines()
    assert rules[:2] == ["# mine", "scratch/"] and rules.count("__pycache__/") == 1 and rules.count("*.pyc") == 1
    from dvc.repo import Repo

    cache = project / "domains" / "gitforge" / "__pycache__"
    cache.mkdir()
    (cache / "forge.cpython-311.pyc").write_bytes(b"byte code")
    with Repo(str(project)) as repo:  # DVC leaves it out of the folder it hashes
        assert repo.dvcignore.is_ignored(repo.fs, str(cache / "forge.cpython-311.pyc"))
        assert repo.dvcignore.is_ignored(repo.fs, str(cache))
        assert not repo.dvcignore.is_ignored(repo.fs, str(project / "domains" / "gitforge" / "forge.py"))


def test_a_python_backend_from_a_folder(tmp_path):
    """backend.json kind python: a Backend subclass in the folder; with facts(), REHEARSE gets them."""
    folder = tmp_path / "clock"
    folder.mkdir()
    (folder / "tools.json").write_text(json.dumps([{"type": "function", "read_only": True, "function": {
        "name": "now", "description": "The time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]))
    (folder / "clock_backend.py").write_text(textwrap.dedent("""
        from envace.domains.base import Backend
        class Clock(Backend):
            def tool_now(self, city):
                return {"city": city, "time": self.scenario[city]}
            def state(self):
                return {}
            def facts(self, call):
                return {"times": self.scenario}
    """))
    (folder / "backend.json").write_text(json.dumps({"kind": "python", "class": "clock_backend:Clock"}))
    domain = load_domain(str(folder))
    assert domain.backend_kind == "python" and domain.has_facts
    backend = domain.real({"Zürich": "9:00"})
    assert backend.execute({"name": "now", "arguments": {"city": "Zürich"}}) == {"city": "Zürich", "time": "9:00"}
    assert backend.execute({"name": "now", "arguments": {}})["error"]["code"] == "invalid_arguments"
    assert domain.fact_source({"Zürich": "9:00"}).facts({"name": "now"}) == {"times": {"Zürich": "9:00"}}
    (folder / "backend.json").write_text(json.dumps({"kind": "python", "class": "clock_backend:Nope"}))
    with pytest.raises(DomainError, match=r"backend.json: class: cannot load 'clock_backend:Nope'"):
        load_domain(str(folder))
    (folder / "backend.json").write_text(json.dumps({"kind": "grpc"}))
    with pytest.raises(DomainError, match=r"backend.json: kind must be 'mcp' or 'python', not 'grpc'"):
        load_domain(str(folder))


def test_a_copied_mcp_backend_runs_apart_from_the_original(logged):
    """What the guard table does to ask "what if this call ran": the copy's call leaves the original as it was."""
    import copy

    domain = load_domain(str(logged))
    row, repo, branch = next((r, repo, b["name"]) for r in lines_of(logged) for repo in r["scenario"]["repos"]
                             for b in repo["branches"] if not b["protected"])
    original = domain.real(row["scenario"])
    twin = copy.deepcopy(original)
    assert "deleted" in twin.execute({"name": "delete_branch", "arguments": {"repo": repo["name"], "branch": branch}})
    assert not is_error(original.execute({"name": "get_branch", "arguments": {"repo": repo["name"], "branch": branch}}))
