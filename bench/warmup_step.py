"""A warmup step five ways, side by side: as warmup runs it (eager, fp32: for the embedded
Llama the lean training forward, `envace.rollout.lean.target_states`, whose last layer works
only where a target is predicted from), that lean forward compiled (`torch.compile`, inductor,
`dynamic=True`, its one data-dependent size captured instead of breaking the graph), through
the model's own forward (transformers' decoder with the attention mask, every position through
every layer: what warmup ran before), that forward compiled, and under bf16 autocast (what
`trainer.precision: bf16-mixed` does, which takes the model's own forward; on a CPU with
AVX-512 BF16 a bf16 matmul runs at about twice fp32's rate).

Run after `dvc repro base_model`: `.venv/bin/python bench/warmup_step.py [--steps 60] [--rounds 3]`.
The same `--steps` length-bucketed batches of warmup's own dataset and loss, forward + backward
+ AdamW, each way in turn per round (eager, lean_compiled, own, compiled, bf16, eager, ...), five copies
of the model starting from the same weights, denormal floats flushed as in the stages. Prints
each way's median seconds over the rounds, its ratio to eager, the compile time (inductor's
disk cache makes a second process's much shorter), the batches' padding share and how far the
first step's loss (the same weights) is from eager's; later steps part further, as training
amplifies rounding.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time


class OwnForward:
    """`model` seen by `role_targets` as no plain Llama, so that it takes the model's own forward
    (transformers' decoder, the attention mask, every position through every layer)."""

    def __init__(self, model, compiled: bool = False):
        import torch

        self.model, self.training = model, model.training
        self.decoder = torch.compile(model.get_decoder(), dynamic=True) if compiled else model.get_decoder()

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=2000, help="training episodes the batches come from")
    args = parser.parse_args()

    from envace import flush_denormals

    flush_denormals()  # first, before torch starts its threads (as the stages do)
    import torch

    from envace.model import cpu_threads
    from envace.train.data import collate
    from envace.train.losses import warmup_loss
    from profile_warmup import warmup_setup  # bench/ is the script's own directory

    torch.set_num_threads(cpu_threads())
    params, model, policy, data, all_batches = warmup_setup(args.episodes)
    lengths = [len(ids) for ids, _ in data.examples]
    chosen = all_batches[: args.steps]
    batches = [collate([data[i] for i in b], policy.pad_id) for b in chosen]
    padded = sum(b["input_ids"].numel() for b in batches)
    print(f"{len(batches)} batches of {params.warmup.batch_size}: padding {1 - sum(lengths[i] for b in chosen for i in b) / padded:.1%}")

    from envace.rollout import lean

    torch._dynamo.config.capture_scalar_outputs = True  # the last layer's query count, a traced size
    eager_lean, compiled_lean = lean.target_states, torch.compile(lean.target_states, dynamic=True)
    ways = {name: copy.deepcopy(model) for name in ("eager", "lean_compiled", "own", "compiled", "bf16")}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=params.warmup.lr) for name, m in ways.items()}
    callers = {**ways, "own": OwnForward(ways["own"]), "compiled": OwnForward(ways["compiled"], compiled=True)}
    losses: dict[str, list[float]] = {}

    def one_pass(name: str) -> float:
        start, out = time.perf_counter(), []
        lean.target_states = compiled_lean if name == "lean_compiled" else eager_lean  # what `role_targets` calls
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                loss = warmup_loss(callers[name], batch, params.warmup.lambda_env)["loss"]
            optimizers[name].zero_grad()
            loss.backward()
            optimizers[name].step()
            out.append(loss.item())
        losses.setdefault(name, out)
        return time.perf_counter() - start

    for name in ("lean_compiled", "compiled"):  # compiles (the first round's numbers come from the next passes)
        start = time.perf_counter()
        one_pass(name)
        print(f"{name}: compile (and one pass) {time.perf_counter() - start:.1f} s")
    for name in ("eager", "own", "bf16"):  # the others' first pass, so every copy has taken the same steps
        one_pass(name)
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name in ways:
            times[name].append(one_pass(name))
    eager = statistics.median(times["eager"])
    for name, t in times.items():
        first = abs(losses[name][0] - losses["eager"][0])  # the same weights: rounding alone
        print(f"{name:>13}: {statistics.median(t):6.2f} s for {len(batches)} steps (rounds {', '.join(f'{x:.2f}' for x in t)}), "
              f"eager / this {eager / statistics.median(t):.2f}, first step's loss minus eager's {first:.1e}")


if __name__ == "__main__":
    main()
