"""The GRPO update's cost: a role's turns packed into one row per episode vs one row per
generation (each with its whole prompt), and the packed rows through the lean training forward
(as the stage runs them) vs through the model's own forward, on the same episodes, same model.

Run after warmup: `.venv/bin/python bench/grpo_step.py [--variant envace] [--repeats 3]`.
Plays one training step's episodes (`train.tasks_per_step` × `train.group_size`) with the
warmup model, then times the loss forward + backward over the row layouts in turn (denormal
floats flushed, as in the stages) and reports the median; "one row per generation" also pays
the separate old-policy pass the update made before (now skipped when `train.ppo_epochs` is 1:
the ratio is 1 there).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def rows_alone(episodes):
    """The earlier layout: every generation its own row, prompt included."""
    from envace.roles import ACT, REHEARSE, ROLE_IDS

    rows, episode_of = [], []
    for i, e in enumerate(episodes):
        for g in e.generations:
            if g.role in (ACT, REHEARSE):
                rows.append((g.prompt_ids + g.output_ids, [0] * len(g.prompt_ids) + [ROLE_IDS[g.role]] * len(g.output_ids)))
                episode_of.append(i)
    return rows, episode_of


def update_seconds(module, rows, old_pass: bool, own_forward: bool = False) -> float:
    """Seconds of the update's forward + backward over `rows`; `own_forward`: through the
    model's own forward instead of the lean one."""
    import torch.nn.functional as F
    from warmup_step import OwnForward  # bench/ is the script's own directory

    model = OwnForward(module.model) if own_forward else module.model
    start = time.perf_counter()
    if old_pass:
        module._logprobs(rows, model)
    logits, targets, _, _ = zip(*module._forward(rows, model))
    (-F.cross_entropy(torch.cat(logits), torch.cat(targets), reduction="none")).sum().backward()
    module.model.zero_grad()
    return time.perf_counter() - start


def grpo_module(variant: str, model_path: str):
    """The stage's GRPOModule for `variant` on the model at `model_path`, default params."""
    from envace.config import load_params
    from envace.domains.base import Task
    from envace.io import read_jsonl
    from envace.model import load
    from envace.roles import leak_words_of
    from envace.rollout.runner import Policy
    from envace.train.grpo import GRPOModule

    params = load_params("params.yaml")
    model, tokenizer = load(model_path)
    episodes = list(read_jsonl("data/prepared/train.jsonl"))
    simulator = Policy(load(model_path)[0].eval(), tokenizer) if variant == "simulator" else None
    return GRPOModule(Policy(model, tokenizer), [Task.from_dict(e["task"]) for e in episodes], variant,
                      params.train, params.rollout, params.roles, leak_words_of(episodes), simulator)


def main() -> None:
    from envace import flush_denormals
    from envace.train.grpo import generation_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="envace", choices=("envace", "real_env", "simulator"))
    parser.add_argument("--model", default="models/warmup")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    flush_denormals()  # as the stages compute; before torch's first parallel operator starts its threads
    torch.set_num_threads(2)
    module = grpo_module(args.variant, args.model)
    with torch.no_grad():
        tasks, _, streams = module.sample_tasks(0)
        played = module.runner.run(tasks, streams)
    packed, alone = generation_rows(played)[0], rows_alone(played)[0]
    times = {"packed": [], "own": [], "alone": []}
    for _ in range(args.repeats):
        times["packed"].append(update_seconds(module, packed, old_pass=False))
        times["own"].append(update_seconds(module, packed, old_pass=False, own_forward=True))
        times["alone"].append(update_seconds(module, alone, old_pass=True))
    rows = {"packed": packed, "own": packed, "alone": alone}
    print(f"{args.variant}: {len(played)} episodes; median of {args.repeats}")
    print(f"{'layout':<38} {'rows':>5} {'tokens':>7} {'update s':>9}")
    for name, label in (("alone", "one row per generation"), ("own", "packed, the model's own forward"),
                        ("packed", "packed, lean (as the stage runs it)")):
        print(f"{label:<38} {len(rows[name]):>5} {sum(len(ids) for ids, _ in rows[name]):>7} "
              f"{statistics.median(times[name]):>9.2f}")
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"speed-up of the update: packing {median['alone'] / median['packed']:.2f}x (both lean), "
          f"the lean forward {median['own'] / median['packed']:.2f}x (both packed)")


if __name__ == "__main__":
    main()
