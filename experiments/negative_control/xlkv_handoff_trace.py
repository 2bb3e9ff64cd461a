"""The lab's handoff trace (EXPERIMENTS ONLY): where a P/D request's time goes, per request.

Armed by this folder's sitecustomize.py when ``XLKV_TRACE_HANDOFF=<folder>`` is set (pdtools/pair.py
sets it on P and D with ``HANDOFF_TRACE=1``, for every config: stock, vLLM's BLNHC and the shim
alike; the trace is independent of ENABLE_XLKV).  It only *observes*: pass-through wrappers on
NixlConnector's scheduler-side and worker-side methods (the KV connector API every release
0.12-0.33 has), which call the original first and then append one JSON line per event to
``<folder>/trace-<pid>.jsonl`` (wall clock, ``time.time()``: P, D and the proxy share one host's
clock).  No argument, return value or exception of vLLM's is changed; an event that cannot be
read is skipped, never raised.

Events (``ev``), with the request id vLLM uses inside the engine (``req``):
  scheduler (engine core)
    sched        the first get_num_new_matched_tokens for the request: the scheduler looks at it
                 (``side``: "P" for a request with do_remote_decode, "D" with do_remote_prefill;
                 D's line carries ``remote``, P's request id from kv_transfer_params)
    alloc        update_state_after_alloc with external tokens (D: blocks given, the read queued)
    meta         build_connector_meta put the request's read into the step's metadata
    noticed_recv update_connector_output: the scheduler learns the read finished (D)
    noticed_send update_connector_output: the scheduler learns D has read the blocks (P)
    finished     request_finished (P: prefill done, the answer with kv_transfer_params leaves)
  worker (one line per TP rank, ``rank``)
    read_start / read_posted   start_load_kv before / after the original (the reads posted)
    recv_done    get_finished / get_transfer_results reported the read done (or failed)
    send_done    get_finished / get_transfer_results reported D's read of P's blocks done
  scheduler (vLLM's Scheduler, engine core): the first token's path, which the connector does not see
    first_run    D: the first schedule() after noticed_recv that gives the request tokens to compute
                 (the last prompt token's forward is in that step)
    first_out    the first update_from_output that hands the request's first new token to the frontend
                 (P: its one token, in the step that finished the prefill; D: the first token after the read)
Each process also writes one ``installed`` line naming what it wrapped and what it could not.
"""

import json
import os
import sys
import threading
import time

ENV = "XLKV_TRACE_HANDOFF"
MODULES = ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector",   # 0.20+
           "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector")   # 0.12-0.19
SCHEDULER = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
             "update_connector_output", "request_finished", "request_finished_all_groups")
WORKER = ("start_load_kv", "get_finished", "get_transfer_results")
SCHED_MODULE = "vllm.v1.core.sched.scheduler"
SCHED_METHODS = ("schedule", "update_from_output")
MARK = "_xlkv_handoff_trace"

_lock = threading.Lock()
_out = None
_seen = set()      # request ids whose ``sched`` line is written (dropped at ``finished``)
_await_run = {}    # D: request id -> engine; the read was noticed, its first step with tokens not yet seen
_await_out = {}    # P and D: request id -> engine; the first new token not yet handed out
_installed = False


def _write(ev, req=None, **extra):
    global _out
    rec = {"t": time.time(), "ev": ev, "pid": os.getpid()}
    if req is not None:
        rec["req"] = req
    rec.update(extra)
    line = json.dumps(rec, sort_keys=True) + "\n"
    with _lock:
        if _out is None:
            folder = os.environ[ENV]
            os.makedirs(folder, exist_ok=True)
            _out = open(os.path.join(folder, "trace-%d.jsonl" % os.getpid()), "a", buffering=1)
        _out.write(line)


def _engine(conn):
    """The engine id (P's and D's differ): on the connector, or on its scheduler/worker half."""
    for holder in (conn, getattr(conn, "connector_scheduler", None), getattr(conn, "connector_worker", None)):
        v = getattr(holder, "engine_id", None)
        if isinstance(v, str):
            return v
    return None


