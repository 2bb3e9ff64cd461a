"""xlkv_autopatch.prompt_tail, the pure logic of the XLKV_DETOK_TAIL switch: a decode stream
primed with the prompt's last n ids instead of the whole prompt must give the same text, token by token,
as the whole-prompt priming vLLM 0.17+ does.  Real `tokenizers` DecodeStreams on tokenizers trained
by tests/trained_tokenizers.py: a byte-level BPE (multi-byte characters split across tokens) and a Metaspace BPE with byte
fallback (SentencePiece-like); prompts cut anywhere, inside characters too; special tokens skipped and
kept.  Planted faults (the tail without its checks) must differ.  Through vLLM's own detokenizer:
tests/real/test_detok_tail.py."""

import os
import random
import sys

import pytest

from xlkv_autopatch import prompt_tail

tokenizers = pytest.importorskip("tokenizers")
from tokenizers.decoders import DecodeStream  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import trained_tokenizers  # noqa: E402  (tests/trained_tokenizers.py)


class _Lever:
    """The switch's use of prompt_tail: a stream primed with the tail, or None (the whole prompt stays)."""

    @staticmethod
    def tail_stream(tok, prompt, skip, n):
        ids = prompt_tail.tail(prompt, lambda part: tok.decode(part, skip_special_tokens=skip), n)
        return None if ids is None else DecodeStream(ids=ids, skip_special_tokens=skip)


lever = _Lever()

TEXT = trained_tokenizers.TEXT
_byte_level, _metaspace = trained_tokenizers.byte_level, trained_tokenizers.metaspace
TOKENIZERS = trained_tokenizers.TOKENIZERS


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


def _texts(stream, tok, cont, skip=True):
    """Each new token's text, stepped as vLLM's _protected_step does: an id the tokenizer rejects
    (OverflowError, TypeError) gives no text; a tokenizer whose text before the new token changes ("Invalid
    prefix encountered", here: byte-fallback tokens kept as special tokens) resets the stream without any
    prompt, and the step is repeated."""
    out = []
    for t in cont:
        try:
            out.append(stream.step(tok, t))
        except (OverflowError, TypeError):
            out.append(None)
        except Exception as e:  # noqa: BLE001 - vLLM's own recovery, modelled
            if not str(e).startswith("Invalid prefix encountered"):
                raise
            stream = DecodeStream(skip_special_tokens=skip)
            out.append(("reset", stream.step(tok, t)))
    return out


def _stock(tok, prompt, skip=True):
    return DecodeStream(ids=prompt, skip_special_tokens=skip)


def _lever(tok, prompt, n, guard=True, skip=True):
    if guard:
        s = lever.tail_stream(tok, prompt, skip, n)
    else:   # the planted fault: no check of the tail's text (empty, or ending inside a character)
        s = DecodeStream(ids=prompt[-n:], skip_special_tokens=skip) if len(prompt) > n else None
    return s or _stock(tok, prompt, skip)


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@pytest.mark.parametrize("n", [3, 8, prompt_tail.TAIL_IDS])
def test_the_tail_gives_vllms_text_token_by_token(name, n, skip):
    tok = TOKENIZERS[name]()
    used = 0
    for prompt, cont in _cases(tok, seed=n):
        want = _texts(_stock(tok, prompt, skip), tok, cont, skip)
        s = lever.tail_stream(tok, prompt, skip, n)
        used += s is not None
        assert _texts(s or _stock(tok, prompt, skip), tok, cont, skip) == want, (name, n, prompt[-n:], cont)
    assert used >= 10, used          # the tail was taken in many cases, not only the fallback


def test_the_unguarded_tail_differs_somewhere_in_the_same_cases():
    """The comparison above has teeth: over the same random cuts (byte-level, 3 ids), the tail without its
    checks gives another text than the whole prompt in at least one case."""
    tok = _byte_level()
    differ = sum(_texts(_lever(tok, p, 3, guard=False), tok, c) != _texts(_stock(tok, p), tok, c)
                 for p, c in _cases(tok, seed=3))
    assert differ >= 1, differ


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


def test_short_prompts_no_prompt_ids_and_no_tail_keep_vllms_stream():
    tok = _byte_level()
    assert lever.tail_stream(tok, [1, 2, 3], True, 8) is None
    assert lever.tail_stream(tok, [], True, 8) is None
    assert lever.tail_stream(tok, None, True, 8) is None          # prompt embeddings: no ids
    assert lever.tail_stream(tok, list(range(50)), True, 0) is None
    assert prompt_tail.tail(list(range(64)), lambda ids: "x") is None   # 64 ids: nothing to shorten
    assert prompt_tail.tail(list(range(65)), lambda ids: "x") == list(range(1, 65))


