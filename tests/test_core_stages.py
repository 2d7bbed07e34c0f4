"""The warmup, rehearsal_gate, train and evaluate stages end to end on the tiny profile (real entry points)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envace.stages import StageFailed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warmed(prepared_dir, tmp_path_factory):
    """collect + prepare (shared) + base_model + warmup on the tiny profile, in a private copy."""
    from envace.config import parse_params
    from envace.stages import base_model, warmup
    from tests.conftest import TINY_PARAMS, write_params

    root = tmp_path_factory.mktemp("warmed")
    shutil.copytree(prepared_dir / "data", root / "data")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        base_model.run(parse_params(TINY_PARAMS))
        warmup.run(parse_params(TINY_PARAMS))
    finally:
        os.chdir(cwd)
    return root


def test_warmup_writes_model_metrics_plots_and_checkpoint(warmed):
    from envace.model import load

    metrics = json.loads((warmed / "metrics/warmup.json").read_text())
    assert metrics["epochs"] == 1 and "wall_s" not in metrics  # timings stay out of the tracked metrics
    assert json.loads((warmed / "timings/warmup.json").read_text())["wall_s"] > 0
    assert 0.0 <= metrics["real_success"] <= 1.0 and metrics["real"]["n"] == 12
    # the held-out subset spreads over every domain; an untrained ACT's failures are recorded
    assert {k.split("/")[0] for k in metrics["real"]["per_task_type"]} == {"bank", "files", "trading"}
    assert sum(metrics["real"]["failed_steps"].values()) + round(metrics["real_success"] * 12) <= 12
    assert (warmed / "plots/warmup_steps.csv").read_text().startswith("step,act_loss,rehearse_loss")
    assert (warmed / "plots/warmup_epochs.csv").read_text().startswith("epoch,val_rehearsal_exact")
    assert not (warmed / "checkpoints/warmup").exists()  # removed once the model is written
    model, tok = load(warmed / "models/warmup")
    assert model.config.hidden_size == 32 and tok.padding_side == "left"


def _gate(warmed, monkeypatch, threshold, **gate):
    from envace.config import parse_params
    from envace.stages import rehearsal_gate
    from tests.conftest import TINY_PARAMS, write_params

    monkeypatch.chdir(warmed)
    params = json.loads(json.dumps(TINY_PARAMS))
    params["gate"].update(min_rehearsal_accuracy=threshold, **gate)
    return rehearsal_gate.run(parse_params(params))


def test_rehearsal_gate_reports_with_and_without_privileged_facts(warmed, monkeypatch):
    _gate(warmed, monkeypatch, 0.0)
    r = json.loads((warmed / "metrics/rehearsal.json").read_text())
    assert r["passed"] is True and r["threshold"] == 0.0
    assert set(r["per_tool"]) >= {"find_account", "get_balance", "find_folder"}
    assert 0 <= r["overall"] <= 1 and 0 <= r["overall_without_privileged"] <= 1
    assert r["calls"] == sum(d["n"] for d in r["per_tool_detail"].values())
    assert "# Rehearsal gate: PASSED" in (warmed / "reports/rehearsal_gate.md").read_text()


def test_rehearsal_gate_above_one_fails_naming_the_tools(warmed, monkeypatch):
    with pytest.raises(StageFailed, match=r"rehearsal gate failed: .*find_account \(\d\.\d{3} < 1.01\)"):
        _gate(warmed, monkeypatch, 1.01)
    r = json.loads((warmed / "metrics/rehearsal.json").read_text())
    assert r["passed"] is False
    assert "# Rehearsal gate: FAILED" in (warmed / "reports/rehearsal_gate.md").read_text()


def test_rehearsal_gate_fails_closed_on_tools_too_rare_to_measure(warmed, monkeypatch):
    """A perfect score does not pass a tool measured on too few calls; every offered tool is
    gated, a tool never called in the held-out data too (0 calls)."""
    from envace.domains import get_domain

    with pytest.raises(StageFailed, match=r"find_account \(\d+ held-out calls < 100000\)"):
        _gate(warmed, monkeypatch, 0.0, min_tool_examples=100000)
    r = json.loads((warmed / "metrics/rehearsal.json").read_text())
    offered = {t.name for d in ("bank", "files", "trading") for t in get_domain(d).tools}
    assert set(r["verdicts"]) == offered and set(r["core_tools"]) == offered
    assert all(v.startswith("failed: ") and "held-out calls < 100000" in v for v in r["verdicts"].values())
    assert "| failed: " in (warmed / "reports/rehearsal_gate.md").read_text()


def test_rehearsal_gate_exempts_only_named_tools_and_says_so(warmed, monkeypatch):
    _gate(warmed, monkeypatch, 0.0, min_tool_examples=0, exempt_tools=["get_account_info"])
    r = json.loads((warmed / "metrics/rehearsal.json").read_text())
    assert r["verdicts"]["get_account_info"] == "not gated (listed in gate.exempt_tools)"
    assert "get_account_info" not in r["core_tools"] and r["verdicts"]["find_account"] == "passed"
    with pytest.raises(StageFailed, match=r"gate.exempt_tools names get_acount_info: not a tool"):
        _gate(warmed, monkeypatch, 0.0, exempt_tools=["get_acount_info"])


def test_rehearsal_gate_entry_point_exits_nonzero(warmed, tmp_path):
    from tests.conftest import TINY_PARAMS, write_params

    params = json.loads(json.dumps(TINY_PARAMS))
    params["gate"]["min_rehearsal_accuracy"] = 1.01
    write_params(tmp_path / "p.yaml", params)
    out = subprocess.run([sys.executable, "-m", "envace.stages.rehearsal_gate", "--params", str(tmp_path / "p.yaml")],
                         cwd=warmed, capture_output=True, text=True)
    assert out.returncode == 1 and "rehearsal gate failed: " in out.stderr and "< 1.01)" in out.stderr


def _train_entry(warmed, tmp_path, variant):
    from tests.conftest import TINY_PARAMS, write_params

    write_params(tmp_path / "params.yaml", TINY_PARAMS)
    return subprocess.run([sys.executable, "-m", "envace.stages.train", "--params", str(tmp_path / "params.yaml"),
                           "--variant", variant], cwd=warmed, capture_output=True, text=True)


def test_train_envace_runs_on_rehearsals_only_and_updates_the_warmup_model(warmed, tmp_path):
    """The stage as DVC runs it: no real call in training, and the written model is the warmup
    model moved by GRPO (that rewards move the weights is tests/test_grpo.py's; that it helps,
    the evaluation's)."""
    import torch

    from envace.model import load

    proc = _train_entry(warmed, tmp_path, "envace")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads((warmed / "metrics/train/envace.json").read_text())
    assert m["steps"] == 2 and m["real_env_calls_train"] == 0 and len(m["history"]) == 2
    assert {"reward", "success", "kl", "leak_rate", "adv_act_abs", "adv_rehearse_abs"} <= set(m["history"][0])
    assert all(h["real_calls"] == 0 for h in m["history"])
    model, _ = load(warmed / "models/train/envace")
    start, _ = load(warmed / "models/warmup")
    assert model.config.hidden_size == 32
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), start.state_dict().values()))


