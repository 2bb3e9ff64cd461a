"""Deterministic word-level prompts (w2 .. w31999): same (length, seed) -> same ids, everywhere."""

VOCAB_LO, VOCAB_HI = 2, 31999  # inclusive; ids 0/1 are <unk>/<eos>
MASK64 = (1 << 64) - 1


def _mix64(x):
    """SplitMix64 finaliser: a fixed, platform-independent integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def prompt_ids(n_tokens, seed=0):
    """Token ids of a prompt of ``n_tokens`` words; same (n, seed) -> same ids, everywhere."""
    if n_tokens < 1:
        raise ValueError("a prompt needs at least one token")
    span = VOCAB_HI - VOCAB_LO + 1
    base = _mix64(seed * 1_000_003 + n_tokens)
    return [VOCAB_LO + _mix64(base + i) % span for i in range(n_tokens)]


def prompt_text(n_tokens, seed=0):
    """The prompt as text: ``"w123 w4567 ..."``; the word-level tokenizer maps word k to id k."""
    return " ".join("w%d" % i for i in prompt_ids(n_tokens, seed))


DEFAULT_EQ_LENGTHS = (5, 17, 100, 1000, 2049, 4097)
