"""The lab lever experiments/negative_control/xlkv_detok_tail.py (issue 41): vLLM's first-token
detokenizer primed with the prompt's last n ids instead of the whole prompt must give the same text,
token by token, as the whole-prompt priming vLLM 0.21+ does.  Real `tokenizers` DecodeStreams on
tokenizers trained here: a byte-level BPE (multi-byte characters split across tokens) and a
Metaspace BPE with byte fallback (SentencePiece-like); prompts cut anywhere, inside characters too.
A planted fault (the tail without the check that its text ends on a whole character) must differ."""

import os
import random
import sys

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from tokenizers.decoders import DecodeStream  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments", "negative_control"))
import xlkv_detok_tail as lever  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. Überraschung! naïve café, 東京都の天気は晴れです。"
        "我们今天去公园散步。🙂🚀🌶️ emoji runs 😀😃😄 and ÅÄÖ åäö, Ελληνικά κείμενα, русский текст. ") * 6


def _byte_level():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _metaspace():
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = ["<0x%02X>" % i for i in range(256)]
    tok.train_from_iterator([TEXT[:300]], trainers.BpeTrainer(vocab_size=600, special_tokens=bytes_))
    return tok


TOKENIZERS = {"byte-level": _byte_level, "metaspace": _metaspace}


def _cases(tok, seed, count=60):
    """(prompt ids, continuation ids): the text's ids cut at random points (inside characters too, the
    byte-level pieces split them), and random vocabulary ids."""
    rng = random.Random(seed)
    ids = tok.encode(TEXT).ids
    vocab = tok.get_vocab_size()
    out = []
    for _ in range(count):
        a = rng.randrange(0, len(ids) - 40)
        b = rng.randrange(a + 1, min(len(ids), a + 400))
        prompt = ids[a:b] if rng.random() < 0.7 else [rng.randrange(vocab) for _ in range(rng.randrange(1, 300))]
        cont = ids[b:b + 24] if rng.random() < 0.5 else [rng.randrange(vocab) for _ in range(24)]
        out.append((prompt, cont))
    return out


def _texts(stream, tok, cont):
    return [stream.step(tok, t) for t in cont]


def _stock(tok, prompt):
    return DecodeStream(ids=prompt, skip_special_tokens=True)


def _lever(tok, prompt, n, guard=True):
    if guard:
        s = lever.tail_stream(tok, prompt, True, n)
    else:   # the planted fault: no check of the tail's text (empty, or ending inside a character)
        s = DecodeStream(ids=prompt[-n:], skip_special_tokens=True) if len(prompt) > n else None
    return s or _stock(tok, prompt)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@pytest.mark.parametrize("n", [3, 8, 64])
def test_the_tail_gives_vllms_text_token_by_token(name, n):
    tok = TOKENIZERS[name]()
    used = 0
    for prompt, cont in _cases(tok, seed=n):
        want = _texts(_stock(tok, prompt), tok, cont)
        s = lever.tail_stream(tok, prompt, True, n)
        used += s is not None
        assert _texts(s or _stock(tok, prompt), tok, cont) == want, (name, n, prompt[-n:], cont)
    assert used >= 10, used          # the tail was taken in many cases, not only the fallback


def test_a_prompt_that_ends_inside_a_character_keeps_vllms_stream_and_the_unguarded_tail_differs():
    tok = _byte_level()
    ids = tok.encode("abc " * 20 + "🙂").ids
    cut = [i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd")]
    assert cut, "the emoji is no longer split across tokens"
    prompt, cont = ids[:cut[-1]], ids[cut[-1]:] + tok.encode(" done").ids
    assert lever.tail_stream(tok, prompt, True, 8) is None
    assert _texts(_lever(tok, prompt, 8), tok, cont) == _texts(_stock(tok, prompt), tok, cont)
    # the planted fault: without the check, the first text differs from vLLM's (vLLM issue #48853)
    assert _texts(_lever(tok, prompt, 8, guard=False), tok, cont) != _texts(_stock(tok, prompt), tok, cont)


def test_a_tail_of_special_tokens_only_keeps_vllms_stream_and_the_unguarded_tail_differs():
    """Metaspace strips the decode's first leading space: with a tail that decodes to nothing (here the byte
    tokens, special in this tokenizer), the first new token would become the decode's first."""
    tok = _metaspace()
    words = tok.encode("The quick brown fox").ids
    special = [tok.token_to_id("<0x%02X>" % b) for b in (0xF0, 0x9F, 0x99, 0x82, 0x41, 0x42, 0x43, 0x44)]
    prompt, cont = words + special, tok.encode("▁jumps over").ids
    assert tok.decode(prompt[-8:], skip_special_tokens=True) == ""
    assert lever.tail_stream(tok, prompt, True, 8) is None
    assert _texts(_lever(tok, prompt, 8, guard=False), tok, cont) != _texts(_stock(tok, prompt), tok, cont)


def test_short_prompts_and_no_tail_keep_vllms_stream():
    tok = _byte_level()
    assert lever.tail_stream(tok, [1, 2, 3], True, 8) is None
    assert lever.tail_stream(tok, [], True, 8) is None
    assert lever.tail_stream(tok, list(range(50)), True, 0) is None
