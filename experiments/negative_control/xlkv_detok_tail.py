"""A lab lever (EXPERIMENTS ONLY, issue 41): vLLM's first-token detokenizer primed with the prompt's tail.

Why: since vLLM PR #34217 (every release here from 0.21.0 on; 0.14.1 primed 4-24 tokens)
``FastIncrementalDetokenizer`` builds its ``tokenizers`` DecodeStream with the *whole* prompt
(``DecodeStream(ids=request.prompt_token_ids)``), and the stream decodes that prefix on its first
``step()``: when the first generated token reaches the API server.  That is O(prompt length) on
the TTFT path of every request, paid by P for its answer and by D for its first token
(found in a profile of vLLM 0.29.0's API server on CPU, 373 of 524 samples in that step at 10240 prompt
tokens: experiments/results/2026-11-27-api-server-profile-cpu-0.29.0.txt; measured:
2026-11-27-detok-prime-cpu-0.29.0.json; upstream PRs #51281 and #57330, open, cap it).

How: armed by this folder's sitecustomize.py when ``XLKV_LAB_DETOK_TAIL=<n>`` is set (the lab's
``shim-detok`` config).  After vLLM's own ``__init__`` ran, the stream is rebuilt with the last ``n``
prompt ids, but only where that cannot change a byte: the prompt is longer than ``n``, the tail's text
is not empty (a tail of special tokens only would make the first new token the decode's first, and
decoders strip its leading space) and does not end inside a UTF-8 character (such a prompt keeps
vLLM's stream, whatever vLLM does with it: vLLM issue #48853).  Every later step is vLLM's.  Nothing else is touched.

The text it gives equals vLLM's: tests/experiments/test_detok_tail.py compares both, token by
token, on a byte-level BPE and a Metaspace (SentencePiece-like) BPE trained there, with prompts cut
inside multi-byte characters; probes/detok_prime_cpu.py compares the answers of a real vLLM server with
the lab's word tokenizer.
"""

import os
import sys

ENV = "XLKV_LAB_DETOK_TAIL"
MODULE = "vllm.v1.engine.detokenizer"
MARK = "_xlkv_detok_tail"
REPLACEMENT = "\ufffd"


def tail_stream(tokenizer, prompt_ids, skip_special_tokens, n):
    """A DecodeStream primed with the last ``n`` of ``prompt_ids``, or None where the whole prompt
    must stay (too short; the tail's text empty or ending inside a character)."""
    from tokenizers.decoders import DecodeStream

    if not prompt_ids or n <= 0 or len(prompt_ids) <= n:
        return None
    tail = list(prompt_ids[-n:])
    text = tokenizer.decode(tail, skip_special_tokens=skip_special_tokens)
    # an empty tail text (special tokens only) would make the first new token the decode's first, whose
    # leading space decoders strip; a tail text ending inside a character is decoded differently by vLLM
    if not text or text.endswith(REPLACEMENT):
        return None
    return DecodeStream(ids=tail, skip_special_tokens=skip_special_tokens)


def _init_wrapper(n):
    def wrapper(wrapped, instance, args, kwargs):
        wrapped(*args, **kwargs)
        try:
            request = args[1] if len(args) > 1 else kwargs.get("request")
            stream = tail_stream(instance.tokenizer, request.prompt_token_ids,
                                 instance.skip_special_tokens, n)
        except Exception as e:  # noqa: BLE001 - the lever never stops vLLM: vLLM's stream stays
            sys.stderr.write("xlkv detok tail: kept vLLM's stream (%s: %s)\n" % (type(e).__name__, e))
            return
        if stream is not None:
            instance.stream = stream
    return wrapper


def _patch(module, n):
    import wrapt

    cls = getattr(module, "FastIncrementalDetokenizer", None)
    if cls is None or getattr(cls, MARK, False):
        return False
    cls.__init__ = wrapt.FunctionWrapper(cls.__init__, _init_wrapper(n))
    setattr(cls, MARK, n)
    return True


def install():
    """Register the wrapper for vLLM's detokenizer module (once per process); False when not armed."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return False
    n = int(value)
    import wrapt

    def hook(module):
        try:
            if _patch(module, n):
                sys.stderr.write("xlkv detok tail: FastIncrementalDetokenizer primed with the last %d prompt ids "
                                 "(lab lever)\n" % n)
        except Exception as e:  # noqa: BLE001 - say it; the run is then vLLM's own
            sys.stderr.write("xlkv detok tail: not installed (%s: %s)\n" % (type(e).__name__, e))

    wrapt.register_post_import_hook(hook, MODULE)
    return True
