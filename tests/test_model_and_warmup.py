"""Models (embedded default, any local HF checkpoint) and the warmup loss masking."""

import os

import pytest
import torch
import torch.nn.functional as F

from envace.config import ModelConfig
from envace.roles import ROLE_IDS


@pytest.fixture(scope="module")
def tokenizer(prepared_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")


@pytest.fixture(scope="module")
def model(tokenizer):
    from envace.model import build_default

    return build_default(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer)


def test_embedded_default_follows_params_and_tokenizer(model, tokenizer):
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_embedding_std_sets_the_init_scale_of_the_tied_embeddings(tokenizer):
    from envace.model import build_default

    wide = build_default(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                     embedding_std=0.5), tokenizer)
    weight = wide.get_input_embeddings().weight
    assert weight.std().item() == pytest.approx(0.5, rel=0.1)
    assert wide.get_output_embeddings().weight.data_ptr() == weight.data_ptr()  # tied


def test_copy_rows_end_in_a_span_written_twice_and_mask_its_repeat_after_the_first_token():
    import random

    from envace.model.copying import LONG, SHORT, SPAN, copy_rows

    for phase in (SHORT, LONG):
        ids, mask = copy_rows(random.Random(0), 50, range(100, 200), phase.row, phase.apart)
        assert ids.shape == mask.shape == (50, phase.row) and ((ids >= 100) & (ids < 200)).all()
        back = []  # how far before the repeat its span was written, and the span's length
        for row, marked in zip(ids.tolist(), mask.tolist()):
            length = marked.count(True) + 1  # the repeat's first token is not marked
            assert SPAN[0] <= length <= SPAN[1] and marked[-length:] == [False] + [True] * (length - 1)
            start = next(j for j in range(phase.row - 2 * length, -1, -1) if row[j:j + length] == row[-length:])
            back.append((phase.row - length - start, length))
        if phase.apart:  # anywhere before, often hundreds of tokens
            assert max(distance for distance, _ in back) > 200
        else:  # right before
            assert all(distance == length for distance, length in back)


