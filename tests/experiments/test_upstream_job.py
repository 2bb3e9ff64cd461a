"""The lab's upstream job (pdtools/job_upstream.py) on this machine: ``run`` starts the stock, the
flag-on and the switches runs of experiments/upstream/upstream_tests.py side by side (processes, as on a GPU machine), then
merges and compares their result files by calling the tool's functions (no output parsed).

A stand-in Python answers the tool's ``PY -m pytest ...`` by writing what the probe plugin writes; the
release's test tree is laid in the job's cache beforehand, so nothing is fetched."""

import json
import os
import re
import sys

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
from pdtools import job_upstream  # noqa: E402
from pdtools.settings import Settings  # noqa: E402

FAKE_PYTEST = """#!/bin/sh
# stand-in for `python -m pytest -p xlkv_upstream_probe ...`: the probe's file, by XLKV_UPSTREAM_MODE
b=passed
[ "$XLKV_UPSTREAM_MODE" = on ] && b=${FAKE_ON_B:-passed}
groups='[]'
[ "$XLKV_UPSTREAM_MODE" = on ] && groups='["layout-0.29"]'
[ "$XLKV_UPSTREAM_MODE" = switches ] && groups='["detok-0.17", "layout-0.29"]'
printf '{"mode": "%s", "exitstatus": 0, "outcomes": {"t.py::a": "passed", "t.py::b": "%s"},
 "shim": {"imported": false, "installed": false, "applied_groups": %s}}' "$XLKV_UPSTREAM_MODE" "$b" "$groups" \\
  > "$XLKV_UPSTREAM_OUT"
"""


def _settings(tmp_path, **extra):
    up = tmp_path / "up"
    tree = up / "trees" / "vllm-0.33.0"
    (tree / "tests" / "v1" / "kv_connector" / "unit").mkdir(parents=True, exist_ok=True)
    (tree / "tests" / "v1" / "kv_connector" / "unit" / "test_nixl_fake.py").write_text("def test_a():\n    pass\n")
    (tree / ".xlkv-ok").write_text("0.33.0 fake\n")
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTEST)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "XLKV_UPSTREAM_CACHE")}
    env.update(UP=str(up), OUT=str(tmp_path / "out"), UPSTREAM_PYTHON=str(fake), SITE=str(tmp_path / "site"), **extra)
    return Settings.read(env)


def test_run_merges_and_compares_the_modes_by_function(tmp_path, capsys):
    rc = job_upstream.run(_settings(tmp_path), "0.33.0", "1xTEST", "1")
    out = capsys.readouterr().out
    assert rc == 0, out
    res = json.loads((tmp_path / "out" / "upstream-tests-0.33.0-1xTEST.json").read_text())
    assert set(res["modes"]) == {"stock", "on", "switches"} and res["differ"] == []   # the default modes
    assert res["modes"]["on"]["passed"] == res["modes"]["switches"]["passed"] == 2 and len(res["calls"]) == 3
    assert "0 differences, 0 unexplained" in out          # compare's own report, on the job's console
    assert {f for f in os.listdir(tmp_path / "out") if f.startswith("console-")} == {
        "console-0.33.0-stock.txt", "console-0.33.0-on.txt", "console-0.33.0-switches.txt"}


def test_run_fails_on_a_difference_compare_does_not_explain(tmp_path, capsys):
    rc = job_upstream.run(_settings(tmp_path, FAKE_ON_B="failed"), "0.33.0", "1xTEST", "1")
    out = capsys.readouterr().out
    assert rc == 1 and "DIFFERS (on): t.py::b  stock=passed on=failed  UNEXPLAINED" in out
    res = json.loads((tmp_path / "out" / "upstream-tests-0.33.0-1xTEST.json").read_text())
    assert [d["test"] for d in res["differ"]] == ["t.py::b"]


def test_the_job_parses_no_output_of_the_tool():
    """fetch, merge and compare are the tool's functions (their values); only the mode runs are processes."""
    src = open(job_upstream.__file__).read()
    uses = [line.strip() for line in src.splitlines() if re.search(r"\bTOOL\b", line)]
    assert [u for u in uses if not u.startswith(("TOOL = ", "spec = importlib.util.spec_from_file_location(",
                                                 'cmd = [sys.executable, TOOL, "run"'))] == [], uses
    tool = job_upstream.upstream_tests()
    assert all(callable(getattr(tool, f)) for f in ("fetch", "merge", "compare", "cache_root"))
    assert tool.cache_root({"XLKV_UPSTREAM_CACHE": "/x"}) == "/x"
    assert tool.cache_root({"XLKV_ENVS": "/e"}) == "/e/upstream-tests"
