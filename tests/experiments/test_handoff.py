"""The handoff split: pdtools/handoff.py's join and parts (pure logic), and the
lab's trace hook (experiments/negative_control/xlkv_handoff_trace.py) on a stand-in NixlConnector
with the KV connector API's method names and a stand-in of vLLM's Scheduler (first_run, first_out), in a
subprocess.  The hook on real vLLM + NIXL:
tests/real/test_handoff_trace.py."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXP = os.path.join(ROOT, "experiments")
sys.path.insert(0, EXP)
from pdtools import handoff  # noqa: E402

P_ID, D_ID, RID = "cmpl-pd-1700000000000-7-0-ab12cd34", "cmpl-pd-1700000000000-7-0-99ff00ee", "pd-1700000000000-7"


def _events(t=100.0, ranks=2, p_id=P_ID, d_id=D_ID):
    ev = [dict(t=t + 0.010, ev="sched", req=p_id, side="P", engine="P0"),
          dict(t=t + 0.200, ev="finished", req=p_id, engine="P0"),
          dict(t=t + 0.230, ev="sched", req=d_id, side="D", remote=p_id, remote_engine="P0", engine="D0"),
          dict(t=t + 0.231, ev="alloc", req=d_id, engine="D0"),
          dict(t=t + 0.232, ev="meta", req=d_id, engine="D0"),
          dict(t=t + 0.260, ev="noticed_recv", req=d_id, engine="D0")]
    for r in range(ranks):
        ev += [dict(t=t + 0.240 + r * 0.001, ev="read_start", req=d_id, rank=r, engine="D0"),
               dict(t=t + 0.241 + r * 0.001, ev="read_posted", req=d_id, rank=r, engine="D0"),
               dict(t=t + 0.250 + r * 0.002, ev="recv_done", req=d_id, rank=r, engine="D0")]
    return ev


PROXY = dict(rid=RID, t_in=100.000, t_p_sent=100.001, t_p_answer=100.215, t_d_sent=100.216, t_d_first=100.300)


def test_parts_join_p_d_and_proxy_and_add_up_to_the_proxy_ttft():
    rows = handoff.split(_events(), [PROXY])
    assert len(rows) == 1
    r = rows[0]
    assert (r["d_request"], r["p_request"], r["rid"], r["ranks"], r["complete"]) == (D_ID, P_ID, RID, 2, True)
    want = dict(proxy_to_p=1, p_admission=9, p_prefill=190, p_answer=15, proxy_to_d=1, d_admission=14, d_alloc=1,
                d_dispatch=9, transfer=12, d_notice=8, d_first_token=40)
    got = {k: round(r["parts_ms"][k], 3) for k in want}
    assert got == want
    assert round(sum(got.values()), 3) == round(r["total_ms"], 3) == 300.0
    assert handoff.check(rows) == []
    s = handoff.summary(rows)
    assert s["complete"] == 1 and s["parts_ms"]["transfer"]["p50"] == 12.0


def test_p_and_d_knowing_the_request_by_one_id_stay_apart():
    """Releases before vLLM's per-engine suffix, and routers that give both sides one id: the engine keeps
    P's and D's events apart (merged, D's scheduler line would be P's)."""
    same = "cmpl-pd-1700000000000-7-0"
    rows = handoff.split(_events(p_id=same, d_id=same), [PROXY])
    assert len(rows) == 1 and rows[0]["complete"] and handoff.check(rows) == []
    assert round(rows[0]["parts_ms"]["d_alloc"], 3) == 1.0 and round(rows[0]["parts_ms"]["p_prefill"], 3) == 190.0
    no_engine = [dict(e, remote_engine=None) if e["ev"] == "sched" else e for e in _events(p_id=same, d_id=same)]
    assert round(handoff.split(no_engine, [PROXY])[0]["parts_ms"]["p_prefill"], 3) == 190.0  # by id on the other engine


def test_without_the_proxy_the_engines_alone_give_the_split_from_p_to_ds_notice():
    r = handoff.split(_events(), [])[0]
    assert r["complete"] and r["rid"] is None and r["total_ms"] is None
    assert round(r["parts_ms"]["p_to_d"], 3) == 30.0 and round(r["engine_total_ms"], 3) == 250.0


def test_a_missing_event_leaves_the_row_incomplete_and_out_of_the_summary():
    ev = [e for e in _events() if e["ev"] != "noticed_recv"]
    rows = handoff.split(ev, [PROXY])
    assert rows[0]["complete"] is False and rows[0]["parts_ms"]["d_notice"] is None
    assert handoff.summary(rows)["complete"] == 0


def test_events_out_of_order_are_a_problem():
    ev = _events()
    for e in ev:
        if e["ev"] == "alloc":
            e["t"] = 100.250  # after the reads started: a wrapper on the wrong method would do this
    assert any("d_dispatch" in p for p in handoff.check(handoff.split(ev, [PROXY])))


def test_window_keeps_the_requests_that_arrived_inside_it():
    assert len(handoff.split(_events(), [PROXY], window=(99.0, 100.5))) == 1
    assert handoff.split(_events(), [PROXY], window=(100.5, 101.0)) == []


def test_window_reads_the_proxys_arrival_and_ds_scheduler_only_without_the_proxy():
    """A request is in a repetition's window by when the proxy had it (t_in = 100.000); D's scheduler saw it
    230 ms later (100.230), which decides only where the proxy's times are missing.  A window between the two
    tells them apart: a request that arrived before a repetition began belongs to the one before it."""
    arrival, d_sched = PROXY["t_in"], next(e["t"] for e in _events() if e["ev"] == "sched" and e.get("side") == "D")
    assert arrival < 100.1 < d_sched < 100.5
    between, before = (100.1, 100.5), (99.0, 100.1)
    assert handoff.split(_events(), [PROXY], window=between) == []
    assert [r["rid"] for r in handoff.split(_events(), [PROXY], window=before)] == [RID]
    # the engines alone (another router): D's scheduler time
    assert [r["d_request"] for r in handoff.split(_events(), [], window=between)] == [D_ID]
    assert handoff.split(_events(), [], window=before) == []
    # a proxy record of another request does not move this one
    assert [r["d_request"] for r in handoff.split(_events(), [dict(PROXY, rid="pd-1-1")], window=between)] == [D_ID]


def test_load_reads_trace_files_and_skips_a_cut_line(tmp_path):
    (tmp_path / "trace-1.jsonl").write_text("\n".join(json.dumps(e) for e in _events()) + '\n{"t": 1, "ev"')
    (tmp_path / "proxy.jsonl").write_text(json.dumps(PROXY) + "\n")
    events, proxy = handoff.load(str(tmp_path), str(tmp_path / "proxy.jsonl"))
    assert len(events) == len(_events()) and proxy == [PROXY]


HOOK = r"""
import json, os, sys, types
sys.path.insert(0, sys.argv[1])
mod = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector")