@pytest.mark.slow
def test_copy_pretraining_learns_from_the_rows_and_repeats_for_a_seed(tokenizer):
    """Learning, measured: after 300 steps on 8 tokens a tiny model predicts the short rows'
    repeats above chance (1/8; the in-order circuit itself takes thousands of steps on the
    embedded default: `bench/induction.py`), then trains on long rows. Same seed, same weights."""
    import re

    from envace.model import build_default
    from envace.model.copying import copy_vocab, pretrain_copying

    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    vocab = copy_vocab(tokenizer)[:8]
    lines = []
    pretrain_copying(build_default(cfg, tokenizer), vocab, 300, seed=0, report_every=300, report=lines.append)
    assert [line.split(":")[0] for line in lines] == ["copy pretraining, short rows", "copy pretraining, long rows"]
    assert lines[1].startswith("copy pretraining, long rows: step 100/100")
    assert float(re.search(r"held-out copy accuracy ([\d.]+)", lines[0]).group(1)) > 1 / 8 + 0.03
    first, second = build_default(cfg, tokenizer), build_default(cfg, tokenizer)
    assert pretrain_copying(first, vocab, 6, seed=0) == pretrain_copying(second, vocab, 6, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert set(copy_vocab(tokenizer)).isdisjoint(tokenizer.all_special_ids)


def test_copy_steps_are_for_the_embedded_default_only():
    from envace.config import ParamsError, parse_params

    with pytest.raises(ParamsError, match="model: .*model.copy_steps is for the embedded default, not model.source 'smollm2'"):
        parse_params({"model": {"source": "smollm2", "copy_steps": 100}})
    assert parse_params({"model": {"copy_steps": 100}}).model.copy_steps == 100


def test_base_model_reports_the_copy_accuracy_of_copy_pretraining(prepared_dir, tmp_path, monkeypatch, capsys):
    import json
    import shutil

    from envace.config import parse_params
    from envace.model import load
    from envace.stages import base_model
    from tests.conftest import TINY_PARAMS

    shutil.copytree(prepared_dir / "data/prepared/tokenizer", tmp_path / "data/prepared/tokenizer")
    monkeypatch.chdir(tmp_path)
    base_model.run(parse_params(TINY_PARAMS))
    assert "copy_accuracy" not in json.loads((tmp_path / "metrics/base_model.json").read_text())
    untrained = load(tmp_path / "models/base")[0].state_dict()
    base_model.run(parse_params({**TINY_PARAMS, "model": {**TINY_PARAMS["model"], "copy_steps": 5}}))
    assert 0.0 <= json.loads((tmp_path / "metrics/base_model.json").read_text())["copy_accuracy"] <= 1.0
    out = capsys.readouterr().out  # the flow shows the stage's own lines
    assert "base_model: copy pretraining, short rows: step 5/5" in out and "base_model: copy pretraining, long rows: step 1/1" in out
    trained = load(tmp_path / "models/base")[0].state_dict()
    assert any(not torch.equal(untrained[k], trained[k]) for k in untrained)


def test_episodes_with_rare_tools_are_repeated(prepared_dir, tokenizer):
    from collections import Counter

    from envace.io import read_jsonl
    from envace.roles import MinimalTemplate
    from envace.data.episodes import recorded_calls
    from envace.train.data import SFTDataset

    episodes = list(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))
    plain = SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.0)
    balanced = SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.0, max_repeat=4)
    assert max(plain.repeats) == 1 and 1 < max(balanced.repeats) <= 4
    per_episode = [1 + bool(recorded_calls(ep)) for ep in episodes]  # ACT (+ REHEARSE when it called a tool)
    assert len(plain) == sum(per_episode)
    assert len(balanced) == sum(r * n for r, n in zip(balanced.repeats, per_episode))
    seen = Counter()  # rehearse sequences per tool and epoch: the rarest tool gains the most
    for ep, r in zip(episodes, balanced.repeats):
        for name in {c["name"] for c, _ in recorded_calls(ep)}:
            seen[name] += r
    calls = Counter(name for ep in episodes for name in {c["name"] for c, _ in recorded_calls(ep)})
    rarest = min(calls, key=calls.get)
    assert seen[rarest] / calls[rarest] == max(seen[t] / calls[t] for t in calls) > 1


def test_repeat_rule_examples():
    import doctest

    from envace.train import data

    assert doctest.testmod(data).failed == 0


