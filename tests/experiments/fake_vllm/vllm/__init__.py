"""Fake vLLM for CPU tests of the experiment scripts (not a real vLLM)."""
__version__ = "0.21.0"
