"""Role-wise GRPO (LightningModule): the policy learns from episodes it plays out against a
responder, with task success as the only signal.

Each step: `tasks_per_step` training tasks × `group_size` episodes, sampled at the training
temperature; the judge scores each episode from the task's checklist (never from the
rehearsed state); each role gets its advantage against its own group (`role_advantages`),
applied to the tokens that role generated, each episode weighted once per role. The
variants differ only in who answers the calls:

- `envace`    — the policy itself in the REHEARSE role (both roles trained; 0 real calls);
- `real_env`  — the real backend (calls counted; only ACT tokens exist to train);
- `simulator` — a frozen copy of the warmup model as REHEARSE (only ACT is trained);
- `sft`       — no RL (the warmup model as it is).

`envace` also trains ACT to use a rehearsal memory (test-time private rehearsal,
`envace.rehearsal`): in a group drawn with probability `train.memory_rate`, the first half
of the episodes rehearse without privileged facts (as at test time) and the second half
play with a memory of them. Only the second half is learned from, against its own
baseline: a private rehearsal makes the memory and nothing else. Judged like a real
episode, it taught the wrong lesson: its lookups are rehearsed without facts, so they
are guesses, and checking before an irreversible call looked useless.

Memory and scale: the loss is a weighted sum over tokens (`losses.token_weights`), so the
backward runs chunk by chunk (`train.chunk_rows` rows at a time) and peak memory is one
chunk's activations and logits. Under data parallelism each rank plays whole task groups
(every task's G episodes on one rank, so advantages are exactly the single-process ones),
the normalisers (episodes per role, ACT tokens) are summed across ranks, and the ranks'
gradients are summed: N ranks take the same step as one process with the same global batch.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time

import lightning as L
import torch
import torch.nn.functional as F

from envace import judge
from envace.config import RolesConfig, RolloutConfig, TrainConfig
from envace.domains.base import Task
from envace.roles import ACT, REHEARSE, ROLE_IDS, leaked
from envace.rollout.generate import mix64, unit
from envace.rollout.runner import SIMULATOR, Episode, EpisodeRunner, ModelResponder, Policy, RealResponder
from envace.train import VARIANTS, is_sharded_strategy, rank_divergence, shard, sync_replica
from envace.train.data import collate
from envace.rehearsal.memory import condense
from envace.train.losses import ACT_ID, REHEARSE_ID, grpo_role_loss, leak_mass, role_advantages, role_targets, token_weights


def responder_for(variant: str, policy: Policy, rollout: RolloutConfig, roles: RolesConfig, cfg: TrainConfig,
                  simulator: Policy | None = None):
    if variant == "envace":
        return ModelResponder(policy, rollout, "rehearsed", cfg.temperature, privileged=True,
                              privileged_dropout=roles.privileged_dropout)
    if variant == "real_env":
        return RealResponder()
    if variant == "simulator":
        if simulator is None:
            raise ValueError("variant 'simulator' needs a frozen simulator model")
        return ModelResponder(simulator, rollout, SIMULATOR, cfg.temperature, privileged=True,
                              privileged_dropout=roles.privileged_dropout)
    raise ValueError(f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS[1:])}")


def rewards_of(episodes: list[Episode], process_weight: float) -> torch.Tensor:
    """Binary success, plus `process_weight` × the mean per-step process reward. → [E]"""
    out = []
    for e in episodes:
        r = float(e.success)
        if process_weight:
            steps = [m["calls"] for m in e.messages if m["role"] == "act" and "calls" in m]
            partial = judge.process_rewards(e.task, steps)
            r += process_weight * (sum(partial) / len(partial) if partial else 0.0)
        out.append(r)
    return torch.tensor(out)


def generation_rows(episodes: list[Episode]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """Every trained generation as (ids, roles) rows with their episode index. A generation
    whose prompt extends the previous row of the same episode and role joins that row (a
    role's later prompts repeat its earlier turns), so each token is read once; the
    tokens in between (tool responses, the next prompt) carry role 0. Frozen-simulator
    outputs carry role 0 too (context, never trained)."""
    rows, episode_of = [], []
    for i, e in enumerate(episodes):
        last: dict[str, int] = {}  # role -> its latest row
        for g in e.generations:
            if g.role not in (ACT, REHEARSE):
                continue
            rid, j = ROLE_IDS[g.role], last.get(g.role)
            if j is not None and g.prompt_ids[: len(rows[j][0])] == rows[j][0]:
                ids, roles = rows[j]
                rows[j] = (g.prompt_ids + g.output_ids, roles + [0] * (len(g.prompt_ids) - len(ids)) + [rid] * len(g.output_ids))
            else:
                last[g.role] = len(rows)
                rows.append((g.prompt_ids + g.output_ids, [0] * len(g.prompt_ids) + [rid] * len(g.output_ids)))
                episode_of.append(i)
    return rows, episode_of


def leak_token_ids(tokenizer, words: set[str]) -> torch.Tensor:
    """Ids of the leak words that are one token each: the persona-leak loss pushes their
    probability down at ACT positions. With our word-level tokenizer that is every leak word;
    with a BPE tokenizer only whole-word tokens count (a sub-word piece is not a leak)."""
    ids = {tokenizer.convert_tokens_to_ids(w) for w in words if len(tokenizer.tokenize(w)) == 1}
    ids = {i for i in ids if i is not None and i != tokenizer.unk_token_id} - set(tokenizer.all_special_ids)
    return torch.tensor(sorted(ids), dtype=torch.long)


def rank_share(groups: int, rank: int, world: int) -> list[int]:
    """The task groups rank `rank` of `world` plays: every world-th from its rank on.

    >>> rank_share(5, 1, 2)
    [1, 3]
    """
    return list(range(rank, groups, world))


class GRPOModule(L.LightningModule):
    def __init__(self, policy: Policy, tasks: list[Task], variant: str, cfg: TrainConfig, rollout: RolloutConfig,
                 roles: RolesConfig, leak_words: set[str], simulator: Policy | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.policy, self.model = policy, policy.model
        self.tasks, self.variant, self.cfg = tasks, variant, cfg
        self.leak_set = set(leak_words)
        self.register_buffer("leak_ids", leak_token_ids(policy.tokenizer, self.leak_set), persistent=False)
        self.reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
        self.responder = responder_for(variant, policy, rollout, roles, cfg, simulator)
        self.runner = EpisodeRunner(policy, self.responder, rollout, temperature=cfg.temperature)
        self.memory_episodes = roles.memory_episodes
        self.scouts = None  # envace with memory training: the runner of the private rehearsals
        if variant == "envace" and cfg.memory_rate > 0:
            scout = ModelResponder(policy, rollout, "rehearsed", cfg.temperature, privileged=False)
            self.scouts = EpisodeRunner(policy, scout, rollout, temperature=cfg.temperature)
        self.real_calls = 0
        self.history: list[dict] = []
        self.tokens_per_s: list[float] = []  # rollout speed per step
        self.supervised_start: dict = {}  # ACT's supervised start before step 0 (envace.stages.train)
        self.rank_divergence = 0.0
        object.__setattr__(self, "replica", None)  # FSDP: what generates (not a submodule: never trained)

    def configure_model(self) -> None:
        """Under FSDP: train the sharded model, generate with an unsharded replica (`refresh`)."""
        if is_sharded_strategy(self.trainer) and self.replica is None:
            self.model, replica = shard(self.model, self.trainer.strategy)
            object.__setattr__(self, "replica", replica)
            self.policy.model = replica
            if self.reference is not None:
                self.reference.to(self.trainer.strategy.root_device)

    def refresh(self) -> None:
        """Under FSDP: the replica takes the current weights (every rank: a gather)."""
        if self.replica is not None:
            sync_replica(self.model, self.replica)

    def sample_tasks(self, step: int, rank: int = 0, world: int = 1) -> tuple[list[Task], torch.Tensor, list[int]]:
        """This rank's share of step `step`'s episodes: (tasks [E], task group of each [E], and
        each episode's random stream). Streams follow (seed, step, group, member), so an
        episode plays out the same on any rank."""
        rng = random.Random(f"{self.cfg.seed}-{step}")
        chosen = rng.sample(self.tasks, min(self.cfg.tasks_per_step, len(self.tasks)))
        G, mine = self.cfg.group_size, rank_share(len(chosen), rank, world)
        tasks = [chosen[k] for k in mine for _ in range(G)]
        streams = [mix64(self.cfg.seed, step, k, g) for k in mine for g in range(G)]
        return tasks, torch.arange(len(mine)).repeat_interleave(G), streams

    def training_step(self, batch, batch_idx):
        start, step = time.perf_counter(), len(self.history)  # global_step counts optimizer steps (ppo_epochs each)
        tasks, task_of, streams = self.sample_tasks(step, self.global_rank, self.trainer.world_size)
        self.refresh()
        self.policy.model.eval()
        with torch.no_grad():
            played, learned = self.play(tasks, streams)
        gen_s = time.perf_counter() - start
        keep = [i for i, judged in enumerate(learned) if judged]
        episodes, task_of = [played[i] for i in keep], task_of[keep]
        rewards = rewards_of(episodes, self.cfg.process_reward)
        rows, episode_of = generation_rows(episodes)
        counts = role_token_counts(rows, episode_of, len(episodes))
        advantages = {rid: role_advantages(rewards, task_of, counts[rid] > 0, self.cfg.normalize_std) for rid in counts}
        # normalisers over every rank's episodes: [episodes ACT wrote in, REHEARSE wrote in, ACT tokens]
        norms = self._sum(torch.tensor([float((counts[ACT_ID] > 0).sum()), float((counts[REHEARSE_ID] > 0).sum()),
                                        float(counts[ACT_ID].sum())]))
        # one update per rollout batch: the old policy is the current one (ratio 1), no extra pass
        old = self._logprobs(rows, self.model) if self.cfg.ppo_epochs > 1 else None
        ref = self._logprobs(rows, self.reference) if self.reference is not None else None
        self.model.train()
        opt = self.optimizers()
        for _ in range(self.cfg.ppo_epochs):
            opt.zero_grad()
            no_reducer = getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)
            with no_reducer():  # DDP's reducer stays out of the chunks' backward: we sum once, below
                parts = self._backward(rows, episode_of, counts, advantages, norms, old, ref)
            self._sync_gradients()
            if self.replica is not None:  # FSDP: the norm over every rank's shards
                self.model.clip_grad_norm_(self.cfg.grad_clip)
            else:
                self.clip_gradients(opt, gradient_clip_val=self.cfg.grad_clip, gradient_clip_algorithm="norm")
            opt.step()
        self._record(step, episodes, rewards, advantages, parts, gen_s, played)

    MEMORY = 2  # salt: whether a group trains with a rehearsal memory

    def play(self, tasks: list[Task], streams: list[int]) -> tuple[list[Episode], list[bool]]:
        """The step's episodes, in order, and whether each is learned from. A group drawn
        for memory training (by its first episode's stream: the same on any rank) plays its
        first half as private rehearsals, not learned from, and its second half with their
        memory."""
        if self.scouts is None:
            return self.runner.run(tasks, streams), [True] * len(tasks)
        G = self.cfg.group_size
        drawn = {i // G for i in range(0, len(tasks), G) if unit(streams[i], self.MEMORY) < self.cfg.memory_rate}
        scout_ids = [i for i in range(len(tasks)) if i // G in drawn and i % G < G // 2]
        scouted = dict(zip(scout_ids, self.scouts.run([tasks[i] for i in scout_ids], [streams[i] for i in scout_ids])))
        rest = [i for i in range(len(tasks)) if i not in scouted]
        memories = [condense([scouted[j] for j in range(i - i % G, i - i % G + G // 2)], self.memory_episodes)
                    if i // G in drawn else None for i in rest]
        played = dict(zip(rest, self.runner.run([tasks[i] for i in rest], [streams[i] for i in rest], memories)))
        return [scouted.get(i) or played[i] for i in range(len(tasks))], [i not in scouted for i in range(len(tasks))]

    def _record(self, step, episodes, rewards, advantages, parts, gen_s, played) -> None:
        """Telemetry of the step over all ranks' learned episodes (sums gathered, then ratios);
        real calls and generated tokens over every episode `played`, private rehearsals included."""
        act_texts = [self.policy.decode(g.output_ids) for e in episodes for g in e.generations if g.role == ACT]
        sums = self._sum(torch.tensor([
            float(len(episodes)), float(rewards.sum()), float(sum(e.success for e in episodes)),
            float(advantages[ACT_ID].abs().sum()), float(advantages[REHEARSE_ID].abs().sum()),
            float(len(act_texts)), float(sum(leaked(t, self.leak_set) for t in act_texts)),
            float(sum(e.real_calls for e in played)), float(sum(sum(e.tokens.values()) for e in played)),
            float(parts["kl"]), float(parts["clipped"]), float(parts["tokens"]), float(parts["loss"]),
        ], dtype=torch.float64))
        n, reward, success, adv_act, adv_reh, acts, leaks, real, generated, kl, clipped, tokens, loss = sums.tolist()
        self.real_calls += int(real)
        metrics = {
            "reward": reward / n, "success": success / n, "adv_act_abs": adv_act / n, "adv_rehearse_abs": adv_reh / n,
            "kl": kl, "clip_frac": clipped / max(1.0, tokens), "loss": loss, "leak_rate": leaks / max(1.0, acts),
            "real_calls": float(self.real_calls),
        }
        self.history.append({"step": step, **{k: round(v, 4) for k, v in metrics.items()}})
        self.tokens_per_s.append(generated / gen_s)  # a timing: logged, not kept in the tracked history
        logged = {f"train/{k}": v for k, v in {**metrics, "tokens_per_s": generated / gen_s}.items()
                  if k not in self.constant_by_design()}
        self.log("train/reward", logged.pop("train/reward"), prog_bar=True, batch_size=len(episodes))
        self.log_dict(logged, prog_bar=False, batch_size=len(episodes))

    def constant_by_design(self) -> set[str]:
        """Telemetry that cannot move under this configuration (not logged to MLflow: a flat
        zero is noise there; the step history keeps every key)."""
        return ({"kl"} if self.cfg.kl_coef == 0 else set()) | \
            ({"clip_frac"} if self.cfg.ppo_epochs == 1 else set()) | \
            ({"real_calls"} if self.variant != "real_env" else set())

    def on_train_end(self) -> None:
        self.refresh()
        weights = self.replica.parameters() if self.replica is not None else None
        self.rank_divergence = rank_divergence(self, weights)  # 0.0: every rank ends with the same weights

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["grpo"] = {"history": self.history, "real_calls": self.real_calls, "tokens_per_s": self.tokens_per_s,
                              "supervised_start": self.supervised_start}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["grpo"]
        self.history, self.real_calls, self.tokens_per_s = state["history"], state["real_calls"], state["tokens_per_s"]
        self.supervised_start = state["supervised_start"]

    # ---------------------------------------------------------------- data parallelism

    def _max(self, value: int) -> int:
        """The largest `value` over the data-parallel ranks."""
        if self.trainer.world_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor(value, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def _sum(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the data-parallel ranks (as they are with one process)."""
        if self.trainer.world_size > 1:
            import torch.distributed as dist

            values = values.to(self.device)
            dist.all_reduce(values)
        return values.cpu()

    def _sync_gradients(self) -> None:
        """Sum the ranks' gradients (each rank's loss is already normalised by the global counts),
        in one collective: a rank that played no episode contributes zeros, never skips it.
        (FSDP reduces its shards' gradients itself, in the backward.)"""
        if self.trainer.world_size > 1 and self.replica is None:
            import torch.distributed as dist

            params = [p for p in self.model.parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))

    # ---------------------------------------------------------------- the loss, chunk by chunk

    def _forward(self, rows, model):
        """(logits [N, V], targets [N], who [N], row [N]) for rows, `chunk_rows` at a time,
        shortest first (little padding); the same order on every call. Under FSDP every rank
        runs as many forward passes (its collectives must pair up): a rank with fewer chunks
        adds empty ones (a row without targets)."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        chunks = [order[lo : lo + self.cfg.chunk_rows] for lo in range(0, len(rows), self.cfg.chunk_rows)]
        if self.replica is not None and model is self.model:
            chunks += [[]] * (int(self._max(len(chunks))) - len(chunks))
        for chunk in chunks:
            b = collate([rows[i] for i in chunk] or [([self.policy.pad_id] * 2, [0, 0])], self.policy.pad_id)
            logits, targets, who, row = role_targets(model, b["input_ids"].to(self.device),
                                                     b["attention_mask"].to(self.device), b["roles"].to(self.device))
            yield logits, targets, who, torch.tensor(chunk, dtype=torch.long, device=row.device)[row]

    def _logprobs(self, rows, model) -> torch.Tensor:
        """Log-probs of every target token of `rows`, in `_forward`'s order. → [S] (empty: no rows)"""
        with torch.no_grad():
            parts = [-F.cross_entropy(lg, t, reduction="none") for lg, t, _, _ in self._forward(rows, model)]
        return torch.cat(parts) if parts else torch.zeros(0, device=self.device)

    def _backward(self, rows, episode_of, counts, advantages, norms, old, ref) -> dict:
        """Backward of the whole loss, one chunk at a time (gradients accumulate); returns its
        parts, summed. Each role's term is weighted by `token_weights` over the episodes it wrote
        in (on every rank: `norms`), the leak term is the mean over every rank's ACT tokens."""
        episode_of = torch.tensor(episode_of, device=self.device)
        n_wrote = {ACT_ID: float(norms[0]), REHEARSE_ID: float(norms[1])}
        totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0}
        done = 0  # tokens of the chunks before: where this chunk's old / ref log-probs start
        for logits, targets, who, row in self._forward(rows, self.model):
            logp = -F.cross_entropy(logits, targets, reduction="none")  # [S]
            span = slice(done, done + len(logp))
            done += len(logp)
            episode = episode_of[row]  # [S]
            loss = logp.sum() * 0.0
            for rid, weight in ((ACT_ID, 1.0), (REHEARSE_ID, self.cfg.lambda_env)):
                mine = who == rid
                if not mine.any():
                    continue
                part = grpo_role_loss(
                    logp[mine], (logp.detach() if old is None else old[span].to(logp.device))[mine],
                    advantages[rid].to(logp.device)[episode[mine]],
                    token_weights(counts[rid].to(logp.device), episode[mine], n_wrote[rid]), self.cfg.clip_eps,
                    None if ref is None else ref[span].to(logp.device)[mine], self.cfg.kl_coef)
                loss = loss + weight * part["loss"]
                totals["kl"] += float(part["kl"])
                totals["clipped"] += float(part["clipped"])
            act = who == ACT_ID
            if self.cfg.leak_coef and act.any() and self.leak_ids.numel():
                loss = loss + self.cfg.leak_coef * leak_mass(logits[act], self.leak_ids).sum() / norms[2].item()
            self.manual_backward(loss * (self.trainer.world_size if self.replica is not None else 1))  # FSDP averages
            totals["loss"] += float(loss.detach())
            totals["tokens"] += float(len(logp))
        return totals

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        return torch.optim.AdamW(params, lr=self.cfg.lr, betas=(0.9, 0.98))


def role_token_counts(rows, episode_of: list[int], n_episodes: int) -> dict[int, torch.Tensor]:
    """Per role: how many target tokens each episode has (rows as `generation_rows` makes them;
    a row's first token is never a target). → {role id: [E]}"""
    counts = {rid: torch.zeros(n_episodes) for rid in (ACT_ID, REHEARSE_ID)}
    for (_, roles), e in zip(rows, episode_of):
        for rid in counts:
            counts[rid][e] += sum(r == rid for r in roles[1:])
    return counts