def test_tail_is_pure_and_decodes_the_tail_only():
    seen = []
    got = prompt_tail.tail(tuple(range(100)), lambda ids: seen.append(ids) or "text", n=5)
    assert got == [95, 96, 97, 98, 99] and seen == [[95, 96, 97, 98, 99]]
    assert prompt_tail.tail(list(range(100)), lambda ids: "ends cut \ufffd", n=5) is None
    assert prompt_tail.tail(list(range(100)), lambda ids: "", n=5) is None


# --- Real vocabularies shipped in PyPI packages (tests/real_vocabularies.py): SentencePiece byte fallback
# (Mistral v1, v3), byte-level BPE (DeepSeek-V4, Qwen3.6, Tekken).  A byte-fallback decoder turns a run of
# byte pieces into text as a whole (invalid UTF-8: one U+FFFD per byte), and skipped special tokens do not
# end the run, so the tail must not start inside one.

import real_vocabularies  # noqa: E402  (tests/real_vocabularies.py)


@pytest.fixture(scope="module")
def vocab():
    made = {}

    def get(name):
        if name not in made:
            made[name] = real_vocabularies.material(name)
        return made[name]
    return get


def _switch(tok, prompt, skip, joins=True):
    """The switch's stream for a real tokenizer, as patches/incremental_detokenizer.py builds it (None: vLLM's);
    joins=False is the planted fault: the tail without its run extension."""
    joining = prompt_tail.byte_pieces(tok.token_to_id)
    if skip:
        joining |= frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    ids = prompt_tail.tail(prompt, lambda part: tok.decode(part, skip_special_tokens=skip),
                           joins=prompt_tail.joining_ids(joining, tok.id_to_token) if joins else None)
    return None if ids is None else DecodeStream(ids=ids, skip_special_tokens=skip)


def _differences(tok, sample, rare, skip, seed, count, joins=True):
    rng, differ, used = random.Random(seed), [], 0
    for prompt, cont in real_vocabularies.cases(tok, sample, rare, rng, count):
        s = _switch(tok, prompt, skip, joins)
        used += s is not None
        if _texts(s or _stock(tok, prompt, skip), tok, cont, skip) != _texts(_stock(tok, prompt, skip), tok,
                                                                                          cont, skip):
            differ.append((prompt, cont))
    return differ, used


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("name", real_vocabularies.NAMES)
def test_real_vocabularies_the_switch_gives_vllms_text(vocab, name, skip):
    differ, used = _differences(*vocab(name), skip, seed=1, count=400)
    assert differ == [], (name, len(differ), differ[0])
    assert used >= 150, used          # the tail was taken for many of them, not only vLLM's priming


def test_real_sentencepiece_vocabularies_the_tail_without_its_run_extension_differs(vocab):
    """Teeth: the same fuzz with the tail cut at 64 ids whatever the run (the switch of shim 0.9.3) gives
    another text somewhere on each SentencePiece byte-fallback vocabulary."""
    for name in real_vocabularies.SENTENCEPIECE:
        differ, _ = _differences(*vocab(name), True, seed=1, count=400, joins=False)
        assert len(differ) >= 1, name


def test_the_three_byte_run_reproducers_give_vllms_text_and_the_unextended_tail_does_not(vocab):
    tok, encode = real_vocabularies.load("mistral-v3")
    assert [tok.token_to_id(p) for p in ("<0xE4>", "<0xC3>", "<0xA9>")] == [999, 966, 940]   # the ids reported
    for what, (prompt, cont, skip) in real_vocabularies.reproducers(tok, encode).items():
        stock = _texts(_stock(tok, prompt, skip), tok, cont, skip)
        assert stock[0] is not None and stock[0].startswith("Hello world\ufffd"), (what, stock)   # vLLM #48853
        assert _switch(tok, prompt, skip) is None, what             # the run reaches into the tail: vLLM's stream
        unextended = _switch(tok, prompt, skip, joins=False)
        assert unextended is not None and _texts(unextended, tok, cont, skip) != stock, what


def test_a_run_longer_than_max_run_keeps_the_whole_prompt_after_max_run_lookups():
    """A prompt spelled in byte pieces is one run: the walk back stops after MAX_RUN ids and keeps vLLM's
    stream (decoding nothing); a run that ends within MAX_RUN gives the tail from its start."""
    asked = []

    def joins(i):
        asked.append(i)
        return i < 256
    long_run = [1000] + [7] * (prompt_tail.MAX_RUN + 500) + [8] * 64
    assert prompt_tail.tail(long_run, lambda ids: pytest.fail("decoded"), joins=joins) is None
    assert len(asked) <= 2 * prompt_tail.MAX_RUN + 4, len(asked)
    short_run = [1000] * 50 + [7] * (prompt_tail.MAX_RUN - 100) + [8] * 64
    got = prompt_tail.tail(short_run, lambda ids: "text", joins=joins)
    assert got == short_run[50:], len(got)
