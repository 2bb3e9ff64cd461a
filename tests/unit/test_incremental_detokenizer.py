"""patches/incremental_detokenizer.py's wrapper on a stand-in detokenizer (the narrow logic: when it rebuilds
the stream, with what, and that every failure keeps vLLM's stream).  Through vLLM's own FastIncrementalDetokenizer
on each CI release: tests/real/test_detok_tail.py."""

import logging
from types import SimpleNamespace

import pytest

from xlkv_autopatch import prompt_tail
from xlkv_autopatch.patches import incremental_detokenizer as detok


class Stream:
    """Stands in for tokenizers' DecodeStream: remembers how it was built."""

    def __init__(self, ids=None, skip_special_tokens=True):
        self.ids, self.skip = ids, skip_special_tokens


class Tokenizer:
    """Stands in for tokenizers' Tokenizer: ids below ``bytes_below`` (at most 256) are the byte-fallback
    pieces, ids in ``special`` special tokens; every decode gives ``text``."""

    def __init__(self, text="word", fail=False, bytes_below=0, special=()):
        self.text, self.fail, self.calls = text, fail, []
        self.bytes_below, self.special, self.added_reads, self.piece_reads = bytes_below, set(special), 0, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls.append((list(ids), skip_special_tokens))
        if self.fail:
            raise RuntimeError("decode failed")
        return self.text

    def id_to_token(self, i):
        return "<0x%02X>" % (i % 256) if i < self.bytes_below else "piece%d" % i

    def token_to_id(self, text):
        self.piece_reads += 1
        return {"<0x%02X>" % b: b for b in range(min(256, self.bytes_below))}.get(text)

    def get_added_tokens_decoder(self):
        self.added_reads += 1
        return {i: SimpleNamespace(special=True) for i in self.special}


class Detok:
    """vLLM's __init__, as far as the wrapper relies on it: tokenizer, skip_special_tokens, the whole-prompt stream."""

    def __init__(self, tokenizer, request):
        self.tokenizer = tokenizer
        self.skip_special_tokens = request.sampling_params.skip_special_tokens
        self.stream = Stream(ids=request.prompt_token_ids, skip_special_tokens=self.skip_special_tokens)


def make(prompt, tok=None, skip=True, **kw):
    tok = tok or Tokenizer()
    req = SimpleNamespace(prompt_token_ids=prompt, sampling_params=SimpleNamespace(skip_special_tokens=skip))
    inst = Detok.__new__(Detok)
    args = (tok, req) if not kw.get("by_name") else ()
    kwargs = {} if not kw.get("by_name") else {"tokenizer": tok, "request": req}
    detok.init_wrapper(lambda *a, **k: Detok.__init__(inst, *a, **k), inst, args, kwargs)
    return inst, tok


@pytest.fixture
def counts(monkeypatch):
    monkeypatch.setattr(detok, "COUNTS", {"tail": 0, "kept": 0, "error": 0})
    return detok.COUNTS


def test_off_keeps_vllms_stream_and_decodes_nothing(monkeypatch, counts):
    monkeypatch.delenv("XLKV_DETOK_TAIL", raising=False)
    inst, tok = make(list(range(1000)))
    assert inst.stream.ids == list(range(1000)) and tok.calls == [] and counts == {"tail": 0, "kept": 0, "error": 0}


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("by_name", [False, True])
def test_on_rebuilds_the_stream_from_the_tail_with_vllms_class_and_skip(monkeypatch, counts, skip, by_name):
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    inst, tok = make(list(range(1000)), skip=skip, by_name=by_name)
    want = list(range(1000 - prompt_tail.TAIL_IDS, 1000))
    assert type(inst.stream) is Stream and inst.stream.ids == want and inst.stream.skip is skip
    assert tok.calls == [(want, skip)] and counts["tail"] == 1


@pytest.mark.parametrize("prompt,text", [(list(range(prompt_tail.TAIL_IDS)), "word"),   # nothing to shorten
                                         (None, "word"),                               # prompt embeddings
                                         (list(range(500)), ""),                       # special tokens only
                                         (list(range(500)), "cut \ufffd")])            # ends inside a character
def test_where_the_tail_could_change_a_character_vllms_stream_stays(monkeypatch, counts, prompt, text):
    monkeypatch.setenv("XLKV_DETOK_TAIL", "1")
    inst, _ = make(prompt, Tokenizer(text=text))
    assert inst.stream.ids == prompt and counts["kept"] == 1 and counts["tail"] == 0


def test_an_error_keeps_vllms_stream_and_warns_once(monkeypatch, counts, caplog):
    monkeypatch.setenv("XLKV_DETOK_TAIL", "on")
    monkeypatch.setattr("xlkv_autopatch.logs._seen", set())
    with caplog.at_level(logging.WARNING, logger="vllm.xlkv_autopatch"):
        for _ in range(3):
            inst, _ = make(list(range(500)), Tokenizer(fail=True))
            assert inst.stream.ids == list(range(500))
    assert counts["error"] == 3
    warned = [r for r in caplog.records if "XLKV_DETOK_TAIL kept vLLM's whole-prompt" in r.getMessage()]
    assert len(warned) == 1 and "RuntimeError: decode failed" in warned[0].getMessage()


def test_vllms_own_error_propagates_untouched(monkeypatch, counts):
    """An error in vLLM's __init__ is vLLM's: the wrapper neither hides it nor counts it."""
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")

    def boom(*a, **k):
        raise ValueError("vLLM's own")
    with pytest.raises(ValueError, match="vLLM's own"):
        detok.init_wrapper(boom, object(), (Tokenizer(), None), {})
    assert counts == {"tail": 0, "kept": 0, "error": 0}


@pytest.mark.parametrize("skip", [True, False])
def test_a_run_of_byte_pieces_and_skipped_specials_across_the_tail_moves_its_start_back(monkeypatch, counts, skip):
    """ids 0-255 are byte pieces, 300-309 special: the 64-id tail starts at special 306, inside the run
    100..255, 300..309 (byte pieces, then specials that join it when skipped); with skip_special_tokens it
    starts where the run does, without it the specials end the run and the 64 ids stay."""
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    prompt = list(range(0, 100, 2)) + [1000] + list(range(100, 256)) + list(range(300, 310)) + list(range(400, 460))
    tok = Tokenizer(bytes_below=256, special=range(300, 310))
    inst, _ = make(prompt, tok, skip=skip)
    start = prompt.index(100) if skip else len(prompt) - 64
    assert inst.stream.ids == prompt[start:] and counts["tail"] == 1, (len(inst.stream.ids), start)


def test_a_run_reaching_the_prompts_start_keeps_vllms_stream(monkeypatch, counts):
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    inst, tok = make(list(range(200)), Tokenizer(bytes_below=256))
    assert inst.stream.ids == list(range(200)) and counts["kept"] == 1 and tok.calls == []


def test_the_byte_pieces_and_special_tokens_are_read_once_per_tokenizer_and_skip(monkeypatch, counts):
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    tok = Tokenizer(special=[5])
    for _ in range(3):
        make(list(range(1000)), tok)
    make(list(range(1000)), tok, skip=False)
    assert tok.added_reads == 1 and tok.piece_reads == 2 * 512 and counts["tail"] == 4
