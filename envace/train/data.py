"""Supervised examples from real trajectories: token ids plus ACT / REHEARSE role masks.

Per episode: one ACT sequence (the whole conversation, every ACT output a target) and one
REHEARSE sequence (every recorded call with its real response, each response a target).
The privileged facts of each call are dropped with probability `privileged_dropout`,
redrawn each epoch. Episodes that call a rare tool appear more than once per epoch (see
`repeats`): the gate holds every core tool to the same bar, and a tool the demonstrator
seldom calls would otherwise give both roles too few examples to learn it. A share of the
examples is `relabel`led each epoch (names renamed consistently): a tiny model otherwise
memorises which names are frequent instead of copying the ones in front of it. Renaming
works on the rendered text, whole words at a time, before tokenization — so it is the same
for our word-level tokenizer (a name is one token) and for a checkpoint's BPE (where `Alice`
and ` Alice` are different tokens and a name may span several).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter

import torch

from envace.data.episodes import fact_source, recorded_calls
from envace.data.tokenizer import WORDS, is_word_level, knows, splits_digits
from envace.domains import get_domain
from envace.roles import Segment, encode


NAME = re.compile(r"[A-Za-z0-9_$]+(?:[.\-][A-Za-z0-9_]+)*")  # a word piece (not punctuation or space)


def repeats(episodes: list[dict], max_repeat: int) -> list[int]:
    """How often each episode appears per epoch: about median / n for
    its rarest tool, where n counts that tool's calls and median is the median over tools;
    at least 1, at most `max_repeat`.

    >>> eps = [{"task": {"tools": [{"function": {"name": t}}]}, "messages": [{"role": "user"},
    ...        {"role": "act", "calls": [{"name": t}]}, {"role": "tool", "response": {}}]} for t in "aaaaaabbc"]
    >>> repeats(eps, 4)
    [1, 1, 1, 1, 1, 1, 1, 1, 2]
    """
    calls = [{c["name"] for c, _ in recorded_calls(e)} for e in episodes]
    counts = Counter(name for names in calls for name in names)
    if not counts:
        return [1] * len(episodes)
    median = sorted(counts.values())[len(counts) // 2]
    return [min(max_repeat, max(1, math.ceil(median / min(counts[n] for n in names) - 0.5))) if names else 1
            for names in calls]


def relabel_classes(domains, tokenizer, episodes: list[dict] = ()) -> list[list[str]]:
    """The interchangeable names of each domain, in the domains' given order, grouped by how
    many tokens `tokenizer` spells them with: a name is renamed only to one as long, so renaming
    never changes a sequence's length. With our word-level tokenizer that is the names it knows
    (one token each; with `spaced_words`, a name seen only after a separator, or as known glued
    parts, is known too, and a renamed name after a separator may take another number of tokens);
    a name it never saw is no word of its vocabulary and is left alone. A tokenizer that spells
    numbers digit by digit (`split_digits`) spells every number from known tokens, so every
    number is renamed.

    A domain names them itself (`Domain.interchangeable`), or names the arguments that hold them
    (`Tool.interchangeable`): then the names are the words those arguments take in `episodes`
    (numbers and words apart, so a number stays a number), less the words of the tools' schemas
    and the policy (renaming those would change the instructions, not just a name)."""
    vocab = tokenizer.get_vocab() if is_word_level(tokenizer) else None
    digits = splits_digits(tokenizer)
    classes = []
    for d in domains:
        for names in d.interchangeable + argument_names(d, [e for e in episodes if e["task"]["domain"] == d.name]):
            by_length: dict[int, list[str]] = {}
            for name in names:
                if vocab is None or knows(vocab, name) or (digits and name.isdigit()):
                    by_length.setdefault(len(tokenizer.tokenize(name)), []).append(name)
            classes += [group for _, group in sorted(by_length.items()) if len(group) > 1]
    return classes


def argument_names(domain, episodes: list[dict]) -> tuple[tuple[str, ...], ...]:
    """(numbers, words): the words the domain's interchangeable arguments take in `episodes`,
    and the words of response fields named like one of them (a pull request's `title` in a
    response is the same kind of name as `create_issue`'s `title`), in first-seen order (the
    renaming must not depend on set order)."""
    wanted = {t.name: set(t.interchangeable) for t in domain.tools if t.interchangeable}
    if not wanted:
        return ()
    kinds = set().union(*wanted.values())
    reserved = set(WORDS.findall(json.dumps(domain.schemas()) + domain.policy))
    values = []
    for ep in episodes:
        for call, response in recorded_calls(ep):
            args = call.get("arguments") or {}
            values += [v for arg, v in args.items() if arg in wanted.get(call["name"], ())] + fields_named(response, kinds)
    values = [v for v in values if not isinstance(v, bool)]
    pieces = [word for value in values for word in WORDS.findall(str(value))]
    numbers = dict.fromkeys(w for w in pieces if w.isdigit())
    words = dict.fromkeys(w for w in pieces if not w.isdigit() and NAME.fullmatch(w) and w not in reserved)
    return tuple(names for names in (tuple(numbers), tuple(words)) if names)


def fields_named(obj, keys: set[str]) -> list:
    """The plain values under `keys` anywhere in a JSON value, a list's elements one by one, depth first.

    >>> fields_named({"pulls": [{"number": 7, "title": "Fix cart"}], "tags": {"title": ["a", "b"]}}, {"title"})
    ['Fix cart', 'a', 'b']
    """
    if isinstance(obj, list):
        return [x for v in obj for x in fields_named(v, keys)]
    if not isinstance(obj, dict):
        return []
    found = []
    for k, v in obj.items():
        plain = [x for x in (v if isinstance(v, list) else [v]) if not isinstance(x, (dict, list))]
        found += plain if k in keys else fields_named(v, keys)
    return found


def relabel(segments: list[Segment], classes: list[list[str]], rng: random.Random) -> list[Segment]:
    """Rename every name consistently: a random permutation within each class, applied to
    whole words of the text (a JSON key or a longer word containing a name is left alone).

    >>> relabel([Segment("Send 5 from Ann to Bo"), Segment('"to":"Ann"', "act")], [["Ann", "Bo", "Cy"]],
    ...         random.Random(0))
    [Segment(text='Send 5 from Bo to Cy', role=None), Segment(text='"to":"Bo"', role='act')]
    """
    mapping = {}
    for cls in classes:
        mapping.update(zip(cls, permuted(cls, rng)))
    rename = lambda m: mapping.get(m.group(0), m.group(0))  # noqa: E731
    return [Segment(WORDS.sub(rename, seg.text), seg.role) for seg in segments]


def permuted(names: list[str], rng: random.Random) -> list[str]:
    """`rng.sample(names, len(names))`: the same permutation from the same draws, leaving `rng`
    in the same state, at half the cost — relabelling draws a permutation of every class for
    every renamed example, millions of draws an epoch. (CPython's `sample` of a whole list
    swaps from a pool with one `getrandbits` rejection draw per element; tested against it.)

    >>> permuted(["a", "b", "c", "d"], random.Random(1)) == random.Random(1).sample(["a", "b", "c", "d"], 4)
    True
    """
    getrandbits, pool, out = rng.getrandbits, list(names), []
    for size in range(len(pool), 0, -1):
        bits = size.bit_length()
        j = getrandbits(bits)
        while j >= size:
            j = getrandbits(bits)
        out.append(pool[j])
        pool[j] = pool[size - 1]
    return out


def recorded_steps(episode: dict) -> list[tuple]:
    """Each recorded call with its privileged facts and real response."""
    facts = fact_source(episode["task"])
    return [(c, facts.facts(c), r) for c, r in recorded_calls(episode)]


def fixed_parts(episode: dict, template) -> tuple[list[Segment], list[tuple]]:
    """What no epoch redraws: the ACT conversation and the `recorded_steps`."""
    task = episode["task"]
    act = template.act(task["tools"], task["request"], episode["messages"], policy=task.get("policy", ""))
    return act, recorded_steps(episode)


def rehearse_segments(task: dict, steps: list[tuple], template, rng: random.Random,
                      privileged_dropout: float) -> list[Segment]:
    """The REHEARSE conversation of an episode's `recorded_steps`, each call's facts dropped
    with probability `privileged_dropout`."""
    dropped = [(c, None if rng.random() < privileged_dropout else f, r) for c, f, r in steps]
    return template.rehearse(task["tools"], task["request"], dropped)


def episode_segments(episode: dict, template, rng: random.Random, privileged_dropout: float,
                     fixed: tuple | None = None) -> list[list[Segment]]:
    """The rendered examples of one episode: its ACT conversation and its REHEARSE conversation
    (`rehearse_segments`). `fixed`: the episode's `fixed_parts`, when the caller keeps them."""
    act, steps = fixed or fixed_parts(episode, template)
    if not steps:
        return [act]
    return [act, rehearse_segments(episode["task"], steps, template, rng, privileged_dropout)]


