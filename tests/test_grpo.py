"""Role-wise GRPO: the losses (advantages per role, each episode once, PPO-clip, KL, leak)
and one training step per variant on a tiny model."""

import doctest

import lightning as L
import pytest
import torch

from envace.config import ModelConfig, RolesConfig, RolloutConfig, TrainConfig
from envace.train import losses
from envace.train.losses import clipped_surrogate, grpo_role_loss, kl_to_reference, leak_mass, role_advantages, token_weights


def test_losses_doctests():
    assert doctest.testmod(losses).failed == 0


def test_role_baseline_is_per_task_and_per_role():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    task_of = torch.tensor([0, 0, 0, 1, 1, 1])
    everyone = torch.ones(6, dtype=torch.bool)
    adv = role_advantages(rewards, task_of, everyone, normalize_std=False)
    assert torch.allclose(adv, torch.tensor([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3]))
    # an episode in which the role wrote nothing neither gets an advantage nor shifts the baseline
    some = torch.tensor([True, True, False, True, True, True])
    adv = role_advantages(rewards, task_of, some, normalize_std=False)
    assert adv[2] == 0 and torch.allclose(adv[:2], torch.tensor([0.5, -0.5]))
    # std normalisation: unit scale within a group; a group with equal rewards gives 0, not NaN
    adv = role_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]), atol=1e-4)


def test_each_episode_counts_once_per_role_however_many_tokens_it_has():
    # episode 0: 1 token with advantage +1; episode 1: 9 tokens with advantage -1
    episode_of = torch.tensor([0] + [1] * 9)
    logp = torch.zeros(10, requires_grad=True)
    weight = token_weights(torch.tensor([1.0, 9.0]), episode_of, 2)
    out = grpo_role_loss(logp, logp.detach(), torch.tensor([1.0, -1.0])[episode_of], weight, clip_eps=0.2)
    assert out["loss"].item() == pytest.approx(0.0, abs=1e-6)  # (−1 + 1) / 2: the long episode does not dominate
    out["loss"].backward()
    assert logp.grad[0].item() == pytest.approx(-0.5) and logp.grad[1:].sum().item() == pytest.approx(0.5)


def test_ppo_clip_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(2)
    logp = torch.log(torch.tensor([1.5, 1.1])).requires_grad_(True)  # ratios 1.5 (clipped) and 1.1
    clipped_surrogate(logp, old, torch.tensor([1.0, 1.0]), 0.2).sum().backward()
    assert logp.grad[0] == 0 and logp.grad[1] > 0


def test_role_loss_stays_on_the_device_of_its_inputs():
    # "meta" stands in for a GPU: any tensor made on the CPU inside the loss fails to mix with it
    meta = lambda *values: torch.tensor(values).to("meta")  # noqa: E731
    logp = meta(-1.0, -2.0, -0.5)
    out = grpo_role_loss(logp, logp, meta(1.0, -1.0, -1.0), meta(0.5, 0.25, 0.25), 0.2, ref_logp=logp, kl_coef=0.1)
    assert {v.device.type for v in out.values()} == {"meta"}


def test_kl_is_zero_at_the_reference_and_positive_elsewhere():
    ref = torch.log(torch.tensor([0.5, 0.2]))
    assert torch.allclose(kl_to_reference(ref, ref), torch.zeros(2))
    assert (kl_to_reference(ref + 0.3, ref) > 0).all()


def test_leak_mass_is_the_probability_on_response_only_tokens():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    assert leak_mass(logits, torch.tensor([1, 2])).item() == pytest.approx(0.3)


@pytest.fixture(scope="module")
def tokenizer(prepared_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")


def _module(tokenizer, variant, max_new_tokens=12, **overrides):
    from envace.domains import get_domain
    from envace.data.demonstrations import generate_tasks
    from envace.model import build_default
    from envace.roles import leak_words
    from envace.rollout.runner import Policy
    from envace.train.grpo import GRPOModule

    model = build_default(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer)
    policy = Policy(model, tokenizer)
    cfg = TrainConfig(**{"tasks_per_step": 2, "group_size": 2, **overrides})
    rollout = RolloutConfig(max_turns=2, max_calls_per_turn=2, max_new_tokens=max_new_tokens, batch_size=8)
    leak = leak_words(['{"balance":120}'], ['[{"name":"get_balance","arguments":{"account_id":"A12"}}]'])
    simulator = Policy(build_default(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                                 seed=1), tokenizer), tokenizer)
    tasks = generate_tasks(get_domain("bank"), 6, seed=0)
    return GRPOModule(policy, tasks, variant, cfg, rollout, RolesConfig(), leak, simulator=simulator)


def _train(module, steps=2):
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(range(steps), batch_size=1))
    return trainer


