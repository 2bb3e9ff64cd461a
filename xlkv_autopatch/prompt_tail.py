"""Which prompt ids an incremental detokenizer needs before the first new token: the pure logic of
the XLKV_DETOK_TAIL switch (patches/incremental_detokenizer.py).  Standard library only: the caller
passes the decode function (no vLLM, no ``tokenizers`` import here).

An incremental decode stream primed with prompt ids returns, for each new token, the text of
(primed ids + new ids) minus the text of the primed ids.  That difference depends on the primed
ids' end only: the last few ids decide how the new token joins them (a word piece, a space, the
rest of a multi-byte character).  So a stream primed with the prompt's tail gives the same text as
one primed with the whole prompt, except where the tail's own text cannot stand for the prompt's:

* the tail decodes to nothing (special tokens only, skipped): the first new token would become the
  decode's first, and decoders strip a first token's leading space (SentencePiece's Metaspace);
* the tail's text ends inside a character (U+FFFD): a whole-prompt stream decodes that prompt
  differently (vLLM issue #48853), and the tail must not change what vLLM does there.

Either way the whole prompt stays (:func:`tail` returns None), as it does for prompts no longer
than the tail and requests without prompt ids (prompt embeddings).
"""

#: prompt ids kept before the first new token: a word piece, a byte-fallback run or a multi-byte
#: character spans far fewer ids; decoding 64 ids costs ~0.1 ms where 10240 cost 13-24 ms
TAIL_IDS = 64
#: what decoders put where a character is cut
REPLACEMENT = "\ufffd"


def tail(prompt_ids, decode, n=TAIL_IDS):
    """The last ``n`` of ``prompt_ids`` (a new list) to prime a decode stream with, or None where the
    whole prompt must stay.  ``decode(ids) -> str`` decodes as the stream will (same tokenizer, same
    skip_special_tokens)."""
    if prompt_ids is None or n <= 0 or len(prompt_ids) <= n:
        return None
    ids = list(prompt_ids[-n:])
    text = decode(ids)
    if not text or text.endswith(REPLACEMENT):
        return None
    return ids
