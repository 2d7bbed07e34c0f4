"""`envace act`: the trained agent on one task, as a user runs it.

It rehearses privately first (`--rehearse N`, `--mode`), shows those imagined episodes,
then plays the task for real in its domain's backend; with `--guard` every high-risk call
is rehearsed from the real history first, and a held one is shown with its rehearsed
outcome and waits for a y/n (`--yes` / `--no` answer for scripts; without a terminal and
without either, the answer is no: the guard fails closed). The episode is also logged as
an MLflow trace (`--no-trace` to skip).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from envace.data.tokenizer import compact_json


class ActError(ValueError):
    """Bad input to `envace act` (the message names it)."""


def load_task(spec: str, root: Path):
    """A task JSON file (a task, or an episode line holding one) or a test task's id."""
    from envace.domains.base import Task

    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ActError(f"{spec}: no such task file")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ActError(f"{spec}: not a JSON task: {err}") from None
        raw = raw.get("task", raw) if isinstance(raw, dict) else raw
        try:
            return Task.from_dict(raw)
        except (TypeError, KeyError, AttributeError) as err:
            raise ActError(f"{spec}: not a task (expected the keys id, domain, task_type, request, tools, "
                           f"scenario, checklist): {err}") from None
    test = root / "data" / "prepared" / "test.jsonl"
    if not test.exists():
        raise ActError(f"{spec!r} is no task file, and {test} does not exist to look it up as a test task id "
                       "(run `make run` first, or pass a task JSON file)")
    from envace.io import read_jsonl

    for episode in read_jsonl(test):
        if episode["task"]["id"] == spec:
            return Task.from_dict(episode["task"])
    raise ActError(f"no test task with id {spec!r} in {test}")


def load_agent(model: str, params):
    """(policy, rollout config, memory size) of a model directory or a registry URI."""
    from envace.rollout.runner import load_policy

    if model.startswith("models:/"):
        import mlflow
        from mlflow.exceptions import MlflowException

        try:
            agent = mlflow.pyfunc.load_model(model).unwrap_python_model()
        except MlflowException as err:
            raise ActError(f"cannot load {model} from the MLflow registry at {mlflow.get_tracking_uri()}: "
                           f"{err.message.splitlines()[0]} (run `make run` to register one, or pass --model DIR)") from None
        return agent.policy, agent.rollout, agent.memory_episodes
    path = Path(model)
    if not path.is_dir():
        raise ActError(f"--model {model}: no such model directory (or give a models:/NAME@ALIAS URI)")
    return load_policy(path, params.trainer, params.model.max_seq_len), params.rollout, params.roles.memory_episodes


def show_imagined(episodes, out=sys.stdout) -> None:
    from envace.roles import act_text

    for k, e in enumerate(episodes, 1):
        print(f"  private rehearsal {k} (imagined, 0 real calls):", file=out)
        for m in e.messages[1:]:
            if m["role"] == "act":
                print(f"    ACT      {act_text(m)}", file=out)
            elif m["role"] == "tool":
                print(f"    REHEARSE {m['name']} -> {compact_json(m['response'])}", file=out)
            elif m["role"] == "failed_step":
                print(f"    failed: {m['reason']}", file=out)


def show_episode(episode, out=sys.stdout) -> None:
    from envace.roles import act_text

    for m in episode.messages[1:]:
        if m["role"] == "act":
            held = m.get("held", [])
            print(f"  ACT   {act_text(m)}" + (f"   (held: call {', '.join(str(i + 1) for i in held)})" if held else ""),
                  file=out)
        elif m["role"] == "tool":
            tag = "HELD " if m.get("source") == "guard" else "TOOL "
            print(f"  {tag} {m['name']} -> {compact_json(m['response'])}", file=out)
        elif m["role"] == "failed_step":
            print(f"  stopped: {m['reason']}", file=out)


def asker(answer: bool | None, out=sys.stdout):
    """The guard's confirmation: a fixed answer, else y/n on a terminal, else no."""

    def confirm(episode, verdict) -> bool:
        print(f"\n  GUARD held {compact_json(verdict.call)}\n    rehearsed outcome: "
              f"{compact_json(verdict.rehearsed) if verdict.rehearsed is not None else 'unreadable'}\n"
              f"    why: {verdict.reason}", file=out)
        if answer is not None:
            print(f"    run it anyway? {'y' if answer else 'n'} (from the command line)", file=out)
            return answer
        if not sys.stdin.isatty():
            print("    run it anyway? n (no terminal to ask: the guard fails closed)", file=out)
            return False
        return input("    run it anyway? [y/N] ").strip().lower() in ("y", "yes")

    return confirm


def act(args) -> int:
    from envace import env

    root = Path(args.project_dir).resolve()
    env.configure(root)
    from envace.config import ParamsError, load_params
    from envace.domains import DomainError, use_domains
    from envace.rehearsal import Guard, play

    try:
        params = load_params(root / args.params if not Path(args.params).is_absolute() else args.params)
        use_domains(params.collect.domains, root, params.collect.real_backends)  # your own tools, too
        if args.rehearse < 0:
            raise ActError(f"--rehearse {args.rehearse}: a number of private rehearsals is 0 or more")
        task = load_task(args.task, root)
        if args.model.startswith("models:/"):
            _use_project_store(root)
        policy, rollout, memory_episodes = load_agent(args.model, params)
    except (ActError, ParamsError, DomainError) as err:
        print(f"envace act: {err}", file=sys.stderr)
        return 2
    answer = True if args.yes else False if args.no else None
    guard = Guard(policy, rollout.max_new_tokens, params.guard.on_hold, confirm=asker(answer)) if args.guard else None
    print(f"task {task.id} ({task.domain}/{task.task_type}): {task.request}")
    if args.rehearse:
        print(f"rehearsing privately: {args.rehearse} imagined episode(s), {args.mode}")
    real, imagined = play(policy, [task], rollout, args.rehearse, args.mode, guard, memory_episodes,
                          seed=args.seed, on_imagined=lambda _, episodes: show_imagined(episodes))
    episode = real[0]
    print("real episode:")
    show_episode(episode)
    held = [v for v in episode.reviews if v.hold and not v.confirmed]
    print(f"\nanswer: {episode.answer!r}; success (task checklist and final state): {episode.success}; "
          f"real calls {episode.real_calls}; private rehearsals {len(imagined[0])} (0 real calls); held {len(held)}")
    if not args.no_trace:
        print(f"MLflow trace: {_trace(root, episode, imagined[0], args.model)}")
    return 0


def _use_project_store(root: Path) -> None:
    import mlflow

    from envace.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(root))


def _trace(root: Path, episode, rehearsals, model: str) -> str:
    import mlflow

    from envace.rehearsal.trace import log_trace
    from envace.tracking import experiment_id

    (root / ".mlflow").mkdir(exist_ok=True)
    mlflow.set_experiment(experiment_id=experiment_id(root))
    return log_trace(episode, rehearsals, model) or "not logged"