def _rank(conn):
    w = getattr(conn, "connector_worker", None)
    for attr in ("tp_rank", "rank"):
        v = getattr(w, attr, None)
        if isinstance(v, int):
            return v
    return None


def _params(request):
    p = getattr(request, "kv_transfer_params", None)
    return p if isinstance(p, dict) else {}


def _ids(x):
    """Request ids in a set/dict/list, or []."""
    try:
        return [r for r in x if isinstance(r, str)] if x else []
    except TypeError:
        return []


def _safe(fn):
    def run(*a, **k):
        try:
            fn(*a, **k)
        except Exception:  # noqa: BLE001 - a trace never changes what vLLM does
            pass
    return run


# ----------------------------------------------------------------- scheduler side
@_safe
def _on_matched(conn, request):
    rid = getattr(request, "request_id", None)
    if not isinstance(rid, str) or rid in _seen:
        return
    _seen.add(rid)
    p = _params(request)
    side = "D" if p.get("do_remote_prefill") else "P" if p.get("do_remote_decode") else None
    extra = {"side": side, "engine": _engine(conn), "prompt_tokens": getattr(request, "num_prompt_tokens", None)}
    if side == "D":
        extra["remote"] = p.get("remote_request_id")
        extra["remote_engine"] = p.get("remote_engine_id")
    elif side == "P":
        _await_out[rid] = extra["engine"]
    _write("sched", rid, **extra)


@_safe
def _on_alloc(conn, request, num_external_tokens):
    if num_external_tokens:
        _write("alloc", getattr(request, "request_id", None), engine=_engine(conn), tokens=num_external_tokens)


@_safe
def _on_meta(conn, meta):
    for rid in _ids(getattr(meta, "reqs_to_recv", None)):
        _write("meta", rid, engine=_engine(conn))


@_safe
def _on_output(conn, output):
    for ev, attr in (("noticed_recv", "finished_recving"), ("noticed_send", "finished_sending")):
        for rid in _ids(getattr(output, attr, None)):
            _write(ev, rid, engine=_engine(conn))
            if ev == "noticed_recv" and rid in _seen:
                _await_run[rid] = _engine(conn)


@_safe
def _on_finished(conn, request, result):
    rid = getattr(request, "request_id", None)
    params = result[1] if isinstance(result, tuple) and len(result) == 2 else None
    _write("finished", rid, engine=_engine(conn), params=bool(params))
    _seen.discard(rid)
    _await_run.pop(rid, None)   # finished before its first step (aborted, failed): nothing more to wait for


# ----------------------------------------------------------------- worker side
def _reads(conn):
    return _ids(getattr(getattr(conn, "_connector_metadata", None), "reqs_to_recv", None))


@_safe
def _on_done(conn, result):
    if isinstance(result, tuple) and len(result) == 2:
        sending, recving = result
    else:
        sending, recving = getattr(result, "finished_sending", None), getattr(result, "finished_recving", None)
    engine, rank = _engine(conn), _rank(conn)
    for ev, ids in (("send_done", sending), ("recv_done", recving)):
        for rid in _ids(ids):
            _write(ev, rid, engine=engine, rank=rank)


# ----------------------------------------------------------------- the first token (vLLM's Scheduler)
@_safe
def _on_schedule(scheduler_output):
    if not _await_run:
        return
    counts = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    for rid in [r for r in _await_run if counts.get(r)]:
        engine = _await_out[rid] = _await_run.pop(rid)
        _write("first_run", rid, engine=engine, tokens=counts[rid])


def _outputs(result):
    """The EngineCoreOutput items of update_from_output's result (a dict of EngineCoreOutputs per client)."""
    groups = result.values() if isinstance(result, dict) else [result]
    for g in groups:
        for o in (getattr(g, "outputs", None) or ()):
            yield o


@_safe
def _on_update(result):
    if not _await_out:
        return
    for o in _outputs(result):
        rid = getattr(o, "request_id", None)
        if rid in _await_out and getattr(o, "new_token_ids", None):
            _write("first_out", rid, engine=_await_out.pop(rid), tokens=len(o.new_token_ids))


