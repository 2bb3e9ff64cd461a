"""Which prompt ids an incremental detokenizer needs before the first new token: the pure logic of
the XLKV_DETOK_TAIL switch (patches/incremental_detokenizer.py).  Standard library only: the caller
passes the tokenizer's view (decode, and which ids join their neighbours); no vLLM, no ``tokenizers``
import here.

An incremental decode stream primed with prompt ids returns, for each new token, the text of
(primed ids + new ids) minus the text of the primed ids.  That difference depends on the primed
ids' end only, where the decoder treats tokens one by one: the last few ids decide how the new token
joins them (a word piece, a space, the rest of a multi-byte character).  Two things reach further
back, and the tail is chosen so that neither crosses its first id:

* **Runs that decode as one.**  A SentencePiece byte-fallback decoder turns a run of byte pieces
  (``<0xE4>``...) into text as a whole: valid UTF-8 gives its characters, an invalid run gives one
  U+FFFD per byte.  Ids the decode drops (special tokens with ``skip_special_tokens``, ids outside the
  vocabulary) do not end a run.  A tail that starts inside such a run can decode cleanly while the
  whole prompt ends in U+FFFD, and a stream primed with it then gives another text.  So the tail
  starts at the beginning of the run its first id is in (``joins`` names those ids); a run reaching
  the prompt's first id, or longer than MAX_RUN ids, keeps the whole prompt.
* **The tail's own text.**  Where it decodes to nothing (special tokens only, skipped), the first new
  token would become the decode's first and decoders strip a first token's leading space
  (SentencePiece's Metaspace); where it ends inside a character (U+FFFD), the whole prompt ends there
  too (the run is whole), and a whole-prompt stream then returns the prompt's text with the first token
  (vLLM issue #48853): the tail must not change what vLLM does there.

Either way the whole prompt stays (:func:`tail` returns None), as it does for prompts no longer
than the tail and requests without prompt ids (prompt embeddings).
"""

#: prompt ids kept before the first new token (more where a run crosses it, see above): a word piece
#: or a multi-byte character spans far fewer ids; what decoding 64 ids instead of the whole prompt saves:
#: docs/measurements.md, "The first-token detokenizer"
TAIL_IDS = 64
#: what decoders put where a character is cut
REPLACEMENT = "\ufffd"


#: the longest run the tail is moved back over: a longer one keeps the whole prompt without walking it all
#: (a prompt in a script its vocabulary spells in byte pieces is one run from its first id)
MAX_RUN = 1024


def run_start(ids, start, joins, limit=0):
    """The index where the run that ``ids[start]`` is in begins: ``start`` moved back while both the id
    there and the one before it join (``joins(id) -> bool``), to ``limit`` at the most."""
    while start > limit and joins(ids[start]) and joins(ids[start - 1]):
        start -= 1
    return start


def tail(prompt_ids, decode, n=TAIL_IDS, joins=None):
    """The last ``n`` of ``prompt_ids`` (a new list), extended back to the start of a run that crosses
    them, to prime a decode stream with, or None where the whole prompt must stay.  ``decode(ids) -> str``
    decodes as the stream will (same tokenizer, same skip_special_tokens); ``joins(id) -> bool`` is True
    for ids that decode together with their neighbours (:func:`joining_ids`); None: no such ids."""
    if prompt_ids is None or n <= 0 or len(prompt_ids) <= n:
        return None
    start = len(prompt_ids) - n
    if joins is not None:
        limit = max(0, start - MAX_RUN)
        start = run_start(prompt_ids, start, joins, limit)
        if start == limit and (start == 0 or joins(prompt_ids[start])):   # the run may go on before it
            return None
    ids = list(prompt_ids[start:])
    text = decode(ids)
    if not text or text.endswith(REPLACEMENT):
        return None
    return ids


def byte_pieces(token_to_id):
    """The ids of a vocabulary's byte-fallback pieces ``<0x00>``...``<0xFF>`` (either case of hex digit, as
    tokenizers' ByteFallback decoder reads them); ``token_to_id(text)`` gives None where there is none."""
    found = (token_to_id(f % b) for b in range(256) for f in ("<0x%02X>", "<0x%02x>"))
    return frozenset(i for i in found if i is not None)


def joining_ids(joining, piece):
    """``joins`` for :func:`tail`: ids in ``joining`` (the byte pieces, and the special tokens where the decode
    skips them) and ids outside the vocabulary (``piece(id)`` None: the decode drops them) join their
    neighbours.  The set is looked up first, so a walk back over a long run asks ``piece`` once, at its end."""
    def joins(token_id):
        return token_id in joining or piece(token_id) is None
    return joins
