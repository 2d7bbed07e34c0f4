"""The CPU's own ceiling: fp32 matrix-multiply throughput, so training and rollout speed can be
stated as a fraction of what this machine can do at all.

Run: `.venv/bin/python bench/matmul.py [--threads 1,2] [--sizes 128,512,1024,2048]`.
Prints GFLOP/s per size and thread count (median of `--repeats` timings), fp32 and bf16 side
by side (bf16 matmuls are fast only where the CPU has AVX-512 BF16 or AMX; the fp32 column is the
ceiling training runs against: bf16 autocast measured no faster, `bench/warmup_step.py`), and what that
means for the embedded default (2 x parameters FLOPs per token, the attention over the
context left out): the decode and training token rates it bounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def gflops(n: int, repeats: int, dtype: torch.dtype = torch.float32) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    calls = max(1, int(2e9 / (2 * n**3)))  # ~2 GFLOP a timing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            a @ b
        times.append((time.perf_counter() - start) / calls)
    return 2 * n**3 / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}")
    parser.add_argument("--sizes", default="128,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=float, default=0.8e6, help="model parameters (embedded default: 0.8M)")
    args = parser.parse_args()
    best = 0.0
    print(f"{'threads':>7} {'n':>5} {'fp32 GFLOP/s':>12} {'bf16 GFLOP/s':>12}")
    for threads in dict.fromkeys(map(int, args.threads.split(","))):
        torch.set_num_threads(threads)
        for n in map(int, args.sizes.split(",")):
            rate, bf16 = gflops(n, args.repeats), gflops(n, args.repeats, torch.bfloat16)
            best = max(best, rate)
            print(f"{threads:>7} {n:>5} {rate:>12.1f} {bf16:>12.1f}")
    per_token = 2 * args.params
    print(f"ceiling {best:.0f} GFLOP/s (fp32): a {args.params / 1e6:.1f}M-parameter model needs {per_token / 1e6:.1f} MFLOP a "
          f"token forward (x3 with backward): at most {best * 1e9 / per_token / 1e3:.0f}k tokens/s decoded, "
          f"{best * 1e9 / (3 * per_token) / 1e3:.0f}k tokens/s trained")


if __name__ == "__main__":
    main()
