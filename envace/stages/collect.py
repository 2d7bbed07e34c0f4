"""collect — generate tasks and run the demonstrator in the real backends.

Writes `data/raw/episodes.jsonl` (one episode per line, every response exactly as the
backend returned it; format in `envace.data.episodes`) and `metrics/collect.json` with the
demonstrator's success per domain and per task type.
"""

from __future__ import annotations

import random
from pathlib import Path

from tqdm import tqdm

from envace.config import Params
from envace.data.demonstrations import demonstrate, generate_tasks
from envace.domains import get_domain
from envace.evaluate import success_rates
from envace.io import write_json, write_jsonl

RAW = Path("data/raw/episodes.jsonl")
METRICS = Path("metrics/collect.json")


def run(params: Params) -> dict[str, Path]:
    """Generate tasks and demonstrator episodes in the real backends."""
    cfg = params.collect
    episodes = []
    for name in cfg.domains:
        domain = get_domain(name)
        tasks = generate_tasks(domain, cfg.tasks_per_domain, cfg.seed)
        rng = random.Random(f"{cfg.seed}-demonstrator-{name}")
        for task in tqdm(tasks, desc=f"collect {name}", unit="task", leave=False):
            episodes.append(demonstrate(domain, task, cfg.demonstrator, rng))
    write_jsonl(RAW, episodes)
    write_json(METRICS, success_report(episodes))
    return {"episodes": RAW, "metrics": METRICS}


def success_report(episodes: list[dict]) -> dict:
    rates = success_rates((ep["task"]["domain"], ep["task"]["task_type"], ep["success"]) for ep in episodes)
    return {
        "episodes": len(episodes),
        "demonstrator_success": rates["overall"],
        "per_domain": rates["per_domain"],
        "per_task_type": rates["per_task_type"],
    }


if __name__ == "__main__":
    from envace.stages import main

    main("collect", run)