class Meta:
    def __init__(self, ids): self.reqs_to_recv = {i: None for i in ids}

class Out:
    def __init__(self, recv=(), send=()): self.finished_recving, self.finished_sending = set(recv), set(send)

class Req:
    def __init__(self, rid, params): self.request_id, self.kv_transfer_params, self.num_prompt_tokens = rid, params, 64

class NixlConnector:
    def __init__(self, engine_id="eng-d"): self.engine_id = engine_id
    def get_num_new_matched_tokens(self, request, num_computed_tokens): return (48, True)
    def update_state_after_alloc(self, request, blocks, num_external_tokens): return "alloc-ret"
    def build_connector_meta(self, scheduler_output): return Meta(scheduler_output)
    def update_connector_output(self, connector_output): return None
    def request_finished(self, request, block_ids): return (True, {"remote_request_id": request.request_id})
    def start_load_kv(self, forward_context, **kwargs): self.loaded = True
    def get_finished(self, finished_req_ids): return ({"p1"}, {"d1"})

mod.NixlConnector = NixlConnector
sys.modules[mod.__name__] = mod
import xlkv_handoff_trace as t
assert t.install()
c, cp = NixlConnector(), NixlConnector("eng-p")
d = Req("d1", {"do_remote_prefill": True, "remote_request_id": "p1", "remote_engine_id": "eng-p"})
p = Req("p1", {"do_remote_decode": True})
assert cp.get_num_new_matched_tokens(p, 0) == (48, True)
assert cp.request_finished(p, [1, 2]) == (True, {"remote_request_id": "p1"})
assert c.get_num_new_matched_tokens(d, 0) == (48, True)
c.get_num_new_matched_tokens(d, 0)  # a second look: no second line
assert c.update_state_after_alloc(d, None, 48) == "alloc-ret"
c.update_state_after_alloc(d, None, 0)  # no external tokens: no line
c._connector_metadata = c.build_connector_meta(["d1"])
c.start_load_kv(None)
assert c.loaded
assert c.get_finished(set()) == ({"p1"}, {"d1"})
c.update_connector_output(Out(recv=["d1"]))
c.update_connector_output(None)  # unreadable: skipped, never raised
print(json.dumps([json.loads(x) for f in sorted(os.listdir(os.environ["XLKV_TRACE_HANDOFF"]))
                  for x in open(os.path.join(os.environ["XLKV_TRACE_HANDOFF"], f))]))