def test_train_sft_is_the_warmup_model_and_unknown_variants_are_refused(warmed, tmp_path):
    proc = _train_entry(warmed, tmp_path, "sft")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((warmed / "metrics/train/sft.json").read_text())["steps"] == 0
    assert (warmed / "models/train/sft/model.safetensors").read_bytes() == \
        (warmed / "models/warmup/model.safetensors").read_bytes()
    proc = _train_entry(warmed, tmp_path, "sim")
    assert proc.returncode != 0 and "invalid choice: 'sim'" in proc.stderr


def test_rl_variants_share_one_supervised_start_and_train_as_if_each_ran_it(warmed, tmp_path):
    """The first RL variant saves ACT's supervised start; the next loads it and ends with the
    same model and metrics, byte for byte, as a run that did the start itself. A damaged saved
    start is run again, a start saved from other params is never read, and a killed writer's
    temp is cleared."""
    from envace.config import parse_params
    from envace.stages.train import SHARED_START, start_stamp
    from tests.conftest import TINY_PARAMS

    after, alone = tmp_path / "after", tmp_path / "alone"
    for d in (after, alone):
        shutil.copytree(warmed / "data", d / "data")
        shutil.copytree(warmed / "models/warmup", d / "models/warmup")
    params = _params_file(tmp_path)
    cmd = [sys.executable, "-m", "envace.stages.train", "--params", str(params), "--variant"]
    first = subprocess.run([*cmd, "simulator"], cwd=after, capture_output=True, text=True)
    assert first.returncode == 0 and "supervised start of ACT on 32" in first.stdout, first.stderr[-2000:]
    second = subprocess.run([*cmd, "envace"], cwd=after, capture_output=True, text=True)
    assert second.returncode == 0 and "supervised start of ACT loaded from" in second.stdout, second.stderr[-2000:]
    assert len(list((after / SHARED_START).iterdir())) == 1

    cwd = os.getcwd()
    os.chdir(alone)
    try:  # the stamp this run will look for, and one from other params
        stamp = start_stamp(parse_params(TINY_PARAMS))
        assert stamp != start_stamp(parse_params({**TINY_PARAMS, "train": {**TINY_PARAMS["train"], "memory_examples": 33}}))
    finally:
        os.chdir(cwd)
    (alone / SHARED_START).mkdir(parents=True)
    (alone / SHARED_START / f"{stamp}.pt").write_bytes(b"half a file")
    (alone / SHARED_START / "other-params.pt").write_bytes(b"from other params")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (alone / SHARED_START / f"{stamp}.{int(dead.stdout)}.tmp").write_bytes(b"a killed writer's")
    (alone / SHARED_START / f"{stamp}.{os.getpid()}.tmp").write_bytes(b"a live writer's")  # another rank, say
    only = subprocess.run([*cmd, "envace"], cwd=alone, capture_output=True, text=True)
    assert only.returncode == 0 and "is unreadable (" in only.stdout, only.stderr[-2000:]
    assert "supervised start of ACT on 32" in only.stdout
    # the other stamp's file and the dead writer's temp removed; the live writer's temp kept
    assert sorted(f.name for f in (alone / SHARED_START).iterdir()) == sorted([f"{stamp}.pt", f"{stamp}.{os.getpid()}.tmp"])

    for tracked in ("models/train/envace/model.safetensors", "metrics/train/envace.json"):
        assert (after / tracked).read_bytes() == (alone / tracked).read_bytes(), tracked


