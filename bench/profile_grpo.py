"""Where a GRPO step's time goes: playing the step's episodes (prefill, decode steps, and the
runner's own work — prompts, parsing, the responder, the judge) and the update.

Run after warmup: `.venv/bin/python bench/profile_grpo.py [--variant envace] [--model models/warmup]`.
Plays step 0's episodes (`train.tasks_per_step` × `train.group_size`, the memory groups of
`envace` included) twice, with the model's own forward and with the lean decoder
(`generate(lean=True)`), times the update's forward + backward over the packed rows (denormal
floats flushed, as in the stages), and prints each phase's seconds and share of the step, and
whether the two decoders' episodes agree (they differ only by float rounding, which can flip a
near-tie in sampling).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import torch
from grpo_step import grpo_module, update_seconds  # bench/ is the script's own directory


def timed(table: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table[name] += time.perf_counter() - start

    return wrapper


def play(module, tasks, streams, lean: bool) -> tuple[list, dict]:
    """The step's episodes and the seconds spent in prefill, decode steps and generation."""
    from envace.rollout import generate as generation
    from envace.rollout import lean as lean_decoding
    from envace.rollout import runner

    seconds: dict = defaultdict(float)
    originals = (runner.generate, generation.CachedForward.prefill, generation.CachedForward.step,
                 lean_decoding.LeanDecoder.prefill, lean_decoding.LeanDecoder.step)
    runner.generate = timed(seconds, "generate", functools.partial(originals[0], lean=lean))
    generation.CachedForward.prefill = timed(seconds, "prefill", originals[1])
    generation.CachedForward.step = timed(seconds, "decode steps", originals[2])
    lean_decoding.LeanDecoder.prefill = timed(seconds, "prefill", originals[3])
    lean_decoding.LeanDecoder.step = timed(seconds, "decode steps", originals[4])
    try:
        start = time.perf_counter()
        episodes, _ = module.play(tasks, streams)
        seconds["play"] = time.perf_counter() - start
    finally:
        runner.generate = originals[0]
        generation.CachedForward.prefill, generation.CachedForward.step = originals[1:3]
        lean_decoding.LeanDecoder.prefill, lean_decoding.LeanDecoder.step = originals[3:]
    return episodes, seconds


def main() -> None:
    from envace import flush_denormals
    from envace.train.grpo import generation_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="envace", choices=("envace", "real_env", "simulator"))
    parser.add_argument("--model", default="models/warmup")
    args = parser.parse_args()

    flush_denormals()  # as the stages compute; before torch's first parallel operator starts its threads
    torch.set_num_threads(2)
    module = grpo_module(args.variant, args.model)
    model = module.policy.model
    tasks, _, streams = module.sample_tasks(0)
    model.eval()
    with torch.no_grad():
        play(module, tasks[:8], streams[:8], lean=False)  # warm-up
        runs = {lean: play(module, tasks, streams, lean) for lean in (False, True)}
    model.train()
    played, seconds = runs[False]
    update = update_seconds(module, generation_rows(played)[0], old_pass=False)
    generated = sum(sum(e.tokens.values()) for e in played)
    print(f"{args.variant}, step 0: {len(played)} episodes, {generated} generated tokens")
    print(f"{'phase':<34} {'forward s':>9} {'share':>6} {'lean s':>7}")
    for name, label in (("prefill", "  prefill"), ("decode steps", "  decode steps"),
                        ("generate", "  generation in all (+ sampling)")):
        print(f"{label:<34} {seconds[name]:>9.2f} {seconds[name] / (seconds['play'] + update):>6.0%} "
              f"{runs[True][1][name]:>7.2f}")
    rest = {lean: s["play"] - s["generate"] for lean, (_, s) in runs.items()}
    print(f"{'  runner: prompts, parsing, judge':<34} {rest[False]:>9.2f} {rest[False] / (seconds['play'] + update):>6.0%} "
          f"{rest[True]:>7.2f}")
    print(f"{'play':<34} {seconds['play']:>9.2f} {seconds['play'] / (seconds['play'] + update):>6.0%} "
          f"{runs[True][1]['play']:>7.2f}")
    print(f"{'update (forward + backward)':<34} {update:>9.2f} {update / (seconds['play'] + update):>6.0%}")
    same = sum(a.success == b.success and a.tokens == b.tokens for a, b in zip(played, runs[True][0]))
    print(f"step with lean decoding: {(runs[True][1]['play'] + update) / (seconds['play'] + update):.2f}x the time; "
          f"episodes alike (same success, same token counts): {same}/{len(played)}; "
          f"success {sum(e.success for e in played)} vs {sum(e.success for e in runs[True][0])}")


if __name__ == "__main__":
    main()
