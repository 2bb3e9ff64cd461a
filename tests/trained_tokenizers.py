"""Tokenizers trained by the tests (no model hub here): a byte-level BPE, whose pieces split multi-byte
characters, and a SentencePiece-like BPE (Metaspace, byte fallback, the 256 byte tokens special, a decoder
that strips the first leading space).  Standard library and ``tokenizers`` only: tests/unit/test_prompt_tail.py
imports it, and tests/real/test_detok_tail.py runs it inside each vLLM environment."""

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = ("The quick brown fox jumps over the lazy dog. Überraschung! naïve café, 東京都の天気は晴れです。"
         "我们今天去公园散步。🙂🚀🌶️ emoji runs 😀😃😄 and ÅÄÖ åäö, Ελληνικά κείμενα, русский текст.").split()
#: 3000 of those words in a seeded random order: long enough for prompts of a few hundred ids anywhere
_rng = random.Random(0)
TEXT = " ".join(_rng.choice(WORDS) for _ in range(3000))
del _rng


def byte_level():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=400,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def metaspace():
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator([TEXT[:300]], trainers.BpeTrainer(vocab_size=600,
                                                              special_tokens=["<0x%02X>" % i for i in range(256)]))
    return tok


TOKENIZERS = {"byte-level": byte_level, "metaspace": metaspace}
