"""prepare — split the raw logs, train the tokenizer, write the dataset files.

Reads `data/raw/episodes.jsonl`; writes `data/prepared/{train,val,test}.jsonl` (the same
episode format, each task tagged with its split), `data/prepared/tokenizer/` (a
`PreTrainedTokenizerFast` trained on the training split — the texts both roles read and write,
the privileged facts REHEARSE reads included — plus the configured domains' tool schemas and
policies only), and `metrics/prepare.json`.
"""

from __future__ import annotations

from pathlib import Path

from envace.config import Params
from envace.data.episodes import episode_error, fact_source, recorded_calls
from envace.data.splits import assign_splits
from envace.data.tokenizer import episode_texts, model_json, schema_texts, train_tokenizer
from envace.domains import use_domains
from envace.io import atomic_dir, read_jsonl, write_json, write_jsonl
from envace.paths import PREPARED, RAW, TOKENIZER
from envace.stages import StageFailed

SPLITS = ("train", "val", "test")
METRICS = Path("metrics/prepare.json")


def run(params: Params) -> dict[str, Path]:
    """Split the raw logs, train the tokenizer, write the dataset files."""
    cfg = params.prepare
    try:
        episodes = list(read_jsonl(RAW))
    except OSError as err:
        raise StageFailed(f"{RAW}: cannot read ({err.strerror}); run collect first") from None
    for lineno, episode in enumerate(episodes, 1):
        problem = episode_error(episode)
        if problem:
            raise StageFailed(f"{RAW}:{lineno}: {problem}")
    splits = assign_splits(episodes, cfg.val_fraction, cfg.test_fraction, cfg.seed)
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for ep, split in zip(episodes, splits):
        ep["task"]["split"] = split
        by_split[split].append(ep)
    empty = [s for s in SPLITS if not by_split[s]]
    if empty:
        raise StageFailed(f"split(s) {', '.join(empty)} got no episodes; collect more tasks or raise the fractions")
    for split, rows in by_split.items():
        write_jsonl(PREPARED / f"{split}.jsonl", rows)

    domains = use_domains(params.collect.domains)
    schemas = [s for domain in domains for s in domain.schemas()]  # the configured tools
    texts = [t for ep in by_split["train"] for t in (*episode_texts(ep), *fact_texts(ep))]
    texts += [*schema_texts(schemas), *(d.policy for d in domains if d.policy)]
    tokenizer = train_tokenizer(texts, cfg.min_token_frequency, cfg.split_digits, cfg.spaced_words, cfg.digit_places)
    with atomic_dir(TOKENIZER) as tmp:
        tokenizer.save_pretrained(tmp)
    write_json(METRICS, {
        "episodes": {s: len(rows) for s, rows in by_split.items()},
        "vocab_size": len(tokenizer),
        "train_tokens": sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts),
    })
    return {**{s: PREPARED / f"{s}.jsonl" for s in SPLITS}, "tokenizer": TOKENIZER, "metrics": METRICS}


def fact_texts(episode: dict):
    """The privileged facts REHEARSE reads for each of the episode's calls, as it reads them: a
    key only the facts hold (`"next_number":`) is then one token, as every key of a response is,
    instead of six pieces REHEARSE cannot copy a value by."""
    facts = fact_source(episode["task"])
    for call, _ in recorded_calls(episode):
        found = facts.facts(call)
        if found is not None:
            yield model_json(found)


if __name__ == "__main__":
    from envace.stages import main

    main("prepare", run)