@pytest.mark.parametrize("variant, real", [("envace", False), ("simulator", False), ("real_env", True)])
def test_a_training_step_per_variant_moves_the_weights_by_its_rewards(tokenizer, variant, real, monkeypatch):
    """Two runs from the same weights and seed, the persona-leak loss off, differing only in the
    rewards: equal rewards give zero advantages, rewards that differ within each group give a
    policy gradient — so the two runs end with different weights (weight decay alone would move
    both alike). ACT's first turn is scripted to call a tool (an untrained model never does), so
    the real-environment variant must call the backends; the others never do."""
    import envace.train.grpo as grpo

    def trained(rewards: list[float]):
        monkeypatch.setattr(grpo, "rewards_of", lambda episodes, weight: torch.tensor(rewards[: len(episodes)]))
        # no memory groups: a group of 2 keeps 1 learned episode there, with no advantage
        module = _module(tokenizer, variant, max_new_tokens=24, kl_coef=0.1, leak_coef=0.0, memory_rate=0.0)
        _call_first(module.policy)
        _train(module, steps=1)
        return module

    flat, varied = trained([0.0] * 4), trained([0.0, 1.0, 1.0, 0.0])  # each task's 2 episodes differ, either order
    assert set(varied.history[0]) >= {"reward", "success", "adv_act_abs", "adv_rehearse_abs", "kl", "leak_rate",
                                      "real_calls"}
    assert "tokens_per_s" not in varied.history[0] and len(varied.tokens_per_s) == 1  # a timing, kept apart
    assert flat.history[0]["adv_act_abs"] == 0 and varied.history[0]["adv_act_abs"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(flat.model.parameters(), varied.model.parameters()))
    if real:
        assert varied.real_calls > 0 and varied.history[0]["real_calls"] > 0
    else:
        assert varied.real_calls == 0  # the RL loop never touches the environment


def test_private_rehearsals_are_not_learned_from(tokenizer, monkeypatch):
    """In a memory group only the episodes that read the memory are learned from: rewards
    that differ between the private rehearsals and the readers give no advantage."""
    import envace.train.grpo as grpo

    monkeypatch.setattr(grpo, "rewards_of", lambda episodes, weight: torch.tensor([float(e.memory is None)
                                                                                   for e in episodes]))
    module = _module(tokenizer, "envace", max_new_tokens=24, memory_rate=1.0, group_size=4)
    _call_first(module.policy)
    _train(module, steps=1)
    assert module.history[0]["adv_act_abs"] == 0 and module.history[0]["adv_rehearse_abs"] == 0
    assert module.history[0]["reward"] == 0  # the telemetry is the learned episodes'
    assert module.tokens_per_s[0] > 0


def _call_first(policy) -> None:
    """Generations that open with a tool call and answer once a response is in the prompt."""
    call = '[{"name":"find_account","arguments":{"owner":"Alice"}}]<|end|>'
    answer = '{"answer":"done"}<|end|>'

    def generate(prompts, max_new_tokens, temperature, top_p, streams=None):
        texts = [answer if "<|tool|>" in policy.decode(p) else call for p in prompts]
        return [policy.tokenizer.encode(t, add_special_tokens=False)[:max_new_tokens] for t in texts]

    policy.generate = generate


def test_envace_rehearsals_are_trained_and_simulator_outputs_are_not(tokenizer):
    from envace.roles import REHEARSE
    from envace.rollout.runner import SIMULATOR, Episode, Generation
    from envace.train.grpo import generation_rows

    e = Episode(task=None, messages=[], generations=[Generation(REHEARSE, [1, 2], [3]), Generation(SIMULATOR, [1], [4])])
    rows, episode_of = generation_rows([e])
    assert rows == [([1, 2, 3], [0, 0, 2])] and episode_of == [0]


def test_a_roles_turns_in_one_episode_share_one_row():
    from envace.roles import ACT, REHEARSE
    from envace.rollout.runner import Episode, Generation
    from envace.train.grpo import generation_rows

    act1, act2 = Generation(ACT, [1, 2], [3]), Generation(ACT, [1, 2, 3, 7], [8])  # act2's prompt extends act1
    other = Generation(REHEARSE, [5, 6], [9])  # a different history: a row of its own
    e = Episode(task=None, messages=[], generations=[act1, Generation(REHEARSE, [1, 9], [4]), act2, other])
    rows, episode_of = generation_rows([e])
    assert rows == [([1, 2, 3, 7, 8], [0, 0, 1, 0, 1]), ([1, 9, 4], [0, 0, 2]), ([5, 6, 9], [0, 0, 2])]
    assert episode_of == [0, 0, 0]


