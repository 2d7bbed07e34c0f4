"""The episode runner: many episodes at once, one policy, one of three responders.

Each turn, every live episode's ACT prompt is generated, `batch_size` episodes at a time;
the calls ACT made in those episodes are answered by the responder in one batch — the real
backend, the policy itself in the REHEARSE role, or a separate frozen simulator model — and
appended to the history as if the tool had answered. Caps on turns, calls per turn and
tokens per generation are enforced; a malformed generation or a broken cap is a failed step
recorded in the episode (`episode.failure`), never an exception.

Every episode keeps each generation with the role that produced it, from which the
token-level ACT / REHEARSE masks are built, the source of each response, and counters:
real-backend calls and generated tokens per role.

Two test-time additions (`envace.rehearsal`): an episode may carry a rehearsal memory
(imagined episodes ACT sees as context), and a guard may screen each turn's calls before
they run: a call it holds is never executed, and its tool message is the guard's.

Each episode has its own random stream (`Episode.stream`): its k-th generation samples with
the key `mix64(stream, k)` and its privileged-fact dropouts draw from the same stream, so an
episode plays out the same whichever episodes share its batch (or its data-parallel rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from envace import judge
from envace.config import RolloutConfig, TrainerConfig
from envace.data.episodes import answer_of, calls_of
from envace.domains import get_domain
from envace.domains.base import Task
from envace.roles import ACT, REHEARSE, Failure, encode, parse_act, parse_rehearse, template_for
from envace.rollout.generate import generate, mix64, unit

SIMULATOR = "simulator"
MEMO_SEGMENTS = 100_000  # a policy's tokenized segments kept (a few tens of MB), then forgotten at once


@dataclass
class Generation:
    role: str  # ACT, REHEARSE (trained) or SIMULATOR (a frozen model's, never trained)
    prompt_ids: list[int]  # [P]
    output_ids: list[int]  # [L], the stop token included when produced


@dataclass
class Episode:
    task: Task
    messages: list[dict]
    stream: int = 0  # the episode's random stream key (`mix64`)
    generations: list[Generation] = field(default_factory=list)
    failure: str | None = None  # why the episode stopped early, if it did
    done: bool = False
    real_calls: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {ACT: 0, REHEARSE: 0, SIMULATOR: 0})
    final_state: dict | None = None  # real backend's state at the end (real responder only)
    success: bool = False
    memory: list[list[dict]] | None = None  # a rehearsal memory: imagined episodes' messages
    reviews: list = field(default_factory=list)  # the guard's verdicts on its high-risk calls

    def fail(self, reason: str) -> None:
        self.failure, self.done = reason, True
        self.messages.append({"role": "failed_step", "reason": reason})

    @property
    def calls(self) -> list[dict]:
        return calls_of(self.messages)

    @property
    def answer(self) -> str | None:
        return None if self.failure else answer_of(self.messages)

    def role_masks(self) -> list[tuple[list[int], list[int], list[int]]]:
        """Per generation: (prompt + output ids, ACT mask, REHEARSE mask) — 1 where that role wrote."""
        out = []
        for g in self.generations:
            ids = g.prompt_ids + g.output_ids
            gen = [0] * len(g.prompt_ids) + [1] * len(g.output_ids)
            out.append((ids, [m * (g.role == ACT) for m in gen], [m * (g.role == REHEARSE) for m in gen]))
        return out


class Policy:
    """A model and its tokenizer, generating text for either role within `max_len` tokens of
    context (default: the model's `max_position_embeddings`), under autocast to `autocast`
    (e.g. bf16 on a GPU) when given."""

    def __init__(self, model, tokenizer, max_len: int | None = None, autocast: torch.dtype | None = None):
        self.model, self.tokenizer, self.autocast = model, tokenizer, autocast
        self.max_len = max_len or (model.config.max_position_embeddings if model is not None else 1 << 30)
        self.template = template_for(tokenizer)
        self.stop_id = tokenizer.convert_tokens_to_ids(self.template.end)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_id
        self.memo: dict[str, list[int]] = {}  # segment text -> ids: every turn re-encodes the conversation

    def encode(self, segments) -> list[int]:
        if len(self.memo) > MEMO_SEGMENTS:
            self.memo.clear()
        return encode(self.tokenizer, segments, self.memo)[0]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 streams: list[int] | None = None) -> list[list[int] | None]:
        """New tokens per prompt; None for a prompt that leaves no room for `max_new_tokens`."""
        fits = [i for i, p in enumerate(prompts) if len(p) + max_new_tokens <= self.max_len]
        device = next(self.model.parameters()).device.type if fits else "cpu"
        with torch.autocast(device, dtype=self.autocast, enabled=self.autocast is not None):
            outs = generate(self.model, [prompts[i] for i in fits], max_new_tokens, self.stop_id, self.pad_id,
                            temperature, top_p, [streams[i] for i in fits] if streams is not None else None)
        result: list[list[int] | None] = [None] * len(prompts)
        for i, out in zip(fits, outs):
            result[i] = out
        return result


def load_policy(path, trainer: TrainerConfig, max_seq_len: int = 0, base=None) -> Policy:
    """A trained model (`base`: the checkpoint its LoRA adapters need) for inference on the
    device and in the precision of `trainer`, within `max_seq_len` tokens (0: the model's)."""
    from envace.model import autocast_dtype, device_of, load, precision_of, weights_dtype

    precision = precision_of(trainer)
    model, tokenizer = load(path, dtype=weights_dtype(precision), base=base)
    model = model.to(device_of(trainer)).eval()
    limit = model.config.max_position_embeddings
    return Policy(model, tokenizer, min(max_seq_len, limit) if max_seq_len else limit, autocast_dtype(precision))


def _text(policy: Policy, ids: list[int] | None, cap: int) -> str | Failure:
    if ids is None:
        return Failure("context_limit", "")
    if not ids or ids[-1] != policy.stop_id:
        return Failure("truncated" if len(ids) >= cap else "no_stop_token", policy.decode(ids))
    return policy.decode(ids)


class Responder(Protocol):
    source: str

    def start(self, episodes: list[Episode]) -> None: ...

    def respond(self, requests: list[tuple[Episode, dict]]) -> list[dict | Failure]: ...


class RealResponder:
    """The real environment: each episode gets a fresh backend built from its scenario."""

    source = "real"

    def start(self, episodes: list[Episode]) -> None:
        self.backends = {id(e): get_domain(e.task.domain).real(e.task.scenario) for e in episodes}

    def respond(self, requests):
        out = []
        for episode, call in requests:
            episode.real_calls += 1
            out.append(self.backends[id(episode)].execute(call, episode.task.tool_names))
        return out

    def final_state(self, episode: Episode) -> dict:
        return self.backends[id(episode)].state()


class ModelResponder:
    """A model in the REHEARSE role: the policy itself (`rehearsed`) or a frozen simulator."""

    DROPOUT = 1  # salt: the privileged-fact dropout draws of an episode's stream

    def __init__(self, policy: Policy, cfg: RolloutConfig, source: str, temperature: float,
                 privileged: bool = True, privileged_dropout: float = 0.0):
        self.policy, self.cfg, self.source, self.temperature = policy, cfg, source, temperature
        self.privileged, self.dropout = privileged, privileged_dropout

    def start(self, episodes: list[Episode]) -> None:
        # privileged facts are read from the task's scenario; no call is ever executed, and
        # without privileged facts no backend is even built
        self.fact_sources = {id(e): get_domain(e.task.domain).fact_source(e.task.scenario) for e in episodes} \
            if self.privileged else {}
        self.steps: dict[int, list[tuple]] = {id(e): [] for e in episodes}  # (call, facts shown, response)
        self.asked: dict[int, int] = {id(e): 0 for e in episodes}  # calls rehearsed so far

    def facts(self, episode: Episode, call: dict) -> dict | None:
        self.asked[id(episode)] += 1
        if not self.privileged or unit(episode.stream, self.DROPOUT, self.asked[id(episode)]) < self.dropout:
            return None
        return self.fact_sources[id(episode)].facts(call)

    def respond(self, requests):
        prompts, shown, streams = [], [], []
        for episode, call in requests:
            shown.append(self.facts(episode, call))
            steps = self.steps[id(episode)] + [(call, shown[-1], None)]
            prompts.append(self.policy.encode(self.policy.template.rehearse(
                episode.task.tools, episode.task.request, steps, train=False)))
            pending = sum(e is episode for e, _ in requests[: len(prompts) - 1])  # its earlier calls this turn
            streams.append(mix64(episode.stream, len(episode.generations) + pending))
        outputs = self.policy.generate(prompts, self.cfg.max_new_tokens, self.temperature, self.cfg.top_p, streams)
        role = REHEARSE if self.source == "rehearsed" else SIMULATOR
        responses = []
        for (episode, call), prompt, ids, facts in zip(requests, prompts, outputs, shown):
            text = _text(self.policy, ids, self.cfg.max_new_tokens)
            episode.generations.append(Generation(role, prompt, ids or []))
            episode.tokens[role] += len(ids or [])
            response = text if isinstance(text, Failure) else parse_rehearse(text, self.policy.template.end)
            if not isinstance(response, Failure):
                self.steps[id(episode)].append((call, facts, response))
            responses.append(response)
        return responses


class Guard(Protocol):
    stops_episode: bool  # a held call ends its episode (it waits for a person) or ACT revises

    def screen(self, requests: list[tuple[Episode, dict]]) -> list[dict | None]:
        """Per call: None to run it, or the tool message's response for a call held."""
        ...


class EpisodeRunner:
    def __init__(self, policy: Policy, responder: Responder, cfg: RolloutConfig, temperature: float,
                 seed: int = 0, guard: Guard | None = None):
        self.policy, self.responder, self.cfg, self.temperature = policy, responder, cfg, temperature
        self.seed, self.guard = seed, guard

    def run(self, tasks: list[Task], streams: list[int] | None = None,
            memories: list[list[list[dict]] | None] | None = None) -> list[Episode]:
        """Play one episode per task; `streams` are their random stream keys (default: the
        runner's seed and each task's position), `memories` their rehearsal memories.

        Every episode takes its turns with all the others still live, `batch_size` at a time:
        as episodes end, the live ones of later tasks fill the batches, so a turn that few
        episodes reach is one small batch, not a small batch in every group of `batch_size` tasks."""
        streams = streams if streams is not None else [mix64(self.seed, i) for i in range(len(tasks))]
        memories = memories if memories is not None else [None] * len(tasks)
        episodes = [Episode(t, [{"role": "user", "content": t.request}], k, memory=m)
                    for t, k, m in zip(tasks, streams, memories)]
        self.responder.start(episodes)
        for _ in range(self.cfg.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            for start in range(0, len(live), self.cfg.batch_size):
                self._turn(live[start : start + self.cfg.batch_size])
        for e in episodes:
            if not e.done:
                e.fail("turn_limit")
            self._judge(e)
        return episodes

    def _turn(self, live: list[Episode]) -> None:
        """One turn of `live`: ACT, then the guard and the responder for the calls it made."""
        calling = self._act(live)
        requests = [(e, c) for e in calling for c in e.messages[-1]["calls"]]
        holds = self.guard.screen(requests) if self.guard and requests else [None] * len(requests)
        run = [r for r, hold in zip(requests, holds) if hold is None]
        answers = iter(self.responder.respond(run) if run else [])
        for (episode, call), hold in zip(requests, holds):
            response = next(answers) if hold is None else hold
            if episode.done:
                continue  # an earlier call of this turn already failed
            if isinstance(response, Failure):
                episode.fail(f"{self.responder.source}:{response.reason}")
                continue
            source = self.responder.source if hold is None else "guard"
            episode.messages.append({"role": "tool", "name": call["name"], "response": response, "source": source})
        for episode in {id(e): e for (e, _), hold in zip(requests, holds) if hold is not None}.values():
            if self.guard.stops_episode and not episode.done:
                episode.fail("guard:held_for_confirmation")

    def _act(self, live: list[Episode]) -> list[Episode]:
        """One ACT turn for every live episode; returns those that made calls."""
        tmpl = self.policy.template
        prompts = [self.policy.encode(tmpl.act_prompt(e.task.tools, e.task.request, e.messages, e.memory, e.task.policy)) for e in live]
        streams = [mix64(e.stream, len(e.generations)) for e in live]
        outputs = self.policy.generate(prompts, self.cfg.max_new_tokens, self.temperature, self.cfg.top_p, streams)
        calling = []
        for episode, prompt, ids in zip(live, prompts, outputs):
            text = _text(self.policy, ids, self.cfg.max_new_tokens)
            episode.generations.append(Generation(ACT, prompt, ids or []))
            episode.tokens[ACT] += len(ids or [])
            out = text if isinstance(text, Failure) else parse_act(text, episode.task.tools, self.cfg.max_calls_per_turn, tmpl.end)
            if isinstance(out, Failure):
                episode.fail(f"act:{out.reason}")
            elif out.answer is not None:
                episode.messages.append({"role": "act", "answer": out.answer})
                episode.done = True
            else:
                episode.messages.append({"role": "act", "calls": out.calls})
                calling.append(episode)
        return calling

    def _judge(self, episode: Episode) -> None:
        """Success from the checklist; in the real environment, the final state too."""
        expected = None
        if isinstance(self.responder, RealResponder) and episode.task.checklist.ground_truth:
            episode.final_state = self.responder.final_state(episode)  # compared when the ground truth is known
            expected = get_domain(episode.task.domain).replay(episode.task).state()
        episode.success = judge.success(episode.task, episode.calls, episode.answer, episode.final_state, expected)
