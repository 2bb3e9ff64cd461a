"""fake vLLM package (tests/experiments)."""
