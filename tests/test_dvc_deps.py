"""DVC dependencies complete by construction: each stage's code deps in dvc.yaml are exactly
its import closure inside the package (a package folder when all of its files are in it)."""

from __future__ import annotations

import re

import pytest
import yaml

from envace.project import DATA_DEPS, ROOT, code_deps, import_closure, pin_code_deps, with_code_deps

SPEC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def module_of(stage: dict) -> str:
    return re.search(r"python -m (\S+)", stage.get("do", stage)["cmd"]).group(1)


@pytest.mark.parametrize("name", list(SPEC))
def test_a_stages_code_deps_are_its_import_closure(name):
    stage = SPEC[name].get("do", SPEC[name])
    listed = sorted(d for d in stage["deps"] if d.startswith(("envace/", "flows/")) and d not in DATA_DEPS)
    wanted = code_deps(module_of(SPEC[name]))
    assert listed == wanted, (f"dvc.yaml stage {name}: code deps differ from its import closure; "
                              f"missing {sorted(set(wanted) - set(listed))}, not imported {sorted(set(listed) - set(wanted))}"
                              " (python -m envace.project rewrites them)")


def test_rewriting_the_code_deps_keeps_everything_else():
    text = (ROOT / "dvc.yaml").read_text()
    assert with_code_deps(text) == text  # in sync: nothing to change
    stale = text.replace("      - envace/stages/collect.py\n", "", 1).replace(
        "      - envace/paths.py\n", "      - envace/paths.py\n      - envace/act.py\n", 1)
    assert stale != text and with_code_deps(stale) == text


def test_the_closure_follows_lazy_and_relative_imports_and_the_domain_registry():
    files = import_closure("envace.stages.evaluate")
    assert "envace/stages/evaluate.py" in files and "envace/judge.py" in files  # judge: through the runner
    assert "envace/evaluate/real.py" in files  # imported inside a function
    assert {"envace/domains/bank.py", "envace/domains/files.py", "envace/domains/trading.py"} <= set(files)  # by name
    assert not any(f.startswith("envace/stages/") and f not in ("envace/stages/__init__.py", "envace/stages/evaluate.py")
                   for f in files), "a stage imports another stage"
    assert "envace/act.py" not in files and "envace/cli.py" not in files


def test_no_stage_imports_another_stage():
    for name, spec in SPEC.items():
        module = module_of(spec)
        others = [f for f in import_closure(module) if f.startswith("envace/stages/")
                  and f not in ("envace/stages/__init__.py", module.replace(".", "/") + ".py")]
        assert not others, f"stage {name} imports {others}: shared paths live in envace/paths.py, helpers in the library"


def test_the_committed_locks_pin_the_code_as_it_is():
    """dvc.lock (the repository's and the example's) hashes every code dep as the code is: a
    stale pin makes `dvc status` call stages changed that are not."""
    stale = pin_code_deps(write=False)
    assert not stale, "code deps pinned stale (python -m envace.project re-pins them):\n" + "\n".join(stale)


def test_pinning_the_code_deps_keeps_every_other_pin(tmp_path):
    import hashlib
    import shutil

    from tests.conftest import make_project

    project = make_project(tmp_path / "proj", copy_code=True)
    shutil.copy(ROOT / "dvc.lock", project / "dvc.lock")
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    deps = lock["stages"]["collect"]["deps"]
    config = next(d for d in deps if d["path"] == "envace/config.py")
    config["md5"] = "0" * 32  # the code changed since the lock was written
    deps.append({"path": "envace/gone.py", "hash": "md5", "md5": "1" * 32, "size": 1})  # no longer imported
    (project / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))

    changes = pin_code_deps(project)
    assert changes == ["dvc.lock: collect: envace/config.py re-pinned", "dvc.lock: collect: envace/gone.py dropped"]
    pinned = yaml.safe_load((project / "dvc.lock").read_text())
    fixed = next(d for d in pinned["stages"]["collect"]["deps"] if d["path"] == "envace/config.py")
    assert fixed["md5"] == hashlib.md5((project / "envace/config.py").read_bytes()).hexdigest()
    assert (project / "dvc.lock").read_text() == (ROOT / "dvc.lock").read_text()  # the rest as it was, in DVC's layout
    assert pin_code_deps(project) == []
