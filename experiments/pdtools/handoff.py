"""Where each P/D request's time goes, from the handoff trace's lines.

Inputs: the engines' ``trace-<pid>.jsonl`` files (experiments/negative_control/xlkv_handoff_trace.py,
armed with XLKV_TRACE_HANDOFF on P and D) and, optionally, the proxy's ``--trace`` file
(pd_proxy.py).  All times are one host's wall clock.  Requests are joined

* D to P by D's ``remote`` (P's request id, from kv_transfer_params: any router works), and
* the proxy to both by the X-Request-Id the proxy gives P and D (``pd-<ms>-<n>``, which vLLM keeps
  inside its own request id).

The parts of one request, in order; with the proxy's times they add up to its TTFT at the proxy
(``total``), each part ending where the next begins:

  proxy_to_p     the proxy has the request .. sends it to P
  p_admission    sent to P .. P's scheduler first looks at it (HTTP, tokenising, the engine's queue)
  p_prefill      .. P's request finishes (its prefill, queued behind others' included)
  p_answer       .. the proxy has P's answer (P's output path and HTTP)
  proxy_to_d     .. the proxy sends the request to D
  d_admission    .. D's scheduler first looks at it
  d_alloc        .. D gives it KV blocks (the read is queued for the next step's metadata)
  d_dispatch     .. the first TP rank starts the read (start_load_kv: behind the step in flight)
  transfer       .. the last rank's worker reports the read done (posting, NIXL, the poll)
  d_notice       .. D's scheduler learns it (the step's output)
  d_first_token  .. the proxy has D's first byte (the last prompt token's forward, output, HTTP)

Two parts are split further where the trace has vLLM's Scheduler events (``first_run``, ``first_out``);
these sub-parts add up to their part and are kept apart from it (``subparts_ms``):

  p_answer       = p_out        P's request finished .. P's scheduler hands its token to the frontend
                 + p_frontend   .. the proxy has P's answer (engine-core output, API server, HTTP)
  d_first_token  = d_to_run     D's scheduler learns the read finished .. the first step that computes
                                the request's last prompt token is scheduled
                 + d_forward    .. that step's output hands the first token to the frontend
                 + d_frontend   .. the proxy has D's first byte (engine-core output, API server, HTTP)

Without the proxy's times the split starts at P's scheduler and ends at D's notice, with
``p_to_d`` (P finished .. D's scheduler looks: P's answer, the router, D's admission) in between.
Pure logic: no vLLM, no I/O beyond reading the files.
"""

import glob
import json
import os
import re
import statistics

PARTS = ("proxy_to_p", "p_admission", "p_prefill", "p_answer", "proxy_to_d", "d_admission", "d_alloc",
         "d_dispatch", "transfer", "d_notice", "d_first_token")
#: the parts when the proxy's times are missing (another router): P's scheduler .. D's notice
ENGINE_PARTS = ("p_prefill", "p_to_d", "d_alloc", "d_dispatch", "transfer", "d_notice")
#: the finer split of p_answer and d_first_token (trace events first_run and first_out)
SUBPARTS = ("p_out", "p_frontend", "d_to_run", "d_forward", "d_frontend")
RID = re.compile(r"pd-\d+-\d+(?!\d)")


def read_lines(paths):
    out = []
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a killed process
    return out


def load(folders, proxy=None):
    """(engine events, proxy records) from trace folders and the proxy's trace file."""
    files = []
    for folder in ([folders] if isinstance(folders, str) else folders):
        files += sorted(glob.glob(os.path.join(folder, "trace-*.jsonl")))
    return read_lines(files), (read_lines([proxy]) if proxy and os.path.exists(proxy) else [])


def _by_request(events):
    """(engine id, request id) -> {event: first time} (``recv_done``/``read_start``/``read_posted``/
    ``send_done``: first and last time over ranks), plus the ``sched`` line's fields.  Keyed by engine
    too: P and D may know a request by the same id (releases before vLLM's per-engine suffix, routers that
    give both the same id)."""
    reqs = {}
    for e in sorted((e for e in events if isinstance(e.get("req"), str)), key=lambda e: e["t"]):
        r = reqs.setdefault((e.get("engine"), e["req"]), {"ranks": set()})
        ev, t = e["ev"], e["t"]
        if e.get("rank") is not None:
            r["ranks"].add(e["rank"])
        if ev in ("read_start", "read_posted", "recv_done", "send_done"):
            r.setdefault(ev + "_first", t)
            r[ev + "_last"] = t
        elif ev not in r:
            r[ev] = t
        if ev == "sched":
            for k in ("side", "remote", "remote_engine", "prompt_tokens"):
                if k in e:
                    r[k] = e[k]
    return reqs


