"""collect — the episodes every later stage learns from, one domain at a time.

A built-in domain (or any with a scripted demonstrator) generates tasks and runs the
demonstrator in its real backend; a domain that brings logs (a folder's episodes.jsonl)
has them validated line by line and imported (`envace.data.logs`) — the first bad line
stops the stage naming file:line and field, and nothing is written.

Writes `data/raw/episodes.jsonl` (one episode per line, every response exactly as the real
tool returned it; format in `envace.data.episodes`) and `metrics/collect.json`: success per
domain and task type, and per domain where its episodes came from, which backend it has,
whether REHEARSE gets privileged facts, and how the checklists were obtained.
"""

from __future__ import annotations

import random
from pathlib import Path

from tqdm import tqdm

from envace.config import Params
from envace.data.demonstrations import demonstrate, generate_tasks
from envace.data.logs import import_logs
from envace.domains import use_domains
from envace.evaluate import success_rates
from envace.io import write_json, write_jsonl
from envace.paths import COLLECTED, RAW
from envace.stages import StageFailed

METRICS = COLLECTED


def run(params: Params) -> dict[str, Path]:
    """Generate demonstrator episodes or import logged ones, per configured domain."""
    cfg = params.collect
    episodes, sources = [], {}
    for domain in use_domains(cfg.domains, real_backends=cfg.real_backends):
        if domain.logs is not None:
            imported, sources[domain.name] = import_logs(domain)
            episodes += imported
        else:
            episodes += generated(domain, params)
            sources[domain.name] = {"episodes": cfg.tasks_per_domain, "generated": True}
        sources[domain.name].update(backend=domain.backend_kind, privileged_facts=domain.facts_from)
    write_jsonl(RAW, episodes)
    write_json(METRICS, {**success_report(episodes), "sources": sources})
    return {"episodes": RAW, "metrics": METRICS}


def generated(domain, params: Params) -> list[dict]:
    cfg = params.collect
    if domain.demonstrate is None or domain.backend is None:
        raise StageFailed(f"domain {domain.name!r} has neither logs nor a demonstrator with a real backend")
    tasks = generate_tasks(domain, cfg.tasks_per_domain, cfg.seed)
    rng = random.Random(f"{cfg.seed}-demonstrator-{domain.name}")
    return [demonstrate(domain, task, cfg.demonstrator, rng)
            for task in tqdm(tasks, desc=f"collect {domain.name}", unit="task", leave=False)]


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
