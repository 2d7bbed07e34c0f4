"""Generation, the episode runner with its three responders, caps and fuzzed outputs."""

import inspect
import random

import pytest
import torch

from envace.config import ModelConfig, RolloutConfig
from envace.data.demonstrations import generate_tasks
from envace.domains import get_domain
from envace.roles import ACT, REHEARSE
from envace.rollout.generate import cache_kwarg, generate, left_padded
from envace.rollout.runner import EpisodeRunner, ModelResponder, Policy, RealResponder


@pytest.fixture(scope="module")
def tokenizer(prepared_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    from envace.model import build_default

    return build_default(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer).eval()


def test_batched_generation_matches_hf_generate_greedy(tiny_model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
    # pick a stop token that one row really produces, so rows finish at different steps
    first = generate(tiny_model, prompts, 6, stop_id=-1, pad_id=0)
    stop = first[1][2]
    outs = generate(tiny_model, prompts, 6, stop_id=stop, pad_id=0)
    for p, o in zip(prompts, outs):
        ref = tiny_model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=stop,
                                  pad_token_id=0)[0, len(p):].tolist()
        assert o == ref[: len(o)] and (o[-1] == stop or len(o) == 6)
    assert any(o[-1] == stop and len(o) < 6 for o in outs)


def test_cache_keyword_follows_the_models_forward(tiny_model):
    # transformers renamed past_key_values to cache; a model given the other name silently
    # decodes without context, so the keyword is read off the model's own forward
    class OlderModel(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, past_key_values=None, **kwargs): ...

    assert cache_kwarg(OlderModel()) == "past_key_values"
    assert cache_kwarg(tiny_model) in inspect.signature(tiny_model.forward).parameters


def test_sampling_is_seeded_per_row_whatever_shares_the_batch(tiny_model):
    from envace.rollout.generate import mix64

    g = lambda prompts, keys: generate(tiny_model, prompts, 5, -1, 0, 1.0, 0.9, [mix64(k) for k in keys])  # noqa: E731
    assert g([[5, 6, 7]] * 4, [1, 2, 3, 4]) == g([[5, 6, 7]] * 4, [1, 2, 3, 4])
    assert g([[5, 6, 7]], [1]) != g([[5, 6, 7]], [2])
    # a row samples what its own stream says, alone or beside other rows (data-parallel ranks
    # that split a batch sample exactly what one process would)
    together = g([[5, 6, 7], [9, 10], [11, 12, 13, 14]], [7, 8, 9])
    assert together == [g([[5, 6, 7]], [7])[0], g([[9, 10]], [8])[0], g([[11, 12, 13, 14]], [9])[0]]
    with pytest.raises(ValueError, match="stream key per prompt"):
        generate(tiny_model, [[5, 6]], 3, -1, 0, 1.0)


def _gqa_model():
    """A Llama with grouped-query attention and llama3 rope scaling, as SmolLM2-like checkpoints have."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("which", ["embedded", "gqa"])
def test_lean_decoder_logits_equal_the_models_forward(tiny_model, which):
    from envace.rollout.lean import LeanDecoder

    model = tiny_model if which == "embedded" else _gqa_model()
    prompts, new = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]], [[20, 21, 22], [23, 24, 25], [26, 27, 28]]
    ids, mask, positions = left_padded(prompts, 0)
    P = ids.shape[1]
    decoder = LeanDecoder(model, 3, P + 3)
    with torch.no_grad():
        got = [decoder.prefill(ids, mask, positions)]
        for t in range(3):
            got.append(decoder.step(torch.tensor([row[t] for row in new]), positions[:, -1] + 1 + t))
        full = torch.cat([ids, torch.tensor(new)], 1)
        full_mask = torch.cat([mask, torch.ones(3, 3, dtype=mask.dtype)], 1)
        want = model(input_ids=full, attention_mask=full_mask, position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
    for t, logits in enumerate(got):
        torch.testing.assert_close(logits, want[:, P - 1 + t], atol=1e-5, rtol=1e-5)
    # the pad columns' keys and values are finite: a NaN there would poison every row's
    # attention (a zero weight times NaN is NaN)
    assert decoder.keys.isfinite().all() and decoder.values.isfinite().all()


def _right_padded_batch(vocab: int):
    """Three right-padded rows: targets of both roles, one row without any, pads at the end."""
    torch.manual_seed(3)
    ids = torch.randint(4, vocab, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[2, 4:] = 0, 0
    roles = torch.zeros_like(ids)
    roles[0, 3:6], roles[0, 8:11], roles[1, 5:7] = 1, 2, 2
    return ids * mask, mask, roles


@pytest.mark.parametrize("which", ["embedded", "gqa"])
def test_lean_training_forward_gives_the_models_logits_and_gradients(tiny_model, which, monkeypatch):
    # warmup and GRPO read logits only where a target is predicted from; the lean forward skips
    # the last layer's work elsewhere, and must train exactly what the model's own forward does
    import copy

    from envace.rollout import lean
    from envace.train.losses import role_targets

    model = copy.deepcopy(tiny_model) if which == "embedded" else _gqa_model()
    model.train()
    ids, mask, roles = _right_padded_batch(model.config.vocab_size)
    calls, target_states = [], lean.target_states
    monkeypatch.setattr(lean, "target_states", lambda *a: calls.append(1) or target_states(*a))
    got, targets, who, row = role_targets(model, ids, mask, roles)
    assert calls, "a right-padded batch of a plain Llama takes the lean forward"
    selected = roles[:, 1:] > 0
    want = model(input_ids=ids, attention_mask=mask).logits[:, :-1][selected]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(targets, ids[:, 1:][selected]) and row.tolist() == [0] * 6 + [1] * 2
    assert who.tolist() == [1, 1, 1, 2, 2, 2, 2, 2]
    grads = []
    for logits in (got, want):
        model.zero_grad()
        torch.nn.functional.cross_entropy(logits, targets).backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for lean_grad, own_grad in zip(*grads):
        torch.testing.assert_close(lean_grad, own_grad, atol=1e-5, rtol=1e-4)
    # no target at all (a data-parallel rank left without one): empty logits, a backward all the same
    none, _, _, _ = role_targets(model, ids, mask, torch.zeros_like(roles))
    assert none.shape == (0, model.config.vocab_size)
    none.sum().backward()
    # rows not right-padded take the model's own forward, which reads the mask
    calls.clear()
    left = torch.flip(mask, [1])
    role_targets(model, ids, left, torch.flip(roles, [1]))
    assert not calls


@pytest.mark.parametrize("which", ["embedded", "gqa"])
def test_lean_rms_norm_is_the_models_bit_for_bit(tiny_model, which):
    # bit for bit, not within a tolerance: the lean decoder must not change what a
    # seeded pipeline samples, so its norm is the model's arithmetic exactly
    import copy

    from envace.rollout.lean import LeanDecoder

    model = copy.deepcopy(tiny_model) if which == "embedded" else _gqa_model()  # its norms' weights get drawn
    decoder = LeanDecoder(model, 1, 4)
    x = torch.randn(5, 7, model.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 3
    for norm in (model.model.layers[0].input_layernorm, model.model.layers[1].post_attention_layernorm, model.model.norm):
        with torch.no_grad():
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=torch.Generator().manual_seed(2)))
            assert torch.equal(decoder._rms(x, norm.weight), norm(x))
            assert torch.equal(decoder._rms(x[:, -1], norm.weight), norm(x[:, -1]))


def test_greedy_picks_the_first_of_tied_maxima_as_argmax_does():
    from envace.rollout.generate import sample_next

    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]])
    assert sample_next(logits, 0.0, 1.0).tolist() == logits.argmax(-1).tolist() == [1, 0, 0]
    ties = torch.randint(0, 4, (130, 3293), generator=torch.Generator().manual_seed(0)).float()
    assert torch.equal(sample_next(ties, 0.0, 1.0), ties.argmax(-1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_generation_gives_the_same_tokens_as_the_models_forward(tiny_model, temperature):
    from envace.rollout.generate import mix64

    rng = random.Random(3)
    prompts = [[rng.randrange(20, 200) for _ in range(rng.randint(2, 30))] for _ in range(24)]
    streams = [mix64(7, i) for i in range(24)]
    run = lambda stop, lean: generate(tiny_model, prompts, 12, stop, 0, temperature, 0.9, streams, lean=lean)  # noqa: E731
    reference = run(-1, False)
    stop = reference[0][3]  # a token some rows really produce: they finish early and leave the batch
    assert run(-1, True) == reference
    finished = run(stop, False)
    assert run(stop, True) == finished and any(len(o) < 12 for o in finished)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_prefill_in_length_sorted_groups_keeps_each_prompts_logits_and_tokens(tiny_model, temperature):
    from envace.rollout.generate import mix64
    from envace.rollout.lean import PREFILL_ROWS, LeanDecoder

    rng = random.Random(4)
    n = 2 * PREFILL_ROWS + 6  # two full groups and a short one, lengths shuffled across them
    prompts = [[rng.randrange(20, 200) for _ in range(rng.randint(2, 40))] for _ in range(n)]
    ids, mask, positions = left_padded(prompts, 0)
    P = ids.shape[1]
    with torch.no_grad():
        got = LeanDecoder(tiny_model, n, P + 1).prefill(ids, mask, positions)
        want = tiny_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    streams = [mix64(9, i) for i in range(n)]
    run = lambda stop, lean: generate(tiny_model, prompts, 10, stop, 0, temperature, 0.9, streams, lean=lean)  # noqa: E731
    reference = run(-1, False)  # the model's forward: every row prefilled together, in the given order
    stop = reference[0][2]
    assert run(-1, True) == reference
    finished = run(stop, False)
    assert run(stop, True) == finished and any(len(o) < 10 for o in finished)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_prefill_of_shared_beginnings_keeps_each_prompts_logits_and_tokens(tiny_model, temperature):
    from envace.rollout.generate import mix64
    from envace.rollout.lean import PREFILL_ROWS, SHARED_LEAST, LeanDecoder, shared_prefixes

    rng = random.Random(8)
    words = lambda n: [rng.randrange(20, 200) for _ in range(n)]  # noqa: E731
    header = words(12)  # a tool list every prompt begins with; then tasks, each played by several rows
    tasks = [header + words(rng.randint(SHARED_LEAST, 20)) for _ in range(6)]
    prompts = [rng.choice(tasks) + words(rng.randint(0, 15)) for _ in range(PREFILL_ROWS + 9)]
    prompts += [words(rng.randint(2, 40)) for _ in range(5)] + [tasks[0][:SHARED_LEAST + 1]] * 2  # alone; twins
    rng.shuffle(prompts)
    groups = shared_prefixes(prompts)
    assert len(groups) > 1 and sum(len(rows) for rows, _ in groups) > len(prompts) // 2
    ids, mask, positions = left_padded(prompts, 0)
    with torch.no_grad():
        decoder = LeanDecoder(tiny_model, len(prompts), ids.shape[1] + 1)
        got = decoder.prefill(ids, mask, positions)
        want = tiny_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    torch.testing.assert_close(got, want.logits[:, -1], atol=1e-5, rtol=1e-5)
    real = mask.bool()[:, None, :, None]  # [B, 1, P, 1]: a pad column's key and value are never read
    for i, cached in enumerate(want.past_key_values.layers):  # every copied beginning in its own row's columns
        keys = decoder.keys[i, :, :, :, : ids.shape[1]].transpose(-1, -2)
        torch.testing.assert_close(keys * real, cached.keys * real, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(decoder.values[i, :, :, : ids.shape[1]] * real, cached.values * real, atol=1e-5, rtol=1e-5)
    streams = [mix64(10, i) for i in range(len(prompts))]
    run = lambda stop, lean: generate(tiny_model, prompts, 10, stop, 0, temperature, 0.9, streams, lean=lean)  # noqa: E731
    reference = run(-1, False)
    stop = reference[0][2]
    assert run(-1, True) == reference
    finished = run(stop, False)
    assert run(stop, True) == finished and any(len(o) < 10 for o in finished)


def test_rows_leaving_the_batch_change_no_other_rows_tokens(tiny_model):
    import doctest

    from envace.rollout import generate as generation
    from envace.rollout.generate import mix64

    assert doctest.testmod(generation).failed == 0  # survivors: live rows beyond fill the finished rows' places
    rng = random.Random(6)
    prompts = [[rng.randrange(20, 200) for _ in range(rng.randint(2, 30))] for _ in range(20)]
    streams = [mix64(11, i) for i in range(20)]
    run = lambda rows, stop: generate(tiny_model, [prompts[i] for i in rows], 10, stop, 0, 1.0, 0.9,  # noqa: E731
                                      [streams[i] for i in rows])
    stop = run([0], -1)[0][2]
    together = run(range(20), stop)
    assert together == [run([i], stop)[0] for i in range(20)]
    assert len({len(o) for o in together}) > 2  # rows finished at several steps, from several places


def test_policy_encodes_as_the_tokenizer_does_with_its_memo_kept_small(tokenizer, monkeypatch):
    from envace.roles import Segment, encode
    from envace.rollout import runner

    monkeypatch.setattr(runner, "MEMO_SEGMENTS", 3)
    policy = Policy(None, tokenizer)
    conversations = [[Segment("find the account of Bob"), Segment(f"turn {i} of {n}", ACT)] for n in range(4) for i in range(n)]
    for segments in conversations + conversations:
        assert policy.encode(segments) == encode(tokenizer, segments)[0]
        assert len(policy.memo) <= 3 + len(segments)


def test_rehearsals_batched_by_length_come_back_in_the_prompts_order(tokenizer, tiny_model):
    from envace.evaluate.rehearsal import rehearsed

    policy = Policy(tiny_model, tokenizer)
    rng = random.Random(5)
    prompts = [[rng.randrange(20, 200) for _ in range(rng.randint(2, 30))] for _ in range(13)]
    alone = [rehearsed(policy, [p], max_new_tokens=6)[0] for p in prompts]
    assert len({str(a) for a in alone}) > 1  # the rehearsals differ, so a shuffled order would show
    assert rehearsed(policy, prompts, max_new_tokens=6, batch_size=4) == alone


def test_lean_decoding_refuses_a_model_it_does_not_support(tiny_model):
    import copy

    from transformers import GPT2Config, GPT2LMHeadModel

    from envace.rollout.lean import supports

    assert supports(tiny_model) and supports(_gqa_model())
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    half = copy.deepcopy(tiny_model).to(torch.bfloat16)
    for model, name in ((gpt2, "GPT2LMHeadModel"), (half, "bfloat16")):
        assert not supports(model)
        with pytest.raises(ValueError, match=name):
            generate(model, [[5, 6]], 3, -1, 0, lean=True)
    # the default: lean wherever the model allows it, else the model's own forward
    from envace.rollout.generate import CachedForward, decoder_for
    from envace.rollout.lean import LeanDecoder

    assert isinstance(decoder_for(tiny_model, 2, 8), LeanDecoder)
    assert isinstance(decoder_for(tiny_model, 2, 8, lean=False), CachedForward)
    assert isinstance(decoder_for(gpt2, 2, 8), CachedForward) and isinstance(decoder_for(half, 2, 8), CachedForward)
    assert len(generate(gpt2, [[5, 6]], 3, -1, 0)[0]) == 3


def test_inverse_cdf_sampling_follows_the_distribution():
    from envace.rollout.generate import sample_next, uniforms

    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).expand(20000, 3)
    u = torch.from_numpy(uniforms(__import__("numpy").arange(20000, dtype="uint64") * 7919, 0))
    counts = torch.bincount(sample_next(logits, 1.0, 1.0, u), minlength=3) / 20000
    assert torch.allclose(counts, torch.tensor([0.6, 0.3, 0.1]), atol=0.015)
    top = torch.bincount(sample_next(logits, 1.0, 0.7, u), minlength=3) / 20000  # top-p keeps 0.6 and 0.3
    assert top[2] == 0 and torch.allclose(top[:2], torch.tensor([2 / 3, 1 / 3]), atol=0.015)


class ScriptedPolicy(Policy):
    """A policy whose generations come from a function of the prompt text (for fuzzing)."""

    def __init__(self, tokenizer, write):
        super().__init__(model=None, tokenizer=tokenizer)
        self.write = write

    def generate(self, prompts, max_new_tokens, temperature, top_p, streams=None):
        outs = []
        for p in prompts:
            text = self.write(self.decode(p))
            ids = self.tokenizer.encode(text, add_special_tokens=False)[:max_new_tokens]
            outs.append(ids)
        return outs


CFG = RolloutConfig(max_turns=4, max_calls_per_turn=2, max_new_tokens=40, batch_size=8)


def _tasks(name, n=8):
    return generate_tasks(get_domain(name), n, seed=0)


FUZZ = [
    ("random text", lambda rng: "".join(rng.choice("ab{}[]\":, xyz0") for _ in range(rng.randint(0, 30))) + "<|end|>"),
    ("truncated JSON", lambda rng: '[{"name":"find_account","arguments":{"owner":'),
    ("unknown tool", lambda rng: '[{"name":"rm_rf","arguments":{}}]<|end|>'),
    ("wrong argument type", lambda rng: '[{"name":"find_account","arguments":{"owner":12}}]<|end|>'),
    ("no stop token", lambda rng: '{"answer":"x"}'),
    ("too many calls", lambda rng: "[" + ",".join(['{"name":"find_account","arguments":{"owner":"Bob"}}'] * 3) + "]<|end|>"),
]


@pytest.mark.parametrize("kind, write", FUZZ, ids=[k for k, _ in FUZZ])
def test_fuzzed_act_generations_are_recorded_failed_steps(tokenizer, kind, write):
    rng = random.Random(0)
    policy = ScriptedPolicy(tokenizer, lambda prompt: write(rng))
    episodes = EpisodeRunner(policy, RealResponder(), CFG, temperature=1.0).run(_tasks("bank"))
    for e in episodes:
        assert e.done and not e.success
        assert e.failure.startswith("act:"), e.failure
        assert e.messages[-1]["role"] == "failed_step"


def test_fuzzed_rehearsals_are_recorded_failed_steps(tokenizer):
    def write(prompt):
        if prompt.endswith("<|rehearse|>"):
            return '{"account_id":"A1",<|end|>'  # broken JSON from REHEARSE
        return '[{"name":"find_account","arguments":{"owner":"Bob"}}]<|end|>'

    policy = ScriptedPolicy(tokenizer, write)
    responder = ModelResponder(policy, CFG, "rehearsed", 1.0)
    episodes = EpisodeRunner(policy, responder, CFG, temperature=1.0).run(_tasks("bank"))
    assert all(e.failure == "rehearsed:rehearse_not_json" for e in episodes)
    assert all(e.real_calls == 0 for e in episodes)


def test_rehearsed_episode_runs_without_touching_the_real_backend(tokenizer):
    def write(prompt):
        if prompt.endswith("<|rehearse|>"):
            return '{"account_id":"A42"}<|end|>'
        if "A42" in prompt:
            return '{"answer":"done"}<|end|>'
        return '[{"name":"find_account","arguments":{"owner":"Bob"}},{"name":"find_account","arguments":{"owner":"Al"}}]<|end|>'

    policy = ScriptedPolicy(tokenizer, write)
    episodes = EpisodeRunner(policy, ModelResponder(policy, CFG, "rehearsed", 1.0), CFG, temperature=1.0).run(_tasks("bank"))
    for e in episodes:
        assert e.failure is None and e.answer == "done" and e.real_calls == 0
        sources = [m["source"] for m in e.messages if m["role"] == "tool"]
        assert sources == ["rehearsed", "rehearsed"]
        roles = [g.role for g in e.generations]
        assert roles == [ACT, REHEARSE, REHEARSE, ACT]
        assert e.tokens[ACT] > 0 and e.tokens[REHEARSE] > 0
        for ids, act_mask, reh_mask in e.role_masks():
            assert len(ids) == len(act_mask) == len(reh_mask)
            assert not any(a and r for a, r in zip(act_mask, reh_mask))
        ids, act_mask, _ = e.role_masks()[0]
        assert policy.decode([i for i, m in zip(ids, act_mask) if m]).startswith('[{"name":"find_account"')


def test_turn_cap_is_enforced(tokenizer):
    policy = ScriptedPolicy(tokenizer, lambda p: '[{"name":"find_account","arguments":{"owner":"Bob"}}]<|end|>')
    episodes = EpisodeRunner(policy, RealResponder(), CFG, temperature=1.0).run(_tasks("bank", 3))
    for e in episodes:
        assert e.failure == "turn_limit"
        assert sum(m["role"] == "act" for m in e.messages) == CFG.max_turns
        assert e.real_calls == CFG.max_turns


def test_episodes_take_each_turn_together_in_full_batches(tokenizer):
    """Episodes that end early leave room in the turn's batches for later tasks' live episodes:
    each turn is ceil(live / batch_size) generations, and every episode plays as it would alone."""
    def write(prompt):  # an episode answers after 0-3 lookups, by its request's length
        request = prompt.split("<|user|>")[1].split("<|act|>")[0]
        if prompt.count("<|tool|>") >= len(request) % 4:
            return '{"answer":"done"}<|end|>'
        return '[{"name":"find_account","arguments":{"owner":"Bob"}}]<|end|>'

    policy = ScriptedPolicy(tokenizer, write)
    sizes = []
    policy.generate = lambda prompts, *a, generate=policy.generate, **k: sizes.append(len(prompts)) or generate(prompts, *a, **k)
    tasks = _tasks("bank", 20)
    together = EpisodeRunner(policy, RealResponder(), CFG, temperature=0.0).run(tasks)
    live_per_turn = [sum(sum(m["role"] == "act" for m in e.messages) > t for e in together) for t in range(CFG.max_turns)]
    assert len(set(live_per_turn)) > 2, live_per_turn  # episodes end at different turns
    assert sizes == [n for live in live_per_turn for n in [CFG.batch_size] * (live // CFG.batch_size) + [live % CFG.batch_size] if n]
    alone = [EpisodeRunner(policy, RealResponder(), CFG, temperature=0.0).run([t])[0] for t in tasks]
    assert [(e.messages, e.success) for e in together] == [(e.messages, e.success) for e in alone]


def test_real_responder_counts_calls_and_judges_with_state(tokenizer):
    task = next(t for t in _tasks("bank", 6) if t.task_type == "balance_inquiry")
    gt = task.checklist.ground_truth
    acc = gt[-1][0]["arguments"]["account_id"]
    balance = next(a["balance"] for a in task.scenario["accounts"] if a["account_id"] == acc)
    import json

    def write(prompt):
        turns = prompt.count("<|tool|>")
        if turns < len(gt):
            return json.dumps(gt[turns], separators=(",", ":")) + "<|end|>"
        return json.dumps({"answer": f"It is {balance}."}) + "<|end|>"

    (e,) = EpisodeRunner(ScriptedPolicy(tokenizer, write), RealResponder(), CFG, temperature=1.0).run([task])
    assert e.success and e.real_calls == sum(len(t) for t in gt) and e.final_state is not None


def test_policy_model_runs_real_episodes_end_to_end(tokenizer, tiny_model):
    """An untrained model produces garbage; the runner records it and never crashes."""
    policy = Policy(tiny_model, tokenizer)
    episodes = EpisodeRunner(policy, ModelResponder(policy, CFG, "rehearsed", 1.0), CFG, temperature=1.0).run(_tasks("trading", 6))
    assert all(e.done and e.failure for e in episodes)
