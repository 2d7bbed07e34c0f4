"""A word-level tokenizer for tool traffic: every entity, number and word is one token.

Byte-level BPE splits ids and names into pieces a small model cannot copy reliably
(a 2M-parameter prototype with one: 0% success after 7 minutes). We pre-split text into words, numbers/ids (`A17`, `227.16`,
`q1.txt`), single spaces and single punctuation marks, then train a BPE whose merges
rebuild every word seen in training as one token. A word never seen in training is
still encodable: it falls back to its characters (printable ASCII is always in the
vocabulary), and any other character (`ë`, `東`, an emoji, a control character) falls back
to its UTF-8 bytes (`<0xC3><0xAB>`), so every text encodes without `<unk>` and decodes
exactly: a value never seen in training can still be copied. The alphabet stays printable
ASCII even when training text has other characters, so those always go through bytes (a
non-ASCII word seen in training is its ASCII parts plus byte tokens, not one token); that
keeps the learned vocabulary independent of the byte fallback. The 256 byte tokens come
after every learned token, so the learned ids are those of a BPE trained without them.
Trained on the training split plus the tool schemas only — never on val/test.

Three options for values a small model must copy as sequences (a project's `prepare` params):
- `split_digits`: every digit is a piece of its own, so a number is spelled with ten frequent
  tokens. For numbers drawn from a large pool (pull request #10-#399): each such number is
  seen too seldom in training for its own token to become copyable, and a 2-layer model then
  answers the most frequent number instead of the one in front of it.
- `spaced_words`: a word takes the single separator before it: a space (` upload` is one piece,
  as in GPT-2's BPE), a slash or a hyphen (`hotfix/coupon` is `hotfix`, `/coupon`;
  `nimbus-scheduler` is `nimbus`, `-scheduler`). Copying a multi-word value (a title,
  "Simplify upload pager", a branch or repo name) is then one induction step per word — find
  the token just written earlier, copy what followed it — instead of a step from a bare
  separator, which follows every word and points nowhere (a branch's topic after a bare `/` was
  copied from the wrong branch). A name of new combinations stays spelled with known words.
  That step needs a model with an induction circuit; the embedded 2-layer default trained on
  the gitforge example has none (no head puts over 0.06 of its attention on the token before:
  `bench/copy_errors.py`) and copies a title's words in another order ("Speed up sitemap
  checkout"), as it did a number's digits before `digit_places`.
- `digit_places` (with `split_digits`): a number's 2nd to 5th digits are tokens of their own,
  one set of ten per place, so `221` is `2`, `2@2nd`, `1@3rd` (a 6th digit and later stay plain).
  Spelled with ten plain digits, a 2-layer model copied the digits of a number but not their
  order (221 -> 222, 79 -> 97, 387 -> 378): which digit comes second is then a lookup by what the
  digit is, not by what follows what. The places are private-use characters (U+E010-U+E049)
  that a normalizer writes and the decoder reads back, so text decodes exactly; such a
  character in the input decodes as its digit.
"""

from __future__ import annotations

import json
import re
import string
from typing import Iterable, Iterator

SPECIAL_TOKENS = [
    "<pad>", "<unk>", "<s>", "</s>",
    "<|user|>", "<|act|>", "<|tool|>", "<|rehearse|>", "<|facts|>", "<|schema|>", "<|end|>",
]
# A JSON key with its colon and, for a string value, the opening quote (`"account_id":"`)
# is one piece, so the value token follows its key directly: copying a value is then a
# plain induction step (find the key earlier in the context, copy what followed it).
# Values are bare tokens, so `Alice` in a request and in a call is the same token.
KEY_PIECE = r'"[A-Za-z0-9_$()]+":"?'
PIECE_PATTERN = KEY_PIECE + r'|[A-Za-z0-9_$]+(?:[.\-][A-Za-z0-9_]+)*|\s|.'
WORDS = re.compile(PIECE_PATTERN, re.DOTALL)  # the pieces of a text, also for tokenizers that are not ours
GLUED_WORD = r'[ /\-]?[A-Za-z0-9_$]+(?:\.[A-Za-z0-9_]+)*'  # `spaced_words`: a word and the separator before it
SPACED_PIECE_PATTERN = KEY_PIECE + '|' + GLUED_WORD + r'|\s|.'
# `split_digits`: every digit a piece, except inside a key piece: the index key of a list element
# (`"$1":"`, see `indexed`) stays one token, so each element still follows a key of its own
DIGIT_PATTERN = KEY_PIECE + r'|[0-9]'

