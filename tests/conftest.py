import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Every vLLM process the tests start inherits this: vLLM 0.29+ import humming-kernels, whose import
# starts two background builds of its CUDA launcher (each a python importing torch; they fail
# without CUDA), two extra torch imports per vLLM process on CI's 2 cores.  Its own switch.
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")


@pytest.fixture(autouse=True)
def _no_flag_from_the_shell(monkeypatch):
    """A developer's shell must not activate the shim inside the test process."""
    monkeypatch.delenv("ENABLE_XLKV", raising=False)
    monkeypatch.delenv("XLKV_VLLM_VERSION", raising=False)


#: Per-test time limits in seconds, test body only (pytest-timeout; pyproject.toml sets the default,
#: 600 s, and timeout_func_only). A test's own @pytest.mark.timeout wins. tests/real bodies start
#: vLLM ranks and NIXL through the CPU harness (each run bounded at 900 s by its own subprocess
#: time-out, a few per test); `slow` tests build wheels or virtual environments.
TIME_LIMITS = (("real", 1800), ("slow", 1200))


def pytest_collection_modifyitems(config, items):
    real = os.path.join(ROOT, "tests", "real") + os.sep
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        for what, seconds in TIME_LIMITS:
            if (str(item.fspath).startswith(real) if what == "real" else item.get_closest_marker(what)):
                item.add_marker(pytest.mark.timeout(seconds))
                break


@pytest.fixture
def stand_in_vllm(monkeypatch, tmp_path):
    """stand_in_vllm("0.33.0"): package metadata of a vLLM release on sys.path (no vLLM code), so
    that the shim's version logic and ``status --no-resolve`` see that release."""
    def lay(version):
        d = tmp_path / version / ("vllm-%s.dist-info" % version)
        d.mkdir(parents=True, exist_ok=True)
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % version)
        monkeypatch.syspath_prepend(str(tmp_path / version))
    return lay
