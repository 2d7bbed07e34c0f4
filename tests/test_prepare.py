import json
import os

import pytest

from envace.data.splits import assign_splits, scenario_key
from envace.io import read_jsonl


def _episode(i, request=None, scenario=None):
    return {"task": {"id": f"t{i}", "request": request or f"req {i}", "scenario": scenario or {"n": i}}}


def test_splits_are_deterministic_and_roughly_proportional():
    eps = [_episode(i) for i in range(2000)]
    a = assign_splits(eps, 0.1, 0.2, seed=0)
    assert a == assign_splits(eps, 0.1, 0.2, seed=0)
    assert a != assign_splits(eps, 0.1, 0.2, seed=1)
    share = {s: a.count(s) / len(a) for s in ("train", "val", "test")}
    assert abs(share["test"] - 0.2) < 0.03 and abs(share["val"] - 0.1) < 0.03


def test_splits_do_not_depend_on_log_order():
    """Grouped episodes too: a group's split comes from its smallest id, not its first."""
    import random

    eps = [_episode(i) for i in range(200)]
    eps += [_episode(1000 + i, request=f"shared {i % 30}") for i in range(120)]  # 30 groups of 4
    by_id = lambda order: dict(zip((e["task"]["id"] for e in order), assign_splits(order, 0.1, 0.2, 0)))  # noqa: E731
    forward = by_id(eps)
    for seed in range(5):
        shuffled = eps[:]
        random.Random(seed).shuffle(shuffled)
        assert by_id(shuffled) == forward
    assert len({forward[f"t{1000 + i}"] for i in range(120)}) > 1  # groups do spread over splits


def test_episodes_sharing_a_request_or_scenario_land_in_one_split():
    eps = [_episode(i) for i in range(300)]
    eps += [_episode(1000 + i, request="same request") for i in range(20)]
    eps += [_episode(2000 + i, scenario={"shared": True}) for i in range(20)]
    eps.append(_episode(3000, request="same request", scenario={"shared": True}))  # joins both groups
    splits = assign_splits(eps, 0.1, 0.2, seed=0)
    grouped = {s for e, s in zip(eps, splits) if e["task"]["request"] == "same request" or e["task"]["scenario"] == {"shared": True}}
    assert len(grouped) == 1


def test_prepare_writes_disjoint_splits_and_a_tokenizer(prepared_dir):
    seen = {}
    for split in ("train", "val", "test"):
        for ep in read_jsonl(prepared_dir / "data/prepared" / f"{split}.jsonl"):
            assert ep["task"]["split"] == split
            for key in (ep["id"], ep["task"]["request"], scenario_key(ep["task"]["scenario"])):
                assert seen.setdefault(key, split) == split, f"{key} in two splits"
    metrics = json.loads((prepared_dir / "metrics/prepare.json").read_text())
    assert metrics["vocab_size"] > 100


@pytest.fixture(scope="module")
def tokenizer(prepared_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")


def test_tokenizer_round_trips_held_out_traffic_exactly(tokenizer, prepared_dir):
    from envace.data.tokenizer import episode_texts

    texts = [t for ep in read_jsonl(prepared_dir / "data/prepared/test.jsonl") for t in episode_texts(ep)]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        assert tokenizer.unk_token_id not in ids


def test_entities_and_numbers_seen_in_training_are_single_tokens(tokenizer, prepared_dir):
    ep = next(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))
    call = next(m for m in ep["messages"] if "calls" in m)["calls"][0]
    for value in call["arguments"].values():
        if isinstance(value, str) and " " not in value:
            assert len(tokenizer.tokenize(value)) == 1, value
    # a key, its colon and a string value's opening quote are one token: values follow keys directly
    assert tokenizer.tokenize('{"status":"completed","amount":40}') == ["{", '"status":"', "completed", '"', ",", '"amount":', "40", "}"]


def test_every_key_of_the_privileged_facts_is_one_token(tokenizer, prepared_dir):
    """REHEARSE copies a value by the key in front of it, so a key only the facts hold must be one
    token too: the tokenizer is trained on the facts REHEARSE reads, not only on the traffic."""
    from envace.data.tokenizer import WORDS
    from envace.stages.prepare import fact_texts

    keys = {piece for ep in read_jsonl(prepared_dir / "data/prepared/train.jsonl") for text in fact_texts(ep)
            for piece in WORDS.findall(text) if piece.startswith('"')}
    assert len(keys) > 5
    assert {k: tokenizer.tokenize(k) for k in keys if len(tokenizer.tokenize(k)) != 1} == {}


def test_unseen_word_falls_back_to_characters(tokenizer):
    pieces = tokenizer.tokenize("zqxwv")
    assert "".join(pieces) == "zqxwv" and len(pieces) > 1


def test_tokenizer_pads_on_the_left(tokenizer):
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token and tokenizer.eos_token and tokenizer.bos_token
