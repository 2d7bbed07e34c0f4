"""The trained agent in the MLflow model registry.

`EnvaceAgent` is the agent as an MLflow pyfunc model: it wraps the `save_pretrained`
directory (weights + tokenizer) and its `predict` plays each given task as one greedy
episode in the task's real backend. `register` logs it, registers a new version of
`envace-agent` under the alias `challenger`, and moves `champion` to it only when its
held-out success beats the current champion's on the same tasks (the champion is loaded
through `models:/envace-agent@champion` and re-evaluated, so both are measured alike).
Registering is idempotent: when the challenger already is this very model (same weights, data,
params and success), `register` returns that registration again instead of a duplicate version,
so a forced rerun that reproduces the models writes the same `metrics/register.json`.

Like `envace.tracking`, this module imports MLflow; the rest of the library does not.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from envace.evaluate import rate
from envace.io import folder_digest

CHAMPION, CHALLENGER = "champion", "challenger"
REAL_CALLS = "real_env_calls_train"  # version tag: the promotion suite compares it
WEIGHTS = "model_sha256"  # version tag: the digest of the registered model directory
REGISTRATION = "registration.json"  # on the version's run: what `register` returned


def as_tasks(model_input) -> list[dict]:
    """Tasks from what `predict` may be given: a task dict, a list of them, or a DataFrame
    with a `task` column (dicts or JSON strings)."""
    if hasattr(model_input, "columns"):
        if "task" not in model_input.columns:
            raise ValueError(f"expected a `task` column, got columns {list(model_input.columns)}")
        model_input = model_input["task"].tolist()
    if isinstance(model_input, dict):
        model_input = [model_input]
    return [json.loads(t) if isinstance(t, str) else t for t in model_input]


PREDICT_PARAMS = {"rehearse": 0, "mode": "parallel", "guard": False, "on_hold": "revise", "seed": 0}
"""`predict`'s options (`params=`), as `envace act` takes them: private rehearsals before the
real episode, their mode, the guard on high-risk calls and what it does with a held call."""


def signature():
    """No input schema: tasks are nested JSON (a dict, a list, or a `task` column), and MLflow
    would enforce one by casting a task dict to a DataFrame. The episode each task gets as the
    output schema (what the version page shows; MLflow does not enforce outputs), and the options
    as a params schema, which MLflow requires before it passes `params` on."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType

    kinds = {int: "long", str: "string", bool: "boolean"}
    outputs = Schema([ColSpec("string", "task_id"), ColSpec("boolean", "success"),
                      ColSpec("string", "answer", required=False), ColSpec("string", "failure", required=False),
                      ColSpec(AnyType(), "messages"), ColSpec("long", "private_rehearsals"), ColSpec(AnyType(), "held")])
    return ModelSignature(outputs=outputs,
                          params=ParamSchema([ParamSpec(k, kinds[type(v)], v) for k, v in PREDICT_PARAMS.items()]))


def known(section, values: dict) -> dict:
    """The keys of a registered version's config that this envace still has: a knob removed
    since (e.g. `rollout.temperature`) is ignored, so older champions stay loadable."""
    return {k: v for k, v in values.items() if k in section.model_fields}


class EnvaceAgent(mlflow.pyfunc.PythonModel):
    """The agent: predict(tasks, params) → one episode per task in its domain's real backend,
    after `rehearse` private rehearsals and with the guard when `guard` is true."""

    def load_context(self, context):
        from envace.config import RolloutConfig, TrainerConfig
        from envace.domains import use_domains
        from envace.rollout.runner import load_policy

        config = context.model_config or {}
        use_domains([_unpacked(spec, context.artifacts) for spec in config.get("domains", [])])  # your own tools too
        self.policy = load_policy(context.artifacts["model"], TrainerConfig(**known(TrainerConfig, config.get("trainer", {}))),
                                  config.get("max_seq_len", 0), base=context.artifacts.get("base"))
        self.rollout = RolloutConfig(**known(RolloutConfig, config.get("rollout", {})))
        self.memory_episodes = config.get("memory_episodes", 2)

    def predict(self, context, model_input, params=None) -> list[dict]:
        import torch

        from envace.domains.base import Task
        from envace.rehearsal import Guard, play

        options = {**PREDICT_PARAMS, **(params or {})}
        if options["mode"] not in ("parallel", "sequential"):
            raise ValueError(f"params mode: expected 'parallel' or 'sequential', not {options['mode']!r}")
        tasks = [Task.from_dict(t) for t in as_tasks(model_input)]
        guard = Guard(self.policy, self.rollout.max_new_tokens, options["on_hold"]) if options["guard"] else None
        with torch.no_grad():
            # the real episode is greedy, as `evaluate` measures it; rehearsals sample
            episodes, imagined = play(self.policy, tasks, self.rollout, int(options["rehearse"]), options["mode"], guard,
                                      self.memory_episodes, seed=int(options["seed"]))
        return [{"task_id": e.task.id, "success": bool(e.success), "answer": _answer(e.messages),
                 "failure": e.failure, "messages": e.messages, "private_rehearsals": len(rehearsals),
                 "held": [v.to_dict() for v in e.reviews if v.hold and not v.confirmed]}
                for e, rehearsals in zip(episodes, imagined)]