def _params_file(tmp_path, **sections):
    from tests.conftest import TINY_PARAMS, write_params

    params = json.loads(json.dumps(TINY_PARAMS))
    for name, values in sections.items():
        params[name].update(values)
    return write_params(tmp_path / "params.yaml", params)


def assert_after_is_measured_on_the_saved_model(root: Path, params_file: Path) -> None:
    """`after` reuses the last epoch's check (taken on the final weights): it must equal measuring
    the saved model afresh."""
    from envace.config import load_params
    from envace.data.splits import spread
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.io import read_jsonl
    from envace.rollout.runner import load_policy

    params = load_params(params_file)
    policy = load_policy(root / "models/warmup", params.trainer, params.model.max_seq_len)
    check = spread(list(read_jsonl(root / "data/prepared/val.jsonl")), params.warmup.check_episodes)
    acc = rehearsal_accuracy(policy, check, privileged=True, max_new_tokens=params.rollout.max_new_tokens)
    after = json.loads((root / "metrics/warmup.json").read_text())["after"]
    assert (after["rehearsal_exact"], after["rehearsal_parse_rate"]) == (acc["exact"], acc["parse_rate"])
    assert after["rehearsal_exact_per_tool"] == {t: r["exact"] for t, r in acc["per_tool"].items()}


def kill_at_checkpoint_and_rerun(cmd: list[str], root: Path, checkpoint: str, output: str, resumed: str) -> None:
    """Start `cmd`, kill -9 it as soon as its first checkpoint exists, run it again: it must
    resume, finish, and remove its checkpoints (no `.part` left)."""
    import signal
    import time

    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = root / checkpoint
    while not last.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the stage finished before it could be killed"
    assert not (root / output).exists()
    again = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert resumed in again.stdout
    assert not last.parent.exists() and not list(root.rglob("*.part"))  # removed once the stage finished


def test_train_killed_mid_run_resumes_from_its_checkpoint(warmed, tmp_path):
    fresh, killed = tmp_path / "fresh", tmp_path / "killed"
    for d in (fresh, killed):
        shutil.copytree(warmed / "data", d / "data")
        shutil.copytree(warmed / "models/warmup", d / "models/warmup")
    params = _params_file(tmp_path, train={"steps": 6})
    cmd = [sys.executable, "-m", "envace.stages.train", "--params", str(params), "--variant", "envace"]
    assert subprocess.run(cmd, cwd=fresh, capture_output=True, text=True).returncode == 0

    kill_at_checkpoint_and_rerun(cmd, killed, "checkpoints/train/envace/last.ckpt", "models/train/envace",
                                 "train[envace]: resuming from checkpoint")

    # same seed -> the same metrics file, byte for byte, whether or not the run was interrupted
    assert len(json.loads((killed / "metrics/train/envace.json").read_text())["history"]) == 6
    assert (killed / "metrics/train/envace.json").read_text() == (fresh / "metrics/train/envace.json").read_text()
    assert len(json.loads((killed / "timings/train@envace.json").read_text())["tokens_per_s"]) == 6
    assert (killed / "models/train/envace/model.safetensors").read_bytes() == \
        (fresh / "models/train/envace/model.safetensors").read_bytes()