ALPHABET = sorted(set(string.printable) - set("\x0b\x0c"))

# `digit_places`: the digit d at place k of a number (k = 1..4, counted from 0 at its first digit)
# is the character U+E000 + 16k + d; a 6th digit and later stay plain. A number is a run of digits
# not glued to a word before it (`A17` and `v2` stay words).
LAST_PLACE = 4


def _mark(place: int, digit: int) -> str:
    return chr(0xE000 + 16 * place + digit)


PLACE_MARKS = {_mark(k, d): str(d) for k in range(1, LAST_PLACE + 1) for d in range(10)}


def _pre_tokenizers(tokenizer) -> list[dict]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = json.loads(backend.to_str()).get("pre_tokenizer") or {} if backend is not None else {}
    return pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]


def is_word_level(tokenizer) -> bool:
    """Whether `tokenizer` is ours (pre-split into PIECE_PATTERN pieces): a word it knows is one
    token, a word it never saw is spelled out."""
    first = _pre_tokenizers(tokenizer)[0]
    return first.get("type") == "Split" and first.get("pattern", {}).get("Regex") in (PIECE_PATTERN, SPACED_PIECE_PATTERN)


def knows(vocab: dict, name: str) -> bool:
    """Whether our tokenizer with this vocabulary spells `name` from learned words: whole, after a
    space, or (`spaced_words`) as its glued parts (`nimbus`, `-scheduler`), each known.

    >>> knows({"nimbus": 0, "-scheduler": 1}, "nimbus-scheduler"), knows({"nimbus": 0}, "nimbus-api")
    (True, False)
    """
    return name in vocab or f" {name}" in vocab or all(p in vocab or f" {p}" in vocab
                                                       for p in re.findall(GLUED_WORD, name))


def splits_digits(tokenizer) -> bool:
    """Whether `tokenizer` is ours and spells every number digit by digit (`split_digits`)."""
    return is_word_level(tokenizer) and any(p.get("type") == "Digits" or p.get("pattern", {}).get("Regex") == DIGIT_PATTERN
                                            for p in _pre_tokenizers(tokenizer)[1:])