class SFTDataset(torch.utils.data.Dataset):
    """Examples for one epoch; call `resample(epoch)` to redraw the privileged dropout."""

    def __init__(self, episodes: list[dict], template, tokenizer, privileged_dropout: float, seed: int = 0,
                 max_len: int = 1024, max_repeat: int = 1, relabel_rate: float = 0.0):
        self.episodes, self.template, self.tokenizer = episodes, template, tokenizer
        self.dropout, self.seed, self.max_len = privileged_dropout, seed, max_len
        self.repeats = repeats(episodes, max_repeat)
        self.relabel_rate = relabel_rate
        self.fixed = [fixed_parts(ep, template) for ep in episodes]
        # domains in first-seen order: a set of Domain objects iterates in an order that hashes of
        # their functions (memory addresses) decide, which changed the renaming from run to run
        domains = dict.fromkeys(e["task"]["domain"] for e in episodes)
        self.classes = relabel_classes([get_domain(d) for d in domains], tokenizer, episodes)
        self.resample(0)

    def resample(self, epoch: int) -> None:
        rng = random.Random(f"{self.seed}-{epoch}")
        self.examples, memo = [], {}  # memo: most segments recur within an epoch (headers, unrenamed turns)
        for ep, fixed, repeat in zip(self.episodes, self.fixed, self.repeats):
            for _ in range(repeat):  # each repeat draws its own privileged dropout
                for segs in episode_segments(ep, self.template, rng, self.dropout, fixed):
                    if rng.random() < self.relabel_rate:
                        segs = relabel(segs, self.classes, rng)
                    ids, roles = encode(self.tokenizer, segs, memo)
                    self.examples.append((ids[: self.max_len], roles[: self.max_len]))

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def collate(batch, pad_id: int, rank: int = 0, world: int = 1):
    """Right-padded batch: input_ids [B, T], attention_mask [B, T], roles [B, T] (0 where padded).

    `batch` is the global batch; this rank takes every `world`-th example from `rank` on (a rank
    left without one gets an example with no targets: every rank must take part in the step).
    Each role's loss divisor, `(the global batch's target tokens of that role) / world`, makes
    the ranks' gradients, averaged, equal the gradient of the global batch's mean.
    """
    weights = {}
    for name, rid in (("act", 1), ("rehearse", 2)):
        n = sum(r == rid for _, roles in batch for r in roles[1:])
        weights[f"{name}_per"] = torch.tensor(max(n, 1) / world)
    batch = batch[rank::world] or [(batch[0][0], [0] * len(batch[0][1]))]
    T = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    roles = torch.zeros((len(batch), T), dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (x, r) in enumerate(batch):
        ids[i, : len(x)], roles[i, : len(r)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(r), 1
    return {"input_ids": ids, "attention_mask": mask, "roles": roles, **weights}


def length_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar length (little padding), in random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches
