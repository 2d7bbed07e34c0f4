import json

import pytest

from envace.roles import (
    ACT, REHEARSE, ROLE_IDS, ActOutput, ChatTemplate, Failure, MinimalTemplate, canonical, encode, parse_act,
    parse_rehearse, signature,
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(prepared_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")


@pytest.fixture(scope="module")
def episode(prepared_dir):
    from envace.io import read_jsonl

    return next(e for e in read_jsonl(prepared_dir / "data/prepared/train.jsonl")
                if sum("calls" in m for m in e["messages"]) >= 2)


def _spans(tokenizer, ids, roles, role):
    """The decoded text of each maximal run of tokens written by `role`."""
    out, run = [], []
    for i, r in zip(ids, roles):
        if r == ROLE_IDS[role]:
            run.append(i)
        elif run:
            out.append(tokenizer.decode(run)); run = []
    return out + ([tokenizer.decode(run)] if run else [])


def test_act_sequence_trains_exactly_on_act_outputs(tokenizer, episode):
    t = MinimalTemplate()
    task = episode["task"]
    ids, roles = encode(tokenizer, t.act(task["tools"], task["request"], episode["messages"]))
    acts = [m for m in episode["messages"] if m["role"] == "act"]
    spans = _spans(tokenizer, ids, roles, ACT)
    assert len(spans) == len(acts)
    for span, m in zip(spans, acts):
        assert span.endswith("<|end|>")
        parsed = parse_act(span, task["tools"], 5)
        assert parsed == (ActOutput(calls=m["calls"]) if "calls" in m else ActOutput(answer=m["answer"]))
    assert ROLE_IDS[REHEARSE] not in roles
    # tool responses and the request are context, never targets
    context = tokenizer.decode([i for i, r in zip(ids, roles) if r == 0])
    assert task["request"] in context
    for m in episode["messages"]:
        if m["role"] == "tool":
            assert json.dumps(m["response"], separators=(",", ":")) in context


def test_rehearse_sequence_trains_exactly_on_the_responses(tokenizer, episode):
    from envace.data.episodes import fact_source, recorded_calls

    t = MinimalTemplate()
    task = episode["task"]
    recorded = recorded_calls(episode)
    facts = fact_source(task)
    steps = [(c, facts.facts(c), r) for c, r in recorded]
    ids, roles = encode(tokenizer, t.rehearse(task["tools"], task["request"], steps))
    spans = _spans(tokenizer, ids, roles, REHEARSE)
    assert [parse_rehearse(s) for s in spans] == [r for _, r in recorded]
    text = tokenizer.decode(ids)
    assert text.count("<|facts|>") == len(recorded)
    # the prompt for call k is exactly the training sequence's prefix
    k = len(recorded) - 1
    prompt_ids, _ = encode(tokenizer, t.rehearse(task["tools"], task["request"], steps[:k] + [(steps[k][0], steps[k][1], None)], train=False))
    assert ids[: len(prompt_ids)] == prompt_ids
    hidden = [(c, None, r) for c, r in recorded]
    assert "<|facts|>" not in tokenizer.decode(encode(tokenizer, t.rehearse(task["tools"], task["request"], hidden))[0])


def _chat_tokenizer(tokenizer, template=CHATML):
    chat_tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    chat_tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chat_tok.chat_template = template
    return chat_tok


def test_chat_template_is_used_when_the_tokenizer_has_one(tokenizer, episode):
    from envace.roles import template_for

    chat_tok = _chat_tokenizer(tokenizer)
    tmpl = template_for(chat_tok)
    assert isinstance(tmpl, ChatTemplate) and tmpl.end == "<|im_end|>"
    task = episode["task"]
    ids, roles = encode(chat_tok, tmpl.act(task["tools"], task["request"], episode["messages"]))
    spans = _spans(chat_tok, ids, roles, ACT)
    assert len(spans) == sum(m["role"] == "act" for m in episode["messages"])
    # a target is the turn's content and the end-of-turn token: the newline after it is context
    assert all(s.endswith("<|im_end|>") for s in spans)
    acts = [m for m in episode["messages"] if m["role"] == "act"]
    assert [parse_act(s, task["tools"], 5, end=tmpl.end) for s in spans] == [
        ActOutput(calls=m["calls"]) if "calls" in m else ActOutput(answer=m["answer"]) for m in acts]
    prompt = chat_tok.decode(encode(chat_tok, tmpl.act_prompt(task["tools"], task["request"], []))[0])
    assert prompt.endswith("<|im_start|>assistant\n")
    rendered = chat_tok.apply_chat_template(
        [{"role": "system", "content": "x"}], tokenize=False)  # the segments rebuild the template's own render
    assert rendered.startswith("<|im_start|>system")
    full = "".join(s.text for s in tmpl.act(task["tools"], task["request"], episode["messages"]))
    assert full.count("<|im_start|>assistant") == len(acts)


def test_a_template_without_a_stop_token_or_that_rewrites_turns_is_a_clear_error(tokenizer):
    from envace.roles import TemplateError, template_for

    plain = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = CHATML  # its <|im_end|> is no token of this vocabulary
    with pytest.raises(TemplateError, match="not a special token"):
        template_for(plain)
    # a template that renders only the last user turn (earlier turns vanish): not prefix-stable
    last_only = ("{% for m in messages %}{% if loop.last or m['role'] != 'user' %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(TemplateError, match="not prefix-stable"):
        template_for(_chat_tokenizer(tokenizer, last_only))


def test_a_template_that_cannot_render_the_tools_is_a_clear_error(tokenizer):
    from envace.roles import TemplateError, check_template

    no_system = ("{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    check_template(_chat_tokenizer(tokenizer), TOOLS)  # ChatML: fine
    with pytest.raises(TemplateError, match="cannot render the tools.*get_balance"):
        check_template(_chat_tokenizer(tokenizer, no_system), TOOLS)


TOOLS = [
    {"type": "function", "risk": "low", "preconditions": [],
     "function": {"name": "get_balance", "description": "", "parameters": {
         "type": "object", "properties": {"account_id": {"type": "string"}}, "required": ["account_id"],
         "additionalProperties": False}}},
]


@pytest.mark.parametrize("text, reason", [
    ("", "act_not_json"),
    ("qz ;; random words", "act_not_json"),
    ('[{"name":"get_balance","arguments":{"account_id":"A1"', "act_not_json"),
    ("42", "act_not_calls_or_answer"),
    ("[]", "act_not_calls_or_answer"),
    ('{"answer": 3}', "act_not_calls_or_answer"),
    ('[{"name":"launch","arguments":{}}]', "unknown_tool"),
    ('[{"name":"get_balance","arguments":{"account_id":7}}]', "invalid_arguments"),
    ('[{"name":"get_balance","arguments":{}}]', "invalid_arguments"),
    ('[{"name":"get_balance"}]', "malformed_call"),
    ('[{"name":"get_balance","arguments":{"account_id":"A1"},"x":1}]', "malformed_call"),
    ('[' + ','.join(['{"name":"get_balance","arguments":{"account_id":"A1"}}'] * 4) + ']', "too_many_calls"),
])
def test_malformed_act_output_is_a_failure_with_its_reason(text, reason):
    out = parse_act(text, TOOLS, max_calls=3)
    assert isinstance(out, Failure) and out.reason == reason


def test_valid_act_outputs_parse():
    calls = parse_act('[{"name":"get_balance","arguments":{"account_id":"A1"}}]<|end|>', TOOLS, 3)
    assert calls == ActOutput(calls=[{"name": "get_balance", "arguments": {"account_id": "A1"}}])
    assert parse_act('{"answer":"It is 12."}<|end|>', TOOLS, 3) == ActOutput(answer="It is 12.")


@pytest.mark.parametrize("text, ok", [('{"a":1}<|end|>', True), ('[1]', False), ('{"a":', False), ("", False)])
def test_rehearse_output_must_be_one_json_object(text, ok):
    assert isinstance(parse_rehearse(text), dict) is ok


def test_canonical_json_ignores_key_order():
    assert canonical({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical({"a": [1, {"c": 3, "d": 2}], "b": 1})


def test_lists_reach_the_model_indexed_and_come_back_as_lists(tokenizer):
    call = {"name": "list_folder", "arguments": {"folder_id": "D12"}}
    facts = {"folder": {"folder_id": "D12", "files": ["q1.txt", "memo.pdf"]}}
    response = {"folder_id": "D12", "files": ["q1.txt", "memo.pdf"]}
    segs = MinimalTemplate().rehearse([], "List D12.", [(call, facts, response)])
    written = "".join(s.text for s in segs if s.role == REHEARSE)
    assert written == '{"folder_id":"D12","files":{"$0":"q1.txt","$1":"memo.pdf"}}<|end|>'
    assert '"files":{"$0":"q1.txt"' in segs[-2].text  # the facts use the same spelling
    assert parse_rehearse(written) == response
    assert parse_rehearse('{"files":[],"n":{"$1":2}}') == {"files": [], "n": {"$1": 2}}  # only $0..$n-1 is a list
    # each element follows its own key piece, one token, as every field value does
    ids = tokenizer.encode('"files":{"$0":"q1.txt","$1":"memo.pdf"}', add_special_tokens=False)
    assert {'"$0":"', '"$1":"'} <= set(tokenizer.convert_ids_to_tokens(ids))


def test_a_template_that_reads_tools_gets_them_through_apply_chat_template(tokenizer, episode):
    """Templates with a `tools` variable (Qwen, Llama 3.1, ...) render the schemas themselves."""
    with_tools = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "{% if loop.first and tools %}\n# Tools{% for t in tools %}\n{{ t['function']['name'] }}: "
                  "{{ t['function']['description'] }}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    from envace.roles import check_template, template_for

    chat_tok = _chat_tokenizer(tokenizer, with_tools)
    tmpl = template_for(chat_tok)
    task = episode["task"]
    text = "".join(s.text for s in tmpl.act_prompt(task["tools"], task["request"], episode["messages"][:1]))
    assert tmpl.native_tools and "# Tools" in text and "Tools: " not in text  # not repeated as signatures
    assert all(f"{t['function']['name']}: {t['function']['description']}" in text for t in task["tools"])
    check_template(chat_tok, task["tools"])