def test_save_and_load_round_trip_as_safetensors(model, tokenizer, tmp_path):
    from envace.model import load, save

    save(model, tokenizer, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists() and (tmp_path / "m" / "tokenizer.json").exists()
    loaded, tok = load(tmp_path / "m")
    x = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(loaded(x).logits, model(x).logits)
    assert tok.padding_side == "left" and len(tok) == len(tokenizer)


def test_any_local_hf_checkpoint_loads_and_runs_episodes(tmp_path, prepared_dir):
    """A tiny random Qwen2 checkpoint with a chat template, saved to a temp dir, loaded by path."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from envace.config import RolloutConfig
    from envace.data.demonstrations import generate_tasks
    from envace.domains import get_domain
    from envace.model import load
    from envace.roles import ChatTemplate
    from envace.rollout.runner import EpisodeRunner, ModelResponder, Policy
    from tests.test_roles import CHATML

    tok = PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "qwen")
    tok.save_pretrained(tmp_path / "qwen")

    model, loaded_tok = load(tmp_path / "qwen")
    policy = Policy(model.eval(), loaded_tok)
    assert isinstance(policy.template, ChatTemplate) and policy.stop_id == loaded_tok.convert_tokens_to_ids("<|im_end|>")
    cfg = RolloutConfig(max_turns=2, max_new_tokens=8, batch_size=4)
    tasks = generate_tasks(get_domain("bank"), 4, 0)
    episodes = EpisodeRunner(policy, ModelResponder(policy, cfg, "rehearsed", 1.0), cfg, temperature=1.0).run(tasks)
    for task, e in zip(tasks, episodes):  # ACT was prompted through the checkpoint's own chat template
        first = e.generations[0]
        prompt = loaded_tok.decode(first.prompt_ids)
        assert first.role == "act" and prompt.startswith("<|im_start|>system")
        assert task.request.replace(" ", "") in prompt.replace(" ", "")  # this tokenizer decodes without spaces
        assert 0 < len(first.output_ids) <= cfg.max_new_tokens


def test_loading_a_directory_that_is_not_a_checkpoint_is_a_clear_error(tmp_path, model, tokenizer):
    from envace.model import CheckpointError, load

    with pytest.raises(CheckpointError, match="not a Hugging Face checkpoint"):
        load(tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load(tmp_path / "nowhere")
    model.save_pretrained(tmp_path / "weights-only")  # a checkpoint saved without its tokenizer
    with pytest.raises(CheckpointError, match="has no tokenizer"):
        load(tmp_path / "weights-only")


def _batch():
    torch.manual_seed(0)
    ids = torch.randint(20, 200, (2, 12))
    roles = torch.zeros_like(ids)
    roles[0, 4:7] = ROLE_IDS["act"]
    roles[1, 8:11] = ROLE_IDS["rehearse"]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "roles": roles}


def test_role_losses_train_only_on_tokens_that_role_wrote(model):
    from envace.train.losses import role_nll

    batch = _batch()
    parts = role_nll(model, **batch)
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
    nll = F.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")  # [B, T-1]
    target_roles = batch["roles"][:, 1:]
    torch.testing.assert_close(parts["act"], nll[target_roles == ROLE_IDS["act"]].mean())
    torch.testing.assert_close(parts["rehearse"], nll[target_roles == ROLE_IDS["rehearse"]].mean())
    assert parts["act_tokens"] == 3 and parts["rehearse_tokens"] == 3


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\(\)`")
def test_copy_weight_adds_the_weighted_copy_loss_of_the_steps_own_rows(model):
    from envace.model.copying import KEPT_ROWS, LONG, copy_loss, kept_rows
    from envace.train.warmup import WarmupModule

    vocab = list(range(20, 200))
    plain = WarmupModule(model, 1e-3, 0.0, 1, 10, 1.0).training_step(_batch(), 0)
    with_copy = WarmupModule(model, 1e-3, 0.0, 1, 10, 1.0, copy_weight=0.5, copy_vocab=vocab, copy_seed=3)
    rows = kept_rows(vocab, 3, 0)  # step 0's rows: the same whenever step 0 is trained
    assert rows[0].shape == (KEPT_ROWS, LONG.row) and all(torch.equal(a, b) for a, b in zip(rows, kept_rows(vocab, 3, 0)))
    assert not torch.equal(rows[0], kept_rows(vocab, 3, 1)[0])
    torch.testing.assert_close(with_copy.training_step(_batch(), 0), plain + 0.5 * copy_loss(model, *rows)[0])


def test_copy_weight_is_for_the_embedded_default_only():
    from envace.config import ParamsError, parse_params

    with pytest.raises(ParamsError, match="warmup.copy_weight is for the embedded default, not model.source 'smollm2'"):
        parse_params({"model": {"source": "smollm2"}, "warmup": {"copy_weight": 1.0}})


def test_context_tokens_get_no_gradient_from_their_own_prediction(model):
    """Changing a context token's *value* where nothing downstream is a target changes nothing."""
    from envace.train.losses import warmup_loss

    batch = _batch()
    base = warmup_loss(model, batch, lambda_env=0.5)["loss"]
    # token 11 of row 0 comes after every target of row 0, token 11 of row 1 likewise
    changed = {k: v.clone() for k, v in batch.items()}
    changed["input_ids"][:, 11] = 7
    torch.testing.assert_close(warmup_loss(model, changed, lambda_env=0.5)["loss"], base)


def test_lambda_env_weights_the_rehearse_loss(model):
    from envace.train.losses import warmup_loss

    batch = _batch()
    a, b = warmup_loss(model, batch, 0.0), warmup_loss(model, batch, 2.0)
    torch.testing.assert_close(a["loss"], a["act"])
    torch.testing.assert_close(b["loss"], b["act"] + 2.0 * b["rehearse"])


def test_no_targets_means_zero_loss_and_zero_gradient(model):
    from envace.train.losses import warmup_loss

    batch = _batch()
    batch["roles"].zero_()
    model.zero_grad()
    loss = warmup_loss(model, batch, 1.0)["loss"]
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_relabelled_examples_rename_names_consistently_and_nothing_else(prepared_dir, tokenizer):
    from envace.data.tokenizer import WORDS
    from envace.io import read_jsonl
    from envace.roles import MinimalTemplate
    from envace.train.data import SFTDataset

    episodes = list(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))[:60]
    plain = SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.0)
    renamed = SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.0, relabel_rate=1.0)
    names = {n for cls in renamed.classes for n in cls}
    assert len(renamed.classes) >= 4 and len(names) > 50  # owners, account ids, file names, folder names, ids
    vocab = tokenizer.get_vocab()  # word-level: one-token names swap among themselves, lengths unchanged
    assert all(all(n in vocab for n in cls) or not any(n in vocab for n in cls) for cls in renamed.classes)
    changed = 0
    for (a, ra), (b, rb) in zip(plain.examples, renamed.examples):
        words = lambda ids, roles, role: WORDS.findall(tokenizer.decode([i for i, r in zip(ids, roles) if r == role]))  # noqa: E731
        for role in (0, 1, 2):  # context and each role's targets rename alike, word for word
            wa, wb = words(a, ra, role), words(b, rb, role)
            assert len(wa) == len(wb)
            mapping = {}
            for x, y in zip(wa, wb):
                assert (x == y) if x not in names else mapping.setdefault(x, y) == y  # one name -> one name
            assert len(set(mapping.values())) == len(mapping)  # and never two names -> one
            assert all(any(x in c and y in c for c in renamed.classes) for x, y in mapping.items())  # within its class
        changed += a != b
        assert len(a) == len(b)
    assert changed > len(plain.examples) // 2


