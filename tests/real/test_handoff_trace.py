"""The lab's handoff trace (experiments/negative_control/xlkv_handoff_trace.py) on
real vLLM + NIXL, on the newest CI release (0.33.0; XLKV_TEST_EVERYWHERE=1: every release): armed through the negative-control folder's sitecustomize as
pdtools/pair.py arms it (HANDOFF_TRACE=1), it wraps every KV-connector method the release's
NixlConnector has, changes no byte the harness moves, and writes the worker-side events of every
request in the order a read goes through.  The scheduler-side events need vLLM's engine core (the
harness has none): here only that the trace wraps vLLM's real Scheduler;
tests/experiments/test_handoff.py checks the events on a stand-in;
experiments/probes/engine_pd_cpu.py on two real engines on CPU (0.21.0, 0.29.0; not in CI); the GPU runs
on the real one (experiments/results/*handoff*)."""

import glob
import json
import os

import pytest

from conftest import ROOT, harness, once_per_session, release_of, run_in

NC_DIR = os.path.join(ROOT, "experiments", "negative_control")
SCHED = "vllm.v1.core.sched.scheduler"
#: the KV connector API's methods the trace wraps, and the releases that lack one
ALWAYS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
          "update_connector_output", "request_finished", "start_load_kv", "get_finished")


def _traced(vllm_env, tmp_path, name, extra_env=None):
    folder = tmp_path / "trace"
    env = dict(PYTHONPATH=NC_DIR, XLKV_TRACE_HANDOFF=str(folder), **(extra_env or {}))
    res = harness(vllm_env[1], tmp_path, name, env=env)
    lines = []
    for path in sorted(glob.glob(str(folder / "trace-*.jsonl"))):
        with open(path) as f:
            lines += [json.loads(x) for x in f if x.strip()]
    return res, lines


def _check(vllm_env, res, lines):
    assert res["errors"] == [] and res["transfer_verified"] is True, res["errors"]
    assert "handoff trace: not installed" not in res["_log"] and "FAILED to arm" not in res["_log"], res["_log"][-3000:]
    installed = [x for x in lines if x["ev"] == "installed" and x["module"] != SCHED]
    assert len(installed) == 2, installed  # P's rank and D's rank
    # where a process imports vLLM's Scheduler, both methods the first-token events need are on it
    for x in (x for x in lines if x["ev"] == "installed" and x["module"] == SCHED):
        assert x["wrapped"] == ["schedule", "update_from_output"] and x["missing"] == [], x
    for x in installed:
        assert set(ALWAYS) <= set(x["wrapped"]), x
        assert set(x["missing"]) <= {"request_finished_all_groups", "get_transfer_results"}, x
    if release_of(vllm_env) >= (0, 20):
        assert "request_finished_all_groups" in installed[0]["wrapped"], installed[0]
    d_engine = {x["engine"] for x in lines if x["ev"] == "read_start"}
    assert len(d_engine) == 1, d_engine
    assert res["cases"]
    for name, case in res["cases"].items():
        req = case["req"]
        seq = sorted((x for x in lines if x.get("req") == req and x.get("engine") in d_engine), key=lambda x: x["t"])
        assert [x["ev"] for x in seq] == ["read_start", "read_posted", "recv_done"], (name, seq)
        sent = [x for x in lines if x.get("req") == req and x["ev"] == "send_done"]
        assert len(sent) == 1 and sent[0]["engine"] not in d_engine, (name, sent)


def test_trace_wraps_every_connector_method_and_moves_the_same_bytes(vllm_env, tmp_path):
    once_per_session(vllm_env, "an experiments tool, used on GPUs with 0.21+")
    res, lines = _traced(vllm_env, tmp_path, "traced")
    _check(vllm_env, res, lines)


def test_trace_beside_the_shim(vllm_env, tmp_path):
    once_per_session(vllm_env, "the trace's wrappers beside the shim's are the same on every release")
    res, lines = _traced(vllm_env, tmp_path, "traced-xlkv", {"ENABLE_XLKV": "true"})
    assert res["cross_layer"] is True, res
    _check(vllm_env, res, lines)


def test_trace_wraps_vllms_scheduler(vllm_env, tmp_path):
    """The first-token events (first_run, first_out) wrap vLLM's own Scheduler.schedule and update_from_output,
    on the newest release: the harness above imports the Scheduler on 0.33.0 only, so this imports it
    itself."""
    once_per_session(vllm_env, "an experiments tool, used on GPUs with 0.21+")
    folder = tmp_path / "trace"
    code = ("import vllm.v1.core.sched.scheduler as m; "
            "print(' '.join(type(vars(m.Scheduler)[a]).__name__ for a in ('schedule', 'update_from_output')))")
    r = run_in(vllm_env[1], ["-c", code], env={"PYTHONPATH": NC_DIR, "XLKV_TRACE_HANDOFF": str(folder)}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-2:] == ["FunctionWrapper", "FunctionWrapper"], r.stdout[-500:]
    lines = [json.loads(x) for path in glob.glob(str(folder / "trace-*.jsonl")) for x in open(path) if x.strip()]
    [mine] = [x for x in lines if x["ev"] == "installed" and x["module"] == SCHED]
    assert mine["wrapped"] == ["schedule", "update_from_output"] and mine["missing"] == [], mine
