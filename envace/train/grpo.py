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
"""

from __future__ import annotations

import copy
import random
import time

import lightning as L
import torch
import torch.nn.functional as F

from envace import judge
from envace.config import RolesConfig, RolloutConfig, TrainConfig
from envace.domains.base import Task
from envace.roles import ACT, REHEARSE, ROLE_IDS
from envace.rollout.runner import SIMULATOR, Episode, EpisodeRunner, ModelResponder, Policy, RealResponder
from envace.train.data import collate
from envace.train.losses import ACT_ID, REHEARSE_ID, grpo_role_loss, leak_mass, role_advantages, role_targets

VARIANTS = ("sft", "real_env", "simulator", "envace")
ROWS_PER_FORWARD = 64  # generations per forward pass (bounds memory, not the result)


def responder_for(variant: str, policy: Policy, rollout: RolloutConfig, roles: RolesConfig, cfg: TrainConfig,
                  simulator: Policy | None = None, seed: int = 0):
    if variant == "envace":
        return ModelResponder(policy, rollout, "rehearsed", cfg.temperature, privileged=True,
                              privileged_dropout=roles.privileged_dropout, seed=seed)
    if variant == "real_env":
        return RealResponder()
    if variant == "simulator":
        if simulator is None:
            raise ValueError("variant 'simulator' needs a frozen simulator model")
        return ModelResponder(simulator, rollout, SIMULATOR, cfg.temperature, privileged=True,
                              privileged_dropout=roles.privileged_dropout, seed=seed)
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


def leak_token_ids(tokenizer, response_texts, act_texts) -> torch.Tensor:
    """Tokens that real tool responses use and ACT never writes: ACT emitting one of them is
    the environment's voice leaking into the agent's."""
    seen = lambda texts: {t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)}  # noqa: E731
    return torch.tensor(sorted(seen(response_texts) - seen(act_texts) - set(tokenizer.all_special_ids)), dtype=torch.long)


def leak_ids_of(tokenizer, episodes: list[dict]) -> torch.Tensor:
    """`leak_token_ids` of recorded episodes, responses spelled as the model reads them."""
    from envace.data.tokenizer import model_json
    from envace.roles import act_text

    messages = [m for e in episodes for m in e["messages"]]
    return leak_token_ids(tokenizer, [model_json(m["response"]) for m in messages if m["role"] == "tool"],
                          [act_text(m) for m in messages if m["role"] == "act"])


def leaked(generation_ids: list[int], leak_ids: set[int]) -> bool:
    return any(t in leak_ids for t in generation_ids)


class GRPOModule(L.LightningModule):
    def __init__(self, policy: Policy, tasks: list[Task], variant: str, cfg: TrainConfig, rollout: RolloutConfig,
                 roles: RolesConfig, leak_ids: torch.Tensor, simulator: Policy | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.policy, self.model = policy, policy.model
        self.tasks, self.variant, self.cfg = tasks, variant, cfg
        self.register_buffer("leak_ids", leak_ids, persistent=False)
        self.leak_set = set(leak_ids.tolist())
        self.reference = copy.deepcopy(policy.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
        self.responder = responder_for(variant, policy, rollout, roles, cfg, simulator, cfg.seed)
        self.runner = EpisodeRunner(policy, self.responder, rollout, temperature=cfg.temperature, seed=cfg.seed)
        self.real_calls = 0
        self.history: list[dict] = []

    def sample_tasks(self, step: int) -> tuple[list[Task], torch.Tensor]:
        rng = random.Random(f"{self.cfg.seed}-{step}")
        chosen = rng.sample(self.tasks, min(self.cfg.tasks_per_step, len(self.tasks)))
        group = [t for t in chosen for _ in range(self.cfg.group_size)]
        return group, torch.arange(len(chosen)).repeat_interleave(self.cfg.group_size)

    def training_step(self, batch, batch_idx):
        start, step = time.perf_counter(), len(self.history)  # global_step counts optimizer steps (ppo_epochs each)
        tasks, task_of = self.sample_tasks(step)
        self.runner.reseed(self.cfg.seed * 1_000_003 + step)  # a resumed run samples what this one would
        self.model.eval()
        with torch.no_grad():
            episodes = self.runner.run(tasks)
        gen_s = time.perf_counter() - start
        rewards = rewards_of(episodes, self.cfg.process_reward)
        rows, episode_of = generation_rows(episodes)
        has = {rid: torch.zeros(len(episodes), dtype=torch.bool) for rid in (ACT_ID, REHEARSE_ID)}
        for (_, roles), e in zip(rows, episode_of):
            has[max(roles)][e] = True
        advantages = {rid: role_advantages(rewards, task_of, has[rid], self.cfg.normalize_std) for rid in has}
        # one update per rollout batch: the old policy is the current one (ratio 1), no extra pass
        old = self._logprobs(rows, self.model) if self.cfg.ppo_epochs > 1 else None
        ref = self._logprobs(rows, self.reference) if self.reference is not None else None
        self.model.train()
        opt = self.optimizers()
        for _ in range(self.cfg.ppo_epochs):
            parts = self._loss(rows, episode_of, len(episodes), advantages, old, ref)
            opt.zero_grad()
            self.manual_backward(parts["loss"])
            self.clip_gradients(opt, gradient_clip_val=self.cfg.grad_clip, gradient_clip_algorithm="norm")
            opt.step()
        self.real_calls += sum(e.real_calls for e in episodes)
        act_gens = [g for e in episodes for g in e.generations if g.role == ACT]
        generated = sum(sum(e.tokens.values()) for e in episodes)
        metrics = {
            "reward": float(rewards.mean()), "success": sum(e.success for e in episodes) / len(episodes),
            "adv_act_abs": float(advantages[ACT_ID].abs().mean()), "adv_rehearse_abs": float(advantages[REHEARSE_ID].abs().mean()),
            "kl": float(parts["kl"]), "clip_frac": float(parts["clip_frac"]), "loss": float(parts["loss"].detach()),
            "leak_rate": sum(leaked(g.output_ids, self.leak_set) for g in act_gens) / max(1, len(act_gens)),
            "real_calls": float(self.real_calls), "tokens_per_s": generated / gen_s,
        }
        self.history.append({"step": step, **{k: round(v, 4) for k, v in metrics.items()}})
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, prog_bar=False, batch_size=len(episodes))
        self.log("reward", metrics["reward"], prog_bar=True, batch_size=len(episodes))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["grpo"] = {"history": self.history, "real_calls": self.real_calls}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.history, self.real_calls = checkpoint["grpo"]["history"], checkpoint["grpo"]["real_calls"]

    def _forward(self, rows, model):
        """(logits [N, V], targets [N], who [N], row [N]) for rows, ROWS_PER_FORWARD at a time,
        shortest first (little padding); the same order on every call."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        for lo in range(0, len(rows), ROWS_PER_FORWARD):
            chunk = order[lo : lo + ROWS_PER_FORWARD]
            b = collate([rows[i] for i in chunk], self.policy.pad_id)
            logits, targets, who, row = role_targets(model, b["input_ids"].to(self.device),
                                                     b["attention_mask"].to(self.device), b["roles"].to(self.device))
            yield logits, targets, who, torch.tensor(chunk, device=row.device)[row]

    def _logprobs(self, rows, model) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([-F.cross_entropy(lg, t, reduction="none") for lg, t, _, _ in self._forward(rows, model)])

    def _loss(self, rows, episode_of, n_episodes, advantages, old, ref) -> dict:
        logits, targets, who, row = zip(*self._forward(rows, self.model))
        logits, targets, who, row = torch.cat(logits), torch.cat(targets), torch.cat(who), torch.cat(row)
        logp = -F.cross_entropy(logits, targets, reduction="none")  # [S]
        episode = torch.tensor(episode_of, device=logp.device)[row]  # [S]
        total, kl, clip_frac = logp.sum() * 0.0, logp.new_zeros(()), logp.new_zeros(())
        for rid, weight in ((ACT_ID, 1.0), (REHEARSE_ID, self.cfg.lambda_env)):
            mine = who == rid
            if not mine.any():
                continue
            part = grpo_role_loss(logp[mine], logp[mine].detach() if old is None else old[mine], advantages[rid].to(logp.device), episode[mine], n_episodes, self.cfg.clip_eps,
                                  None if ref is None else ref[mine], self.cfg.kl_coef)
            total = total + weight * part["loss"]
            kl, clip_frac = kl + part["kl"], torch.maximum(clip_frac, part["clip_frac"])
        act = who == ACT_ID
        if self.cfg.leak_coef and act.any() and self.leak_ids.numel():
            total = total + self.cfg.leak_coef * leak_mass(logits[act], self.leak_ids).mean()
        return {"loss": total, "kl": kl, "clip_frac": clip_frac}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, betas=(0.9, 0.98))