def test_relabelling_does_not_depend_on_how_domains_hash(prepared_dir, tokenizer, monkeypatch):
    # Domain objects hash through their functions' addresses, which differ from process to
    # process: nothing may iterate them in hash order, or each run renames differently
    import random

    from envace.domains.base import Domain
    from envace.io import read_jsonl
    from envace.roles import MinimalTemplate
    from envace.train.data import SFTDataset

    train = list(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))
    episodes = [e for d in ("bank", "files", "trading") for e in train if e["task"]["domain"] == d][::4]
    hashes = random.Random(0)
    monkeypatch.setattr(Domain, "__hash__", lambda self: hashes.randrange(1 << 30))
    built = [SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.0, relabel_rate=1.0).examples for _ in range(5)]
    assert all(examples == built[0] for examples in built[1:])


def test_permuted_draws_what_random_sample_draws():
    # relabelling's fast permutation must rename exactly as `rng.sample` did (the pinned
    # warmup models were trained on those names) and leave the stream where it left it
    import random

    from envace.train.data import permuted

    for seed in range(50):
        for n in (0, 1, 2, 3, 7, 64, 65, 298, 1000):
            names = [f"n{i}" for i in range(n)]
            ours, stdlib = random.Random(seed), random.Random(seed)
            assert permuted(names, ours) == stdlib.sample(names, n)
            assert ours.getstate() == stdlib.getstate()


