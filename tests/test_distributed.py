"""Data parallelism on the CPU: 2 processes (DDP, and FSDP, over gloo) take the same steps as
1 process with the same global batch, end with equal weights on both ranks, and write one
MLflow run."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow


# A warmup that memorises 8 bank episodes: sampled at temperature 1 its episodes succeed
# sometimes, so GRPO's advantages are not all 0 (a tiny model trained briefly on the whole
# tiny profile never succeeds, and its update would be the leak loss alone).
MEMORISE = {"model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
            "warmup": {"max_epochs": 150, "min_epochs": 1, "batch_size": 8, "warmup_steps": 5, "relabel_rate": 0.0,
                       "rare_tool_repeat": 1, "check_episodes": 4, "eval_tasks": 4},
            "gate": {"min_rehearsal_accuracy": 1.01}}  # the warmup's gate never stops it early


def _params(**sections):
    from envace.config import parse_params
    from tests.conftest import TINY_PARAMS

    raw = json.loads(json.dumps(TINY_PARAMS))
    for part in (MEMORISE, sections):
        for name, values in part.items():
            raw[name] = {**raw.get(name, {}), **values}
    return parse_params(raw)


@pytest.fixture(scope="module")
def warmed(prepared_dir, tmp_path_factory):
    """8 bank episodes as the training split, the base model and the warmup model (one process)."""
    from envace.stages import base_model, warmup

    root = tmp_path_factory.mktemp("ddp")
    shutil.copytree(prepared_dir / "data", root / "data")
    train = root / "data/prepared/train.jsonl"
    bank = [line for line in train.read_text().splitlines() if json.loads(line)["task"]["domain"] == "bank"][:8]
    train.write_text("\n".join(bank) + "\n")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        base_model.run(_params())
        warmup.run(_params())
    finally:
        os.chdir(cwd)
    return root


def _run(project, stage, devices, tmp_path, variant=None, strategy="ddp", **sections):
    """`python -m envace.stages.<stage>` on `devices` CPU processes, its own MLflow store."""
    trainer = {"accelerator": "cpu", "devices": devices, "strategy": strategy if devices > 1 else "auto"}
    params = tmp_path / f"params-{stage}-{devices}-{strategy}.yaml"
    params.write_text(yaml.safe_dump(_params(trainer=trainer, **sections).model_dump()))
    store = tmp_path / f"mlflow-{stage}-{devices}-{strategy}.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    env.pop("ENVACE_MLFLOW_RUN_ID", None)
    cmd = [sys.executable, "-m", f"envace.stages.{stage}", "--params", str(params), *(["--variant", variant] if variant else [])]
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return store


def _weights(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _mlflow_runs(store):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    return mlflow.search_runs(experiment_names=["envace"], output_format="list")


# uneven split (5 task groups over 2 ranks), several chunks per rank, rewards that vary (process
# reward), the KL reference and the leak loss on: every part of the update crosses the ranks
GRPO = {"steps": 3, "tasks_per_step": 5, "group_size": 4, "process_reward": 1.0, "chunk_rows": 4, "kl_coef": 0.1}


@pytest.fixture(scope="module")
def grpo_one_process(warmed, tmp_path_factory):
    """GRPO on one process: the reference both strategies must match."""
    out = tmp_path_factory.mktemp("grpo-one")
    _run(warmed, "train", 1, out, "envace", train=GRPO)
    shutil.copytree(warmed / "models/train/envace", out / "model")
    return out / "model", json.loads((warmed / "metrics/train/envace.json").read_text())


def assert_equal_up_to_rounding(a: torch.Tensor, b: torch.Tensor, max_drift: float = 1e-3) -> None:
    """Two ranks sum gradients in another order than one process: float rounding, which Adam
    enlarges in the odd weight whose gradient is ~0 — its normalised step takes the sign of the
    rounding noise, up to lr per step (measured: 1 to 3 weights of a tensor off by 1.5e-5 to
    1.5e-3, varying from run to run). Every other weight must agree to 1e-5 and none may drift
    beyond `max_drift`: a wrong gradient scale or a skipped batch moves nearly all of them."""
    off = ~torch.isclose(a, b, atol=1e-5, rtol=1e-4)
    assert off.float().mean().item() <= 1e-3, f"{int(off.sum())} of {off.numel()} weights differ"
    assert (a - b).abs().max().item() <= max_drift


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_grpo_on_two_processes_takes_the_steps_of_one(warmed, grpo_one_process, tmp_path, strategy):
    one, single = grpo_one_process
    store = _run(warmed, "train", 2, tmp_path, "envace", strategy, train=GRPO)
    double = json.loads((warmed / "metrics/train/envace.json").read_text())

    assert double["ranks"] == 2 and double["rank_divergence"] == 0.0  # both ranks end with equal weights
    assert any(h["adv_act_abs"] > 0 and h["adv_rehearse_abs"] > 0 for h in single["history"])  # a real signal
    for a, b in zip(single["history"], double["history"]):  # the same episodes were played
        assert {k: a[k] for k in ("reward", "success", "adv_act_abs", "leak_rate")} == \
            {k: b[k] for k in ("reward", "success", "adv_act_abs", "leak_rate")}
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-3)
    w1, w2, w0 = _weights(one), _weights(warmed / "models/train/envace"), _weights(warmed / "models/warmup")
    assert max((w1[k] - w0[k]).abs().max().item() for k in w1) > 1e-3  # it trained
    adam_bound = 2 * 1e-3 * GRPO["steps"]  # train.lr per step, in either direction
    for k in w1:
        assert_equal_up_to_rounding(w2[k], w1[k], adam_bound)
    assert len(_mlflow_runs(store)) == 1  # rank 0 alone logs


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_warmup_on_two_processes_takes_the_steps_of_one(warmed, tmp_path, strategy):
    twin = tmp_path / "twin"
    shutil.copytree(warmed, twin, ignore=shutil.ignore_patterns("checkpoints", "models/warmup"))
    short = {**MEMORISE["warmup"], "max_epochs": 4, "batch_size": 6}  # batches of 6, 6, 4: split 3/3, 3/3, 2/2
    if strategy == "fsdp":  # Muon needs whole matrices: `auto` takes AdamW under FSDP, so the one process must too
        short["optimizer"] = "adamw"
    _run(warmed, "warmup", 1, tmp_path, warmup=short)
    store = _run(twin, "warmup", 2, tmp_path, strategy=strategy, warmup=short)
    assert json.loads((twin / "metrics/warmup.json").read_text())["ranks"] == 2
    w1, w2 = _weights(warmed / "models/warmup"), _weights(twin / "models/warmup")
    for k in w1:
        assert_equal_up_to_rounding(w2[k], w1[k])
    assert len(_mlflow_runs(store)) == 1


def test_a_rank_without_episodes_still_takes_part(warmed, tmp_path):
    """One task group over 2 ranks: rank 1 plays nothing, yet joins every collective (its zero
    gradients included), so nothing hangs and both ranks end where one process does."""
    small = {**GRPO, "tasks_per_step": 1, "steps": 2}
    _run(warmed, "train", 1, tmp_path, "envace", train=small)
    one = _weights(warmed / "models/train/envace")
    _run(warmed, "train", 2, tmp_path, "envace", train=small)
    two = _weights(warmed / "models/train/envace")
    assert json.loads((warmed / "metrics/train/envace.json").read_text())["rank_divergence"] == 0.0
    for k in one:  # the same rounding allowance as two ranks that both play
        assert_equal_up_to_rounding(two[k], one[k], 2 * 1e-3 * small["steps"])