def compact_json(obj) -> str:
    """The one JSON spelling the model reads and writes: no spaces, keys in given order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def indexed(obj):
    """Lists of plain values become {"$0": a, "$1": b, ...} (recursively; [] stays []).

    >>> indexed({"files": ["a.txt", "b.txt"], "rows": [{"x": []}]})
    {'files': {'$0': 'a.txt', '$1': 'b.txt'}, 'rows': [{'x': []}]}
    """
    if isinstance(obj, list):
        if obj and not any(isinstance(v, (dict, list)) for v in obj):
            return {f"${i}": v for i, v in enumerate(obj)}
        return [indexed(v) for v in obj]
    if isinstance(obj, dict):
        return {k: indexed(v) for k, v in obj.items()}
    return obj


def unindexed(obj):
    """The inverse of `indexed`.

    >>> unindexed({"files": {"$0": "a.txt", "$1": "b.txt"}, "n": {"$1": 2}})
    {'files': ['a.txt', 'b.txt'], 'n': {'$1': 2}}
    """
    if isinstance(obj, dict):
        if obj and list(obj) == [f"${i}" for i in range(len(obj))]:
            return [unindexed(v) for v in obj.values()]
        return {k: unindexed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unindexed(v) for v in obj]
    return obj


def model_json(obj) -> str:
    """How the model reads and writes tool responses and facts: compact JSON whose lists of
    plain values are `indexed`, so every element follows its own key piece (`"$1":"`) and is
    copied like any field. A 2-layer model copies fields by key but never learned to copy a
    bare list (`["a","b"]`: 0.44 exact, only the empty lists right; README, Learnability)."""
    return compact_json(indexed(obj))


def episode_texts(episode: dict) -> Iterator[str]:
    """The strings of an episode a model will read or write."""
    for m in episode.get("messages", []):
        if m.get("role") == "user":
            yield m["content"]
        elif "calls" in m:
            yield compact_json(m["calls"])
        elif "answer" in m:
            yield compact_json({"answer": m["answer"]})
        elif m.get("role") == "tool":
            yield model_json(m["response"])


def schema_texts(schemas: Iterable[dict]) -> Iterator[str]:
    for schema in schemas:
        yield compact_json(schema)


def _place_normalizer():
    """Writes each digit after a number's first as its place's mark, the last place first, so
    every pass still sees the plain digits before the ones it marks.

    >>> _place_normalizer().normalize_str("#221, A17, 5") == "#2\ue012\ue021, A17, 5"
    True
    """
    from tokenizers import Regex, normalizers

    passes = []
    for k in range(LAST_PLACE, 0, -1):
        # exactly k digits after the start or a character that is no part of a word or number
        # (Oniguruma's look-behind takes only alternatives of fixed lengths, hence `^` apart)
        before = f"^[0-9]{{{k}}}|[^0-9A-Za-z_${_mark(1, 0)}-{_mark(LAST_PLACE, 15)}][0-9]{{{k}}}"
        passes += [normalizers.Replace(Regex(f"(?<={before}){d}"), _mark(k, d)) for d in range(10)]
    return normalizers.Sequence(passes)


def _train_bpe(texts: Iterable[str], min_frequency: int, split_digits: bool = False, spaced_words: bool = False,
               digit_places: bool = False):
    """The plain word-level BPE (no byte fallback): its vocabulary is the first ids of ours."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if digit_places:
        tok.normalizer = _place_normalizer()
    pattern = SPACED_PIECE_PATTERN if spaced_words else PIECE_PATTERN
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    if split_digits:
        digits = pre_tokenizers.Split(Regex(DIGIT_PATTERN), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([tok.pre_tokenizer, digits])
    tok.decoder = decoders.Fuse()
    alphabet = ALPHABET + sorted(PLACE_MARKS) if digit_places else ALPHABET
    trainer = trainers.BpeTrainer(
        vocab_size=1_000_000,  # never the limit: merging stops when every word is whole
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_tokenizer(texts: Iterable[str], min_frequency: int = 1, split_digits: bool = False,
                    spaced_words: bool = False, digit_places: bool = False):
    """Train the word-level BPE, add the byte fallback and wrap it as a
    `PreTrainedTokenizerFast` (left padding).

    >>> tok = train_tokenizer(["hello world"])
    >>> ids = tok.encode('{"name":"zoë"} 東京', add_special_tokens=False)
    >>> tok.unk_token_id in ids, tok.decode(ids)
    (False, '{"name":"zoë"} 東京')
    >>> text = '{"number":372,"ids":{"$10":"A7"}}'
    >>> train_tokenizer([text], split_digits=True).tokenize(text)
    ['{', '"number":', '3', '7', '2', ',', '"ids":', '{', '"$10":"', 'A', '7', '"', '}', '}']
    >>> train_tokenizer(["Fix upload pager"], spaced_words=True).tokenize("Fix upload pager")
    ['Fix', ' upload', ' pager']
    >>> train_tokenizer(["hotfix/nimbus-api"], spaced_words=True).tokenize("hotfix/nimbus-api")
    ['hotfix', '/nimbus', '-api']
    >>> tok = train_tokenizer(['{"number":221}'], split_digits=True, digit_places=True)
    >>> [len(t) for t in tok.tokenize('{"number":221}')], tok.decode(tok.encode("#221", add_special_tokens=False))
    ([1, 9, 1, 1, 1, 1], '#221')
    """
    if digit_places and not split_digits:
        raise ValueError("digit_places needs split_digits: the places mark digits spelled one by one")
    from tokenizers import decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = _train_bpe(texts, min_frequency, split_digits, spaced_words, digit_places)
    bpe = json.loads(tok.to_str())["model"]
    vocab = dict(bpe["vocab"])
    # Appended, so no learned id moves. No learned token can look like `<0x41>`: `<` is always
    # a piece of its own.
    vocab.update({f"<0x{b:02X}>": len(bpe["vocab"]) + b for b in range(256)})
    tok.model = models.BPE(vocab, [tuple(m) for m in bpe["merges"]], unk_token="<unk>", byte_fallback=True)
    places = [decoders.Replace(mark, digit) for mark, digit in PLACE_MARKS.items()] if digit_places else []
    tok.decoder = decoders.Sequence([*places, decoders.ByteFallback(), decoders.Fuse()])  # bytes back to UTF-8
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:], padding_side="left", clean_up_tokenization_spaces=False,
    )