def test_an_epoch_redrawn_gives_the_same_examples(prepared_dir, tokenizer):
    # what a resumed warmup relies on: the parts kept across epochs (ACT conversations, facts)
    # and the tokenizing memo change nothing when an earlier epoch is drawn again
    import random

    from envace.io import read_jsonl
    from envace.roles import MinimalTemplate, encode
    from envace.train.data import SFTDataset, episode_segments

    episodes = list(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))[:80]
    data = SFTDataset(episodes, MinimalTemplate(), tokenizer, 0.5, relabel_rate=0.5)
    first = list(data.examples)
    data.resample(1)
    assert data.examples != first  # dropout and renaming are redrawn
    data.resample(0)
    assert data.examples == first
    drawn = [episode_segments(episodes[0], MinimalTemplate(), random.Random(0), 0.5, fixed)
             for fixed in (None, data.fixed[0])]  # rendered afresh, and from the kept parts
    assert [[encode(tokenizer, segs) for segs in d] for d in drawn] == [[encode(tokenizer, segs) for segs in drawn[0]]] * 2


def _run_python(code: str, **env) -> list[str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return done.stdout.split()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_cpu_threads_follow_the_cores_a_process_may_use():
    """Two jobs pinned to a core each (taskset, a container's cpuset) get one thread each, not
    the machine's count, and ranks share what is there."""
    pinned = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); from envace.model import cpu_threads; print(cpu_threads(), cpu_threads(4))"
    assert _run_python(pinned) == ["1", "1"]


@pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
                    reason="needs two cores to tell one thread from all of them")
def test_cpu_threads_are_not_narrowed_by_openmp_binding_its_threads():
    """Under OMP_PROC_BIND libgomp pins the main thread to the first core as torch loads; a
    stage (which imports envace first, as `python -m envace.stages.<stage>` does) still gets a
    thread for every core it may use, not one."""
    cores = len(os.sched_getaffinity(0))
    bound = "import os; from envace.model import cpu_threads; import torch; torch.ones(64, 64) @ torch.ones(64, 64); print(len(os.sched_getaffinity(0)), cpu_threads())"
    pinned_by_openmp, threads = _run_python(bound, OMP_PROC_BIND="close", OMP_PLACES="cores")
    assert pinned_by_openmp == "1"  # what the affinity says once torch has loaded
    assert threads == str(cores)


def test_cpu_threads_where_the_os_reports_no_affinity_are_the_machines_cores():
    """macOS has no sched_getaffinity: a stage takes a thread for each of the machine's cores."""
    without = "import os; os.__dict__.pop('sched_getaffinity', None); from envace.model import cpu_threads; print(cpu_threads(), os.cpu_count())"
    threads, cores = _run_python(without)
    assert threads == cores


# A stage whose run() reports how a parallel operator treats denormals: x * 1 over 4M
# denormal floats, split over two torch threads; the share that came out 0 (flushed).
_STAGE_REPORTING_DENORMALS = """
import sys
from envace.stages import main

def run(params):
    torch_before = "torch" in sys.modules
    import torch
    torch.set_num_threads(2)
    x = torch.full((1 << 22,), 1e-39)
    print("torch imported before run:", torch_before, "flushed:", ((x * 1.0) == 0).float().mean().item())
    return {}

main(sys.argv.pop(1), run)
"""


