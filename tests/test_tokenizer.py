"""The word-level tokenizer's byte fallback: any text, seen or not, encodes without `<unk>`
and decodes exactly, while the learned ids stay those of the plain BPE."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from envace.data.tokenizer import _train_bpe, compact_json, is_word_level, model_json, train_tokenizer

CORPUS = [
    "Send 25 from Alice to Bob",
    compact_json([{"name": "transfer", "arguments": {"account_id": "A17", "amount": 227.16}}]),
    compact_json({"files": {"$0": "q1.txt", "$1": "notes.md"}, "branch": "main"}),
    "List the files of Bob\tthen stop\n",
]
UNSEEN = [
    "PR-99821", "zoë-müller", "José", "Ångström", "東京", "🚀", "👩‍💻 done", "feature/ångström-2",
    "tab\x0bvertical\x0cfeed", "naïve café", "Привет, мир",
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS)


def assert_exact(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.unk_token_id not in ids, (text, tok.convert_ids_to_tokens(ids))
    assert tok.decode(ids) == text


@pytest.mark.parametrize("value", UNSEEN)
def test_unseen_values_are_exact(tok, value):
    assert_exact(tok, value)
    assert_exact(tok, compact_json({"branch": value}))  # as a JSON value, after its key piece
    assert_exact(tok, f"Merge {value} into main")


def test_json_with_unicode_and_batch_decode(tok):
    text = '{"branch":"zoë-fix"}'
    assert_exact(tok, text)
    batch = tok(["Alice", text], add_special_tokens=False, padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id  # left padding still
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == ["Alice", text]


def test_seen_words_are_one_token(tok):
    assert is_word_level(tok)
    for word in ["Alice", "transfer", "227.16", "q1.txt", '"account_id":"']:
        assert tok.tokenize(word) == [word]


@pytest.mark.parametrize("corpus", [CORPUS, CORPUS + ["zoë paid José 5€"]], ids=["ascii", "unicode"])
def test_learned_ids_unchanged(corpus):
    plain, tok = _train_bpe(corpus, 1), train_tokenizer(corpus)
    vocab, n = tok.get_vocab(), plain.get_vocab_size()
    assert {t: i for t, i in vocab.items() if i < n} == plain.get_vocab()
    assert len(tok) == n + 256
    assert [tok.convert_ids_to_tokens(n + b) for b in (0, 0x41, 0xFF)] == ["<0x00>", "<0x41>", "<0xFF>"]
    # Any ASCII text, seen or not, gets the very ids the plain BPE gives.
    for text in corpus + ["PR-99821 and zzz", compact_json({"unseen_key": "x9"})]:
        if text.isascii():
            assert tok.encode(text, add_special_tokens=False) == plain.encode(text).ids


def test_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert json.loads(loaded.backend_tokenizer.to_str())["model"]["byte_fallback"] is True
    assert is_word_level(loaded) and loaded.padding_side == "left"
    assert loaded.get_vocab() == tok.get_vocab()
    for value in UNSEEN:
        assert_exact(loaded, compact_json({"branch": value}))
        assert loaded.encode(value, add_special_tokens=False) == tok.encode(value, add_special_tokens=False)


def test_split_digits_spells_every_number_by_its_digits(tmp_path):
    """`prepare.split_digits`: a number is its digits, seen or not, and the tokenizer is still
    ours after a save and load (so warmup renames numbers as names)."""
    from envace.data.tokenizer import splits_digits
    from envace.train.data import relabel_classes

    tok = train_tokenizer(CORPUS, split_digits=True)
    assert tok.tokenize(compact_json({"amount": 372})) == ["{", '"amount":', "3", "7", "2", "}"]
    assert tok.tokenize("A17") == ["A", "1", "7"] and tok.tokenize("Alice") == ["Alice"]
    # a list element's index key stays one piece: each element follows a key of its own
    listed = model_json({"repos": ["ann/x", "bo/y"]})
    assert train_tokenizer(CORPUS + [listed], split_digits=True).tokenize(listed)[3:6] == ['"$0":"', "ann", "/"]
    for value in UNSEEN + ["227.16", "PR-99821"]:
        assert_exact(tok, compact_json({"branch": value}))
    tok.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert is_word_level(loaded) and splits_digits(loaded) and not splits_digits(train_tokenizer(CORPUS))

    class Numbers:  # a domain whose interchangeable names are numbers the vocabulary never saw
        interchangeable, tools = (("372", "915", "12"),), []
    # same-length numbers form a class of their own: renaming never changes a sequence's length
    assert relabel_classes([Numbers()], loaded) == [["372", "915"]]
    assert relabel_classes([Numbers()], train_tokenizer(CORPUS)) == []


def test_digit_places_give_each_later_digit_a_token_of_its_place(tmp_path):
    """`prepare.digit_places`: the digits of a number after its first are tokens of their place
    (the 2 of 221 at place 1 is not the 2 at place 0), words like `A17` keep plain digits, text
    decodes exactly, the tokenizer is still ours after a save and load, and a number is still
    renamed only to one of as many digits."""
    from envace.data.tokenizer import PLACE_MARKS, splits_digits
    from envace.train.data import relabel_classes

    tok = train_tokenizer(CORPUS, split_digits=True, digit_places=True)
    pieces = tok.tokenize(compact_json({"amount": 221}))
    assert pieces[:2] == ["{", '"amount":'] and pieces[2] == "2" and len(pieces) == 6
    assert pieces[3] != pieces[2] and pieces[3] != pieces[4] and {pieces[3], pieces[4]} <= set(PLACE_MARKS)
    assert tok.tokenize("A17") == ["A", "1", "7"]
    # a 2 at place 1 is the same token in every number; a 6th digit and later stay plain
    assert tok.tokenize("#52")[2] == pieces[3] and tok.tokenize("123456")[-1] == "6"
    for value in UNSEEN + ["227.16", "PR-99821", "12345678", "#1 and 22 and 333\n4444"]:
        assert_exact(tok, compact_json({"branch": value}))
        assert_exact(tok, f"pull request {value}")
    tok.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert is_word_level(loaded) and splits_digits(loaded) and loaded.tokenize("221") == tok.tokenize("221")

    class Numbers:
        interchangeable, tools = (("372", "915", "12"),), []
    assert relabel_classes([Numbers()], loaded) == [["372", "915"]]
    with pytest.raises(ValueError, match="digit_places needs split_digits"):
        train_tokenizer(CORPUS, digit_places=True)


def test_spaced_words_take_the_space_before_them(tmp_path):
    """`prepare.spaced_words`: ` upload` is one token, so a title is copied word by word; text
    still decodes exactly, and the tokenizer is still ours after a save and load."""
    from envace.train.data import relabel_classes

    tok = train_tokenizer(CORPUS + ["Fix upload pager"], spaced_words=True, split_digits=True)
    assert tok.tokenize("Fix upload pager") == ["Fix", " upload", " pager"]
    assert tok.tokenize(compact_json({"amount": 372})) == ["{", '"amount":', "3", "7", "2", "}"]
    for value in UNSEEN:
        assert_exact(tok, compact_json({"title": f"Fix {value} now"}))
    tok.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert is_word_level(loaded) and loaded.tokenize("Fix upload pager") == ["Fix", " upload", " pager"]

    class Words:  # `pager` and `upload` are known only after a space: still renamable names
        interchangeable, tools = (("upload", "pager", "nowhere"),), []
    assert relabel_classes([Words()], loaded) == [["upload", "pager"]]
