"""experiments/upstream/upstream_tests.py fetch without network: two callers at once on an empty
cache (the CI test runs the stock and flag-on modes side by side) get one tree, and the tree
the first caller got is not replaced under it (2026-11-24, fresh machine: the second fetch
removed the first's working directory and both modes failed)."""
import importlib.util
import io
import os
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "experiments" / "upstream" / "upstream_tests.py"


def _load():
    spec = importlib.util.spec_from_file_location("upstream_tests_fetch", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_concurrent_fetches_share_one_tree_and_never_replace_it(tmp_path, monkeypatch):
    up = _load()
    monkeypatch.setenv("XLKV_UPSTREAM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(up.RELEASES, "9.9.9", "fake-sha")
    downloads = []

    def fake_download(release, dest):      # a tiny sdist, slow enough for both callers to overlap
        downloads.append(release)
        time.sleep(0.5)
        path = os.path.join(dest, "vllm-%s.tar.gz" % release)
        with tarfile.open(path, "w:gz") as tar:
            data = b"def test_x():\n    pass\n"
            info = tarfile.TarInfo("vllm-%s/tests/v1/kv_connector/unit/test_nixl_fake.py" % release)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return path, "fake-sha"

    monkeypatch.setattr(up, "_download_sdist", fake_download)
    got, marks = [], []

    def caller(i):
        tree = up.fetch("9.9.9")
        mark = os.path.join(tree, "caller-%d-was-here" % i)   # the first caller's cwd must survive
        open(mark, "w").close()
        got.append(tree)
        marks.append(mark)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 2 and got[0] == got[1]
    assert downloads == ["9.9.9"]                              # the second caller waited, then reused
    assert all(os.path.exists(m) for m in marks)              # nobody's tree was replaced
    assert os.path.isfile(os.path.join(got[0], "tests", "v1", "kv_connector", "unit", "test_nixl_fake.py"))


def test_modes_set_the_flag_and_switches_they_name(monkeypatch, tmp_path):
    """The environment of each mode: only ``switches`` turns the switch knobs on (a value the caller set is
    dropped elsewhere, so an ``on`` run is never a switches run in disguise); ``on`` and ``switches`` set the
    flag; a ``switches`` run in which no NIXL patch set was applied is refused like an ``on`` run."""
    up = _load()
    assert up.switches() == ("XLKV_DETOK_TAIL",)
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    monkeypatch.setenv("ENABLE_XLKV", "true")
    env = {m: up._env(str(tmp_path), m, "out.json", None) for m in up.MODES}
    assert [m for m in up.MODES if env[m].get("XLKV_DETOK_TAIL") == "true"] == ["switches"]
    assert [m for m in up.MODES if env[m].get("ENABLE_XLKV") == "true"] == ["on", "switches"]
    assert "XLKV_DETOK_TAIL" not in env["on"] and "XLKV_DETOK_TAIL" not in env["stock"]
    assert up._check_shim("switches", {"applied_groups": ["guard", "detok-0.17"]})   # no NIXL set: refused
    assert up._check_shim("switches", {"applied_groups": ["guard", "detok-0.17", "layout-0.29"]}) is None
    result = {"release": "0.33.0", "modes": {"stock": {"outcomes": {"t": "passed"}},
                                             "switches": {"outcomes": {"t": "failed"}}}}
    assert [(d["mode"], d["test"]) for d in up.differences(result)] == [("switches", "t")]