def _answer(messages: list[dict]) -> str | None:
    final = [m["answer"] for m in messages if m["role"] == "act" and "answer" in m]
    return final[-1] if final else None


@dataclass
class Registration:
    """What `register` did: the new version, both scores on the same tasks, the verdict."""

    model_name: str
    version: str
    run_id: str
    challenger_success: float
    champion_version: str | None
    champion_success: float | None
    promoted: bool
    reason: str
    n_tasks: int
    real_calls: int
    """Real backend calls the challenger made in training."""
    expectations: list[dict]
    """The promotion suite's results (empty when there was no champion to compare with)."""

    def to_dict(self) -> dict:
        return asdict(self)


def log_agent(model_dir: Path, config: dict, run_name: str, tags: dict[str, str], example: dict | None = None):
    """Log the agent as a pyfunc model into a new run (nested under the flow's stage run
    when there is one); returns (run_id, model_uri). LoRA adapters travel with their base
    checkpoint and domain folders with their files, so the registered model loads anywhere.
    `example`, a task, is the model's input example (MLflow checks it by playing it once)."""
    import pandas as pd

    import envace
    from envace import tracking
    from envace.model import BASE_REFERENCE

    root = Path.cwd()
    artifacts = {"model": str(model_dir)}
    if (Path(model_dir) / "adapter_config.json").exists():
        artifacts["base"] = BASE_REFERENCE
    with tempfile.TemporaryDirectory() as folders:
        config = {**config, "domains": [_packed(spec, Path(folders), artifacts) for spec in config.get("domains", [])]}
        with mlflow.start_run(experiment_id=tracking.experiment_id(root), run_name=run_name, tags=tags,
                              parent_run_id=os.environ.get("ENVACE_MLFLOW_RUN_ID")) as run:
            info = mlflow.pyfunc.log_model(
                name="agent", python_model=EnvaceAgent(), artifacts=artifacts,
                model_config=config, code_paths=[str(Path(envace.__file__).parent)], signature=signature(),
                pip_requirements=_requirements(),
                input_example=None if example is None else pd.DataFrame({"task": [json.dumps(example)]}))
    return run.info.run_id, info.model_uri


FOLDER = "folder:"
"""A `domains` entry of a registered config that names a domain folder packed as an artifact."""


def _packed(spec: str, into: Path, artifacts: dict) -> str:
    """A domain folder travels with the model (its tools, policy, checks and backend; not its
    logs), so a registered version loads on another machine or after the project moves. Built-in
    and `package.module:OBJECT` domains are named as they are."""
    folder = Path(spec)
    if not folder.is_dir():
        return spec
    key, name = f"domain-{len(artifacts)}", folder.resolve().name  # the folder's name is the domain's
    shutil.copytree(folder, into / key / name, ignore=shutil.ignore_patterns("episodes.jsonl", "__pycache__"))
    artifacts[key] = str(into / key)
    return f"{FOLDER}{key}/{name}"


def _unpacked(spec: str, artifacts: dict) -> str:
    if not spec.startswith(FOLDER):
        return spec
    key, _, name = spec[len(FOLDER):].partition("/")
    return str(Path(artifacts[key]) / name)