@pytest.mark.parametrize("stage, expected", [("warmup", "True flushed: 1.0"), ("collect", "False flushed: 0.0")])
def test_a_model_stage_flushes_denormals_on_every_torch_thread(stage, expected, tmp_path):
    """Denormals take a slow path on many CPUs and a trained model makes many: every stage that
    runs a model computes with them flushed to zero, in each of torch's threads (set before the
    threads exist: set late, only the calling thread's half of the operator would be flushed); a
    data stage neither flushes nor imports torch."""
    import subprocess
    import sys

    from tests.conftest import TINY_PARAMS, write_params

    params = write_params(tmp_path / "params.yaml", TINY_PARAMS)
    out = subprocess.run([sys.executable, "-c", _STAGE_REPORTING_DENORMALS, stage, "--params", str(params)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"torch imported before run: {expected}" in out.stdout


def _steps(model, optimizer, schedule, n: int) -> list[float]:
    from envace.train.losses import warmup_loss

    losses = []
    for _ in range(n):
        loss = warmup_loss(model, _batch(), 1.0)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def test_muon_takes_the_decoder_matrices_adamw_the_rest_and_a_resumed_optimizer_goes_on_exactly(model):
    """`warmup.optimizer: muon`: Muon updates each decoder layer's projections, AdamW the tied
    embeddings and the norms; the schedule sets both learning rates; and an optimizer loaded
    from a state dict (a resumed warmup) takes the steps the uninterrupted one takes."""
    import copy

    from envace.train.warmup import WarmupModule

    def made(m):
        module = WarmupModule(m, 1e-2, 0.0, 2, 10, 1.0, optimizer="muon")
        found = module.configure_optimizers()
        return found["optimizer"], found["lr_scheduler"]["scheduler"]

    start = copy.deepcopy(model)
    whole = copy.deepcopy(start)
    optimizer, schedule = made(whole)
    owned = lambda group: {n for n, p in whole.named_parameters() if any(p is q for q in group["params"])}  # noqa: E731
    muon, adamw = optimizer.param_groups
    assert muon["muon"] and not adamw["muon"]
    assert owned(muon) == {f"model.layers.{i}.{k}.weight" for i in range(2) for k in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj")}
    assert owned(adamw) == {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{k}.weight" for i in range(2) for k in ("input_layernorm", "post_attention_layernorm")}
    assert whole.lm_head.weight is whole.model.embed_tokens.weight  # tied: AdamW's, once
    uninterrupted = _steps(whole, optimizer, schedule, 5)
    assert muon["lr"] == adamw["lr"] == schedule.get_last_lr()[0] < 1e-2

    first = copy.deepcopy(start)
    optimizer, schedule = made(first)
    resumed = _steps(first, optimizer, schedule, 3)
    saved = copy.deepcopy((first.state_dict(), optimizer.state_dict(), schedule.state_dict()))
    second = copy.deepcopy(start)
    optimizer, schedule = made(second)
    second.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    schedule.load_state_dict(saved[2])
    resumed += _steps(second, optimizer, schedule, 2)
    assert resumed == uninterrupted and len(set(uninterrupted)) == 5  # it trains, and resumes bit for bit
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), second.parameters()))


def test_only_llama_style_layer_matrices_go_to_muon():
    from envace.train.warmup import is_layer_matrix

    matrix = torch.zeros(4, 4)
    assert is_layer_matrix("model.layers.0.self_attn.q_proj.weight", matrix)
    assert is_layer_matrix("base_model.model.model.layers.1.mlp.up_proj.lora_A.default.weight", matrix)
    assert not is_layer_matrix("model.embed_tokens.weight", matrix)
    assert not is_layer_matrix("model.layers.0.input_layernorm.weight", torch.zeros(4))
    assert not is_layer_matrix("transformer.h.0.attn.c_attn.weight", matrix)  # GPT-2's naming: the stage refuses muon


def test_newton_schulz_makes_a_matrix_near_orthogonal_in_its_own_shape():
    from envace.train.warmup import MuonAdamW, orthogonalised

    torch.manual_seed(0)
    for shape in ((8, 24), (24, 8)):
        g = torch.randn(shape) * torch.logspace(-2, 0, shape[1])  # columns two decades apart in scale
        o = orthogonalised(g, *MuonAdamW.NEWTON_SCHULZ)
        values = torch.linalg.svdvals(o)
        assert o.shape == g.shape and values.min() > 0.5 and values.max() < 1.3, values


def test_the_train_stage_reads_its_variants_without_loading_torch():
    """`python -m envace.stages.train` reads its variants before `main` flushes denormals: from a
    module that loads neither torch nor Lightning (loaded there, they would also be counted as
    the pipeline's overhead instead of the stage's own time)."""
    code = ("import sys, envace.stages.train; from envace.train import VARIANTS; "
            "print(VARIANTS, sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    assert " ".join(_run_python(code)) == "('sft', 'real_env', 'simulator', 'envace') []"