"""


def test_trace_hook_passes_through_and_writes_each_event(tmp_path):
    env = dict(os.environ, XLKV_TRACE_HANDOFF=str(tmp_path / "trace"))
    r = subprocess.run([sys.executable, "-c", HOOK, os.path.join(EXP, "negative_control")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = json.loads(r.stdout)
    installed = lines[0]
    assert installed["ev"] == "installed" and installed["missing"] == ["request_finished_all_groups",
                                                                      "get_transfer_results"]
    evs = [(x["ev"], x.get("req")) for x in lines[1:]]
    assert evs == [("sched", "p1"), ("finished", "p1"), ("sched", "d1"), ("alloc", "d1"), ("meta", "d1"),
                   ("read_start", "d1"), ("read_posted", "d1"), ("send_done", "p1"), ("recv_done", "d1"),
                   ("noticed_recv", "d1")]
    d_sched = lines[3]
    assert (d_sched["side"], d_sched["remote"], d_sched["remote_engine"], lines[1]["side"]) == ("D", "p1", "eng-p", "P")
    assert {x["engine"] for x in lines[1:] if x["req"] == "p1" and x["ev"] != "send_done"} == {"eng-p"}
    rows = handoff.split(lines, [])
    assert len(rows) == 1 and rows[0]["complete"] and handoff.check(rows) == []


SCHED_STANDIN = r'''
smod = types.ModuleType("vllm.v1.core.sched.scheduler")

class SchedOut:
    def __init__(self, counts): self.num_scheduled_tokens = counts

class EngineOut:
    def __init__(self, rid, toks): self.request_id, self.new_token_ids = rid, toks

class Outs:
    def __init__(self, outs): self.outputs = outs

class Scheduler:
    def __init__(self): self.plan = []
    def schedule(self): return self.plan.pop(0)
    def update_from_output(self, scheduler_output, model_output): return model_output

smod.Scheduler = Scheduler
sys.modules[smod.__name__] = smod
import xlkv_handoff_trace as t
'''
SCHED_STEPS = r'''
s = Scheduler()
s.plan = [SchedOut({"x": 3}), SchedOut({"d1": 1, "x": 1}), SchedOut({"d1": 1})]
s.schedule()                                   # d1 not in it: no line
s.schedule()                                   # d1's first step with tokens: first_run (once)
s.schedule()
out = {0: Outs([EngineOut("x", [5]), EngineOut("d1", []), EngineOut("p1", [7])])}
assert s.update_from_output(None, out) is out  # p1's token: first_out; d1 has none yet
s.update_from_output(None, {0: Outs([EngineOut("d1", [9, 10])])})
s.update_from_output(None, {0: Outs([EngineOut("d1", [11])])})   # not the first: no line
s.update_from_output(None, None)               # unreadable: skipped, never raised
print(json.dumps('''
SCHED_HOOK = HOOK.replace("import xlkv_handoff_trace as t\n", SCHED_STANDIN, 1).replace("print(json.dumps(", SCHED_STEPS, 1)


def test_trace_hook_times_the_first_token_on_the_scheduler(tmp_path):
    """first_run (D: the first step after the read that computes the request) and first_out (P and D: the
    first token handed to the frontend) on a stand-in of vLLM's Scheduler; each once per request."""
    env = dict(os.environ, XLKV_TRACE_HANDOFF=str(tmp_path / "trace"))
    r = subprocess.run([sys.executable, "-c", SCHED_HOOK, os.path.join(EXP, "negative_control")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = json.loads(r.stdout)
    installed = [x for x in lines if x["ev"] == "installed"]
    assert [x["wrapped"] for x in installed if "sched" in x["module"]] == [["schedule", "update_from_output"]]
    tail = [(x["ev"], x["req"], x.get("engine"), x.get("tokens")) for x in lines if x["ev"] in ("first_run", "first_out")]
    assert tail == [("first_run", "d1", "eng-d", 1), ("first_out", "p1", "eng-p", 1), ("first_out", "d1", "eng-d", 2)]
    rows = handoff.split(lines, [])
    sub = rows[0]["subparts_ms"]
    assert sub["p_out"] is not None and sub["d_to_run"] >= 0 and sub["d_forward"] >= 0
    assert sub["p_frontend"] is None and sub["d_frontend"] is None    # no proxy
    assert set(handoff.summary(rows)["subparts_ms"]) == {"p_out", "d_to_run", "d_forward"}


def test_subparts_add_up_to_p_answer_and_d_first_token():
    ev = _events() + [dict(t=100.203, ev="first_out", req=P_ID, engine="P0"),
                      dict(t=100.262, ev="first_run", req=D_ID, engine="D0"),
                      dict(t=100.285, ev="first_out", req=D_ID, engine="D0")]
    r = handoff.split(ev, [PROXY])[0]
    sub = {k: round(v, 3) for k, v in r["subparts_ms"].items()}
    assert sub == dict(p_out=3, p_frontend=12, d_to_run=2, d_forward=23, d_frontend=15)
    assert round(sub["p_out"] + sub["p_frontend"], 3) == round(r["parts_ms"]["p_answer"], 3)
    assert round(sub["d_to_run"] + sub["d_forward"] + sub["d_frontend"], 3) == round(r["parts_ms"]["d_first_token"], 3)
    late = ev[:-1] + [dict(t=100.100, ev="first_out", req=D_ID, engine="D0")]   # before its read: out of order
    assert any("d_forward" in p for p in handoff.check(handoff.split(late, [PROXY])))