def _ms(a, b):
    return None if a is None or b is None else (b - a) * 1e3


def _prefill_of(reqs, engine, d):
    """P's record of D's request: by D's (remote_engine, remote), else the one P-side record of that id
    on another engine."""
    p = reqs.get((d.get("remote_engine"), d.get("remote")))
    if p is None:
        found = [r for (eng, req), r in reqs.items() if req == d.get("remote") and eng != engine
                 and r.get("side") != "D"]
        p = found[0] if len(found) == 1 else None
    return p or {}


def split(events, proxy_records=(), window=None):
    """One row per D request (a request with do_remote_prefill that D's scheduler saw): its parts in
    ms (None where an end is missing), the ids it was joined by, and ``complete`` (every part known).
    ``window``: (t0, t1), keep requests whose first time (the proxy's arrival, else D's scheduler) lies
    inside."""
    reqs = _by_request(events)
    proxy = {p["rid"]: p for p in proxy_records if "rid" in p}
    rows = []
    for (engine, rid), d in reqs.items():
        if d.get("side") != "D":
            continue
        p = _prefill_of(reqs, engine, d)
        m = RID.search(rid) or RID.search(d.get("remote") or "")  # the proxy's id, in D's or P's request id
        px = (proxy.get(m.group(0)) if m else None) or {}
        start = px.get("t_in", d.get("sched"))
        if window and not (start is not None and window[0] <= start <= window[1]):
            continue
        # each part ends where the next begins: the marks in the order a request goes through them
        marks = [px.get("t_in"), px.get("t_p_sent"), p.get("sched"), p.get("finished"), px.get("t_p_answer"),
                 px.get("t_d_sent"), d.get("sched"), d.get("alloc"), d.get("read_start_first"),
                 d.get("recv_done_last"), d.get("noticed_recv"), px.get("t_d_first")]
        parts = {name: _ms(a, b) for name, a, b in zip(PARTS, marks, marks[1:])}
        parts["p_to_d"] = _ms(p.get("finished"), d.get("sched"))
        sub = {"p_out": _ms(p.get("finished"), p.get("first_out")),
               "p_frontend": _ms(p.get("first_out"), px.get("t_p_answer")),
               "d_to_run": _ms(d.get("noticed_recv"), d.get("first_run")),
               "d_forward": _ms(d.get("first_run"), d.get("first_out")),
               "d_frontend": _ms(d.get("first_out"), px.get("t_d_first"))}
        row = {"d_request": rid, "p_request": d.get("remote"), "rid": px.get("rid"), "ranks": len(d["ranks"]),
               "prompt_tokens": d.get("prompt_tokens"), "parts_ms": parts, "subparts_ms": sub,
               "read_posting_ms": _ms(d.get("read_start_first"), d.get("read_posted_last")),
               "total_ms": _ms(px.get("t_in"), px.get("t_d_first")),
               "engine_total_ms": _ms(p.get("sched"), d.get("noticed_recv"))}
        row["complete"] = all(parts[k] is not None for k in (PARTS if px else ENGINE_PARTS))
        rows.append(row)
    rows.sort(key=lambda r: (r["rid"] or "", r["d_request"]))
    return rows


def _stats(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return {"n": len(xs), "mean": round(statistics.mean(xs), 3), "p50": round(statistics.median(xs), 3),
            "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3), "min": round(xs[0], 3),
            "max": round(xs[-1], 3)}


def summary(rows):
    """Per part (and the totals): n, mean, p50, p90, min, max over the complete rows."""
    done = [r for r in rows if r["complete"]]
    out = {"requests": len(rows), "complete": len(done), "parts_ms": {}}
    for k in PARTS + ("p_to_d",):
        s = _stats(r["parts_ms"][k] for r in done)
        if s:
            out["parts_ms"][k] = s
    subs = {}
    for k in SUBPARTS:
        st = _stats(r["subparts_ms"].get(k) for r in done if r.get("subparts_ms"))
        if st:
            subs[k] = st
    if subs:
        out["subparts_ms"] = subs
    for k in ("total_ms", "engine_total_ms", "read_posting_ms"):
        s = _stats(r[k] for r in done)
        if s:
            out[k] = s
    return out


def check(rows, tolerance_ms=1.0):
    """Problems with the rows (an empty list when sound): a part below zero beyond the tolerance
    means two events out of the order a P/D request goes through (a wrapper on the wrong method)."""
    problems = []
    for r in rows:
        for k, v in list(r["parts_ms"].items()) + list((r.get("subparts_ms") or {}).items()):
            if v is not None and v < -tolerance_ms:
                problems.append("%s: %s is %.3f ms (an event out of order)" % (r["d_request"], k, v))
    return problems