def test_shared_rows_give_every_generated_token_the_log_prob_it_has_alone(tokenizer):
    """Packing turns into one row is exact: causal attention sees the same prefix."""
    from envace.roles import ACT, REHEARSE
    from envace.rollout.runner import Episode, Generation
    from envace.train.grpo import generation_rows

    module = _module(tokenizer, "envace")
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(5, len(tokenizer), (n,), generator=g).tolist()  # noqa: E731
    episodes = []
    for _ in range(3):
        history, gens = ids(6), []
        for turn in range(3):
            for role in (ACT, REHEARSE):
                out = ids(2 + turn)
                prompt = history if role == ACT else history[:2] + [7] * turn
                gens.append(Generation(role, list(prompt), out))
                if role == ACT:
                    history = history + out + ids(3)
        episodes.append(Episode(task=None, messages=[], generations=gens))
    alone = [(x.prompt_ids + x.output_ids, [0] * len(x.prompt_ids) + [1 + (x.role == REHEARSE)] * len(x.output_ids))
             for e in episodes for x in e.generations]
    packed, _ = generation_rows(episodes)
    assert len(packed) < len(alone)
    per_role = lambda rows: [sorted(lp[who == r].tolist()) for r in (1, 2)  # noqa: E731
                             for lp, who in [(module._logprobs(rows, module.model),
                                              torch.cat([w for _, _, w, _ in module._forward(rows, module.model)]))]]
    for a, b in zip(per_role(packed), per_role(alone)):
        assert a == pytest.approx(b, abs=1e-4)


def test_unknown_variant_is_named(tokenizer):
    with pytest.raises(ValueError, match="unknown variant 'sim'"):
        _module(tokenizer, "sim")


def test_the_chunked_backward_gives_the_gradient_of_the_whole_loss(tokenizer):
    """Peak memory is one chunk's: the loss is a weighted sum over tokens, so backward chunk
    by chunk accumulates exactly the gradient of the loss over every row at once."""
    import lightning as L

    from envace.train.grpo import generation_rows, role_token_counts
    from envace.train.losses import ACT_ID, REHEARSE_ID, role_advantages

    module = _module(tokenizer, "envace", kl_coef=0.1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=0)
    trainer.strategy.connect(module)
    module.trainer = trainer
    module.manual_backward = lambda loss: loss.backward()  # outside fit: a plain backward
    tasks, task_of, streams = module.sample_tasks(0)
    with torch.no_grad():
        episodes = module.runner.run(tasks, streams)
    rows, episode_of = generation_rows(episodes)
    counts = role_token_counts(rows, episode_of, len(episodes))
    rewards = torch.tensor([float(i % 2) for i in range(len(episodes))])  # advantages that are not all 0
    adv = {rid: role_advantages(rewards, task_of, counts[rid] > 0) for rid in counts}
    norms = torch.tensor([float((counts[ACT_ID] > 0).sum()), float((counts[REHEARSE_ID] > 0).sum()),
                          float(counts[ACT_ID].sum())])
    ref = module._logprobs(rows, module.reference)
    grads = []
    for chunk in (1, 3, len(rows)):
        module.cfg = module.cfg.model_copy(update={"chunk_rows": chunk})
        module.model.zero_grad()
        module._backward(rows, episode_of, counts, adv, norms, None, ref)
        grads.append(torch.cat([p.grad.flatten() for p in module.model.parameters()]))
    assert len(rows) > 3 and grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[2], atol=1e-6, rtol=1e-5)


def test_memory_groups_rehearse_privately_then_read_their_memory(tokenizer):
    from envace.rehearsal.memory import condense

    module = _module(tokenizer, "envace", memory_rate=1.0, group_size=4)
    tasks, _, streams = module.sample_tasks(0)
    episodes, learned = module.play(tasks, streams)
    assert [e.task.id for e in episodes] == [t.id for t in tasks]  # in the step's order
    assert learned == [i % 4 >= 2 for i in range(len(tasks))]  # a private rehearsal only makes the memory
    for g in range(0, len(tasks), 4):
        scouts, readers = episodes[g:g + 2], episodes[g + 2:g + 4]
        assert all(e.memory is None for e in scouts) and all(r.memory == condense(scouts, 2) for r in readers)
        prompts = [tokenizer.decode(x.prompt_ids) for e in scouts for x in e.generations if x.role == "rehearse"]
        assert not any("<|facts|>" in p for p in prompts)  # the scouts rehearse as at test time: no facts
    drawn = [g for g in range(0, len(tasks), 4) if episodes[g + 2].memory is not None]
    off = _module(tokenizer, "envace", memory_rate=0.0, group_size=4)
    assert off.scouts is None and len(drawn) == len(tasks) // 4
    assert off.play(tasks, streams)[1] == [True] * len(tasks)
