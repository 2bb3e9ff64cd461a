import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True)
def _no_flag_from_the_shell(monkeypatch):
    """A developer's shell must not activate the shim inside the test process."""
    monkeypatch.delenv("ENABLE_XLKV", raising=False)
    monkeypatch.delenv("XLKV_VLLM_VERSION", raising=False)