def _requirements() -> list[str]:
    """The pins the agent needs to load elsewhere (no slow dependency inference)."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("torch", "transformers", "tokenizers", "safetensors", "peft",
                                                    "jsonschema", "pydantic", "pyyaml", "mlflow")]


def register(model_dir: Path, success: float, scored: int, tasks: list[dict], config: dict, model_name: str,
             tags: dict[str, str], real_calls: int, params: dict | None = None) -> Registration:
    """New version of `model_name` (alias `challenger`); `champion` moves to it only if the
    promotion suite passes: `success` (as `evaluate` wrote it, measured on `scored` tasks) beats
    the current champion's, re-scored now on `tasks` — so both on as many tasks — with no
    more real calls in training (`real_calls`) than the champion made. `config` is the agent's
    `model_config`: {"rollout", "trainer", "max_seq_len", "memory_episodes", "domains"}; `params`, the
    pipeline's, go with the logged model."""
    from envace.gates import describe_failures, run_checks
    from envace.gates.promotion import checks, comparison

    client = MlflowClient()
    tags = tags | {REAL_CALLS: str(real_calls), WEIGHTS: folder_digest(model_dir)}
    previous = registered_before(client, model_name, tags | {"success": str(success)})
    if previous is not None:
        print(f"register: {model_name} v{previous.version} already is this model (same weights, data, params and "
              "success): not registered again", flush=True)
        return previous
    run_id, model_uri = log_agent(model_dir, config, f"register-{model_name}", {"stage": "register"},
                                  example=tasks[0] if tasks else None)
    describe_logged_model(run_id, model_uri, success, tasks, tags.get("data_version"), params or {})
    try:
        client.get_registered_model(model_name)
    except MlflowException:
        client.create_registered_model(model_name, description="envace tool agent (ACT + REHEARSE, one model)")
    version = mlflow.register_model(model_uri, model_name, tags=tags).version
    client.set_registered_model_alias(model_name, CHALLENGER, version)
    champion = current_champion(client, model_name)
    expectations: list[dict] = []
    if champion is None:
        champion_success, promoted, reason = None, True, "no champion yet"
    else:
        champion_success, champion_scored = success_of(f"models:/{model_name}@{CHAMPION}", tasks)
        tag = champion.tags.get(REAL_CALLS, "")
        champion_calls = int(tag) if tag.isdigit() else None  # None: registered before envace recorded it
        table = comparison({"version": version, "success": success, "tasks": scored, "real_calls": real_calls},
                           {"version": champion.version, "success": champion_success, "tasks": champion_scored,
                            "real_calls": champion_calls})
        expectations = run_checks({"promotion": table}, checks(), gate="register")
        promoted = all(e["success"] for e in expectations)
        verdict = "beats" if promoted else "does not replace"
        reason = f"challenger {success:.4f} {verdict} champion v{champion.version} {champion_success:.4f}"
        if not promoted:
            reason += "; failed: " + "; ".join(e["name"] for e in expectations if not e["success"])
            if champion_calls is None:
                reason += (f" (champion v{champion.version} has no {REAL_CALLS} tag — registered before envace recorded it;"
                           f" tag it with its real calls in training to compare)")
            print(describe_failures(expectations), flush=True)
    if promoted:
        client.set_registered_model_alias(model_name, CHAMPION, version)
    result = Registration(model_name, str(version), run_id, success, champion and str(champion.version),
                          champion_success, promoted, reason, len(tasks), real_calls, expectations)
    for key, value in {"success": success, "champion_success": champion_success, "promoted": promoted,
                       "reason": reason}.items():
        client.set_model_version_tag(model_name, version, key, "" if value is None else str(value))
    client.log_dict(run_id, result.to_dict(), REGISTRATION)
    return result


def registered_before(client: MlflowClient, model_name: str, tags: dict[str, str]) -> Registration | None:
    """The challenger's registration when it is this very model (every tag in `tags` equal: weights,
    data version, commit, params, success, real calls) and the champion has not moved since; else None."""
    try:
        challenger = client.get_model_version_by_alias(model_name, CHALLENGER)
    except MlflowException:
        return None
    if any(challenger.tags.get(k) != v for k, v in tags.items()):
        return None
    try:
        with tempfile.TemporaryDirectory() as folder:  # MLflow's own would stay behind in /tmp
            recorded = Registration(**json.loads(Path(client.download_artifacts(challenger.run_id, REGISTRATION,
                                                                                folder)).read_text()))
    except (MlflowException, OSError, TypeError, ValueError):
        return None  # registered by an envace that did not record it
    champion = current_champion(client, model_name)
    expected = recorded.version if recorded.promoted else recorded.champion_version
    return recorded if champion is not None and str(champion.version) == expected else None


def describe_logged_model(run_id: str, model_uri: str, success: float, tasks: list[dict], data_version: str | None,
                          params: dict) -> None:
    """What MLflow shows on the logged model: its held-out success, linked to the test set it was
    scored on (the DVC data version is that dataset's digest), and its params — flattened on
    the model, whole as `params.yaml` on its run."""
    import warnings

    import pandas as pd
    import yaml
    from mlflow.entities import LoggedModelInput

    from envace.tracking import flatten

    model_id = model_uri.removeprefix("models:/")  # MLflow 3 logs a model as models:/<model id>
    with warnings.catch_warnings():  # "the source can be interpreted in multiple ways": a local path it is
        warnings.simplefilter("ignore", UserWarning)
        test = mlflow.data.from_pandas(pd.DataFrame({"task_id": [t["id"] for t in tasks]}),
                                       source="data/prepared/test.jsonl", name="test", digest=data_version or None)
    with mlflow.start_run(run_id=run_id):
        mlflow.log_input(test, context="evaluation", model=LoggedModelInput(model_id))
        mlflow.log_metric("success", success, model_id=model_id, dataset=test)
        if params:
            mlflow.log_model_params({k: str(v)[:6000] for k, v in flatten(params).items()}, model_id=model_id)
            mlflow.log_text(yaml.safe_dump(params, sort_keys=False), "params.yaml")


def current_champion(client: MlflowClient, model_name: str):
    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None


def success_of(model_uri: str, tasks: list[dict]) -> tuple[float, int]:
    """Held-out success of a registered agent, loaded the way users load it and rounded as
    `evaluate` rounds it, and the number of tasks it was scored on."""
    results = mlflow.pyfunc.load_model(model_uri).predict(tasks)
    return (rate([r["success"] for r in results]) if len(results) else 0.0), len(results)