def test_warmup_killed_mid_run_resumes_and_ends_as_an_uninterrupted_run(warmed, tmp_path):
    """kill -9 after an epoch's checkpoint: the rerun resumes there, and its weights, epoch
    curve and step curve equal an uninterrupted run's."""
    fresh, killed = tmp_path / "fresh", tmp_path / "killed"
    for d in (fresh, killed):
        shutil.copytree(warmed / "data", d / "data")
        shutil.copytree(warmed / "models/base", d / "models/base")
    params = _params_file(tmp_path, warmup={"max_epochs": 4, "min_epochs": 4, "eval_tasks": 4})
    cmd = [sys.executable, "-m", "envace.stages.warmup", "--params", str(params)]
    done = subprocess.run(cmd, cwd=fresh, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # a quiet terminal under `dvc repro` too: the stage's epoch lines, none of the libraries' start-up notes
    said = done.stdout + done.stderr
    chatter = ("Tip:", "GPU available", "LeafSpec", "┏", "Total params", "MLflow database", "not found. Creating it")
    assert "epoch 1 (" in said and not [c for c in chatter if c in said], said[-3000:]

    kill_at_checkpoint_and_rerun(cmd, killed, "checkpoints/warmup/last.ckpt", "models/warmup",  # after epoch 1
                                 "warmup: resuming from checkpoint")

    assert json.loads((killed / "metrics/warmup.json").read_text())["epochs"] == 4
    for tracked in ("metrics/warmup.json", "plots/warmup_epochs.csv", "plots/warmup_steps.csv"):  # no timings in them
        assert (killed / tracked).read_text() == (fresh / tracked).read_text(), tracked
    assert len(json.loads((killed / "timings/warmup.json").read_text())["epoch_seconds"]) == 4
    assert_after_is_measured_on_the_saved_model(fresh, params)
    assert (killed / "models/warmup/model.safetensors").read_bytes() == \
        (fresh / "models/warmup/model.safetensors").read_bytes()


def test_train_starts_over_when_the_checkpoint_is_from_other_params(warmed, tmp_path):
    from envace.config import parse_params
    from envace.paths import WARMUP_MODEL
    from envace.train.checkpoint import fingerprint, resumable
    from tests.conftest import TINY_PARAMS, write_params

    ckpt = tmp_path / "envace"
    ckpt.mkdir()
    (ckpt / "last.ckpt").write_bytes(b"from another run")
    (ckpt / "fingerprint").write_text("other")
    cwd = os.getcwd()
    os.chdir(warmed)
    try:
        stamp = fingerprint(parse_params(TINY_PARAMS), ("train", "model"), [WARMUP_MODEL])
        assert stamp != fingerprint(parse_params({**TINY_PARAMS, "train": {"steps": 3}}), ("train", "model"), [WARMUP_MODEL])
    finally:
        os.chdir(cwd)
    assert resumable(ckpt, stamp, "train[envace]") is None
    assert not (ckpt / "last.ckpt").exists() and (ckpt / "fingerprint").read_text() == stamp


def test_evaluate_compares_every_variant_in_the_real_backends(warmed, tmp_path, monkeypatch):
    import mlflow

    from envace.config import parse_params
    from envace.stages import evaluate
    from tests.conftest import TINY_PARAMS, write_params

    for variant in ("sft", "real_env", "simulator", "envace"):
        if not (warmed / "models/train" / variant).exists():
            assert _train_entry(warmed, tmp_path, variant).returncode == 0
    monkeypatch.chdir(warmed)
    monkeypatch.delenv("ENVACE_MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    evaluate.run(parse_params(TINY_PARAMS))

    result = json.loads((warmed / "metrics/eval.json").read_text())
    n_test = sum(1 for _ in open(warmed / "data/prepared/test.jsonl"))
    assert set(result["variants"]) == {"sft", "real_env", "simulator", "envace"} and result["n_tasks"] == n_test
    for name, r in result["variants"].items():
        assert r["n"] == n_test and r["ci_low"] <= r["success"] <= r["ci_high"], name
        assert {"bank", "files", "trading"} == set(r["per_domain"]) and r["per_task_type"]
        assert r["turns_per_task"] > 0 and 0 <= r["leak_rate"] <= 1
        assert 0 <= r["rehearsal_exact"] <= 1 and 0 <= r["rehearsal_exact_without_privileged"] <= 1
    for name, r in result["variants"].items():  # as counted in training (0 for envace: asserted there)
        assert r["real_env_calls_train"] == json.loads((warmed / f"metrics/train/{name}.json").read_text())[
            "real_env_calls_train"]
    table = (warmed / "reports/eval.md").read_text()
    assert all(f"| {v} |" in table for v in result["variants"])

    runs = mlflow.search_runs(experiment_names=["envace"], filter_string="tags.stage = 'evaluate'")
    assert sorted(runs["tags.variant"]) == ["envace", "real_env", "sft", "simulator"]
    assert set(runs["metrics.success"]) <= {r["success"] for r in result["variants"].values()}


def test_evaluate_names_the_variants_not_trained(tmp_path, monkeypatch):
    from envace.config import parse_params
    from envace.stages import evaluate
    from tests.conftest import TINY_PARAMS, write_params

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageFailed, match="no trained model for variant.s. sft, real_env, simulator, envace"):
        evaluate.run(parse_params(TINY_PARAMS))