def _scheduler_wrapper(attr):
    def wrapper(wrapped, instance, args, kwargs):
        out = wrapped(*args, **kwargs)
        (_on_schedule if attr == "schedule" else _on_update)(out)
        return out
    return wrapper




def _arg(args, kwargs, i, name):
    """The wrapped method's argument at position ``i`` (after self) or by ``name``."""
    return args[i] if len(args) > i else kwargs.get(name)


#: the handler each wrapped method's result goes to: handler(connector, args, kwargs, result)
AFTER = {
    "get_num_new_matched_tokens": lambda c, a, k, out: _on_matched(c, _arg(a, k, 0, "request")),
    "update_state_after_alloc": lambda c, a, k, out: _on_alloc(c, _arg(a, k, 0, "request"),
                                                               _arg(a, k, 2, "num_external_tokens")),
    "build_connector_meta": lambda c, a, k, out: _on_meta(c, out),
    "update_connector_output": lambda c, a, k, out: _on_output(c, _arg(a, k, 0, "connector_output")),
    "request_finished": lambda c, a, k, out: _on_finished(c, _arg(a, k, 0, "request"), out),
    "request_finished_all_groups": lambda c, a, k, out: _on_finished(c, _arg(a, k, 0, "request"), out),
    "get_finished": lambda c, a, k, out: _on_done(c, out),
    "get_transfer_results": lambda c, a, k, out: _on_done(c, out),
}


def _after(handler):
    """A wrapper that calls the original, hands its result to ``handler`` (which never raises) and returns it."""
    def wrapper(wrapped, instance, args, kwargs):
        out = wrapped(*args, **kwargs)
        handler(instance, args, kwargs, out)
        return out
    return wrapper


@_safe
def _on_reads(conn, ev, ids):
    engine, rank = _engine(conn), _rank(conn)
    for rid in ids:
        _write(ev, rid, engine=engine, rank=rank)


def _load(wrapped, instance, args, kwargs):
    """start_load_kv: a line per read before the original (read_start) and after it (read_posted)."""
    try:
        ids = _reads(instance)
    except Exception:  # noqa: BLE001 - a trace never changes what vLLM does
        ids = []
    _on_reads(instance, "read_start", ids)
    out = wrapped(*args, **kwargs)
    _on_reads(instance, "read_posted", ids)
    return out


def _wrapper(attr):
    return _load if attr == "start_load_kv" else _after(AFTER[attr])


def _patch_class(module, name, attrs, make_wrapper):
    """Wrap ``attrs`` of ``module.name`` on that class itself (an inherited method gets an override there:
    other classes stay untouched), once; one ``installed`` line names what was wrapped and what is missing."""
    import wrapt

    cls = getattr(module, name, None)
    if cls is None or getattr(cls, MARK, False):
        return
    wrapped, missing = [], []
    for attr in attrs:
        if not callable(getattr(cls, attr, None)):
            missing.append(attr)
            continue
        setattr(cls, attr, wrapt.FunctionWrapper(getattr(cls, attr), make_wrapper(attr)))
        wrapped.append(attr)
    setattr(cls, MARK, True)
    _write("installed", module=module.__name__, wrapped=wrapped, missing=missing)


def _patch(module):
    if module.__name__ == SCHED_MODULE:
        _patch_class(module, "Scheduler", SCHED_METHODS, _scheduler_wrapper)
    else:
        _patch_class(module, "NixlConnector", SCHEDULER + WORKER, _wrapper)


def install():
    """Register the wrappers for whichever NixlConnector module vLLM imports (once per process)."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return False
    _installed = True
    import wrapt

    def hook(module):
        try:
            _patch(module)
        except Exception as e:  # noqa: BLE001 - say it; never stop vLLM for a trace
            sys.stderr.write("xlkv handoff trace: not installed on %s (%s: %s)\n"
                             % (module.__name__, type(e).__name__, e))

    for name in MODULES + (SCHED_MODULE,):
        wrapt.register_post_import_hook(hook, name)
    return True
