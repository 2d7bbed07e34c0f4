"""How much of a rollout's prefill re-reads tokens it has already run through: the size of the
lever that keeping each episode's KV cache across turns would pull.

Run after `train`: `.venv/bin/python bench/prefill_reuse.py [--model models/train/envace] [--tasks 300]`.
Plays an evaluation (greedy, the real backends, an even spread of `--tasks` test tasks) and
prints the prefill's and the decode steps' share of the run, and of the prompt tokens
prefilled, the share that extends an earlier generation's prompt + output (the same episode's
earlier turns: what a cache kept across turns would skip) and the share that any earlier
sequence already began with (shared prefixes across episodes as well).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections import defaultdict

KEY = 32  # sequences are looked up by their first KEY tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/train/envace")
    parser.add_argument("--tasks", type=int, default=300)
    args = parser.parse_args()

    import torch

    from envace.config import load_params
    from envace.data.splits import spread
    from envace.domains.base import Task
    from envace.io import read_jsonl
    from envace.model import cpu_threads
    from envace.paths import PREPARED
    from envace.rollout import lean as lean_decoding
    from envace.rollout import runner
    from envace.rollout.runner import EpisodeRunner, RealResponder, load_policy
    from profile_grpo import timed  # bench/ is the script's own directory

    torch.set_num_threads(cpu_threads())
    params = load_params()
    policy = load_policy(args.model, params.trainer)
    tasks = spread([Task.from_dict(e["task"]) for e in read_jsonl(PREPARED / "test.jsonl")], args.tasks)
    count: dict = defaultdict(float)
    earlier: dict[tuple, list[list[int]]] = defaultdict(list)  # first KEY tokens -> prompt + output

    def recorded(generate):
        @functools.wraps(generate)
        def wrapper(model, prompts, *rest, **kwargs):
            outputs = generate(model, prompts, *rest, **kwargs)
            for prompt, output in zip(prompts, outputs):
                before = earlier[tuple(prompt[:KEY])]
                count["prompt"] += len(prompt)
                count["shared"] += max((len(os.path.commonprefix([prompt, seq])) for seq in before), default=0)
                count["extends"] += max((len(seq) for seq in before if prompt[: len(seq)] == seq), default=0)
                before.append(prompt + output)
            return outputs

        return wrapper

    runner.generate = recorded(runner.generate)
    lean_decoding.LeanDecoder.prefill = timed(count, "prefill", lean_decoding.LeanDecoder.prefill)
    lean_decoding.LeanDecoder.step = timed(count, "decode steps", lean_decoding.LeanDecoder.step)
    start = time.perf_counter()
    episodes = EpisodeRunner(policy, RealResponder(), params.rollout, temperature=0.0).run(tasks)
    wall = time.perf_counter() - start
    print(f"{len(episodes)} episodes, success {sum(e.success for e in episodes) / len(episodes):.3f}, {wall:.1f} s: "
          f"prefill {count['prefill'] / wall:.0%}, decode steps {count['decode steps'] / wall:.0%} of it")
    print(f"{count['prompt']:,.0f} prompt tokens prefilled: {count['extends'] / count['prompt']:.0%} extend an earlier "
          f"generation's prompt + output (the episode's earlier turns), {count['shared'] / count['prompt']:.0%} begin "
          f"as an earlier sequence did (shared prefixes too)")


if __name__ == "__main__":
    main()
