"""A rank worker: one spawned process per TP rank and side.  It sets its rank up
(rank_setup), reports "ready" with what the connector made of it, then serves the
parent's commands: P (prefill, the NIXL READ target) registers requests to send and
watches them finish; D (decode, the reader) pulls each request's blocks and hands back
its layers' bytes.  Module level stays stdlib-only: spawned children import it."""
import argparse
import os
import queue as queue_mod
import sys
import time
import traceback

from . import model
from .checks import fill_reference, layer_bytes, plant_corruption, plant_group_shift
from .compat import block_ids_arg, kw, new_md
from .connector_io import serve_handshake, tick, worker_handshake_metadata, wrap_xfer_counter
from .logs import LogCapture
from . import rank_setup
from .rank_setup import setup, worker_state

INFO_KEYS = ("vllm", "platform", "backend", "kv_layout", "cross_layer", "prefer_cross_layer_blocks",
             "connector_class", "layout_block_outermost", "layer_view_shape", "num_blocks", "block_size",
             "connector_kind", "use_v2_model_runner", "kernel_ratio", "tensor_blocks", "kv_cache_groups",
             "family", "hybrid_allocator")


def child_main(role, args_dict, tmpdir, cmd_q, res_q, env, logs=None):
    """One rank: spawned on its own, or forked by side_main (``logs``: the capture that side_main
    started before vLLM's import, with what that import logged)."""
    args = _begin(args_dict, env)
    t0 = time.time()
    try:
        if logs is None:
            import vllm.logger  # noqa: F401  (vLLM's dictConfig replaces handlers at import)
            logs = LogCapture()
        st = setup(role, args, tmpdir)
        info = _rank_info(st, args, logs, t0)
        if role == "p":
            _prefill(st, args, info, cmd_q, res_q, logs)
        else:
            _decode(st, args, info, cmd_q, res_q, logs)
    except BaseException as e:
        res_q.put(_fatal(role, e, logs))
    _leave(res_q)


def _begin(args_dict, env):
    """A rank's (or a side's fork parent's) environment and model shape; its arguments."""
    os.environ.update(env)
    args = argparse.Namespace(**args_dict)
    model.set_family(getattr(args, "family", None) or "dense")
    model.set_kv_heads(getattr(args, "kv_heads", None) or model.NUM_KV_HEADS)
    return args


def _fatal(role, e, logs, where=""):
    """The "fatal" message a rank's queue carries to the parent (procs.expect raises it)."""
    return ("fatal", {"role": role, "error": f"{type(e).__name__}: {e}{where}",
                      "traceback": traceback.format_exc()[-4000:],
                      "log_errors": logs.errors()[-10:] if logs else []})


def side_main(role, tmpdir, env, ranks):
    """The ranks of one side with several (``ranks``: [(args_dict, cmd_q, res_q)], one per rank):
    this process imports vLLM once (rank_setup.prelude, the shim's import hooks firing here as in
    a spawned rank) and forks one child per rank, each of which goes on as child_main; it then
    waits for them.  vLLM's own workers are forked from an engine core that has imported vLLM (its
    default VLLM_WORKER_MULTIPROC_METHOD); here it saves each extra rank the import (≈ 12 s of
    CPU on vLLM 0.33, on a 2-core CI machine).  XLKV_HARNESS_FORK_RANKS=0 spawns every rank on its
    own instead (procs.Ranks).  A failure before the fork reaches every rank's queue as "fatal"."""
    logs = None
    try:
        args = _begin(ranks[0][0], env)
        import vllm.logger  # noqa: F401  (vLLM's dictConfig replaces handlers at import)
        logs = LogCapture()
        rank_setup.PRELUDE = rank_setup.prelude(args)
        rank_setup.preload_for_fork()
    except BaseException as e:
        for _args, _cmd_q, res_q in ranks:
            res_q.put(_fatal(role, e, logs, " (before the fork of the side's ranks)"))
        for _args, _cmd_q, res_q in ranks:
            _flush(res_q)
        os._exit(0)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    children = []
    for args_dict, cmd_q, res_q in ranks:
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            child_main(role, args_dict, tmpdir, cmd_q, res_q, env, logs=logs)
            os._exit(0)  # child_main ends in _leave; never reached
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    os._exit(0)


def _die_with_parent():
    """A forked rank ends with the process it was forked from (the parent kills that one on a
    timeout: procs.Ranks.join), so no rank outlives its run."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _flush(res_q):
    res_q.close()
    res_q.join_thread()


def _leave(res_q):
    """Ends the rank's process once its answers are in the pipe, without the interpreter's
    own finalisation: after the last Python exit handler a vLLM 0.33 rank spun one core for
    ~9 s (main thread running, 40 gloo threads waiting; measured here), which the parent's
    join waited out, in every run: a third of a run's CPU time on a 2-core CI machine.
    Nothing a check reads happens after this point (the results went through ``res_q``)."""
    _flush(res_q)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def _rank_info(st, args, logs, t0):
    """What "ready" reports: the set-up as the release made it."""
    ws = worker_state(st)
    info = {k: st[k] for k in INFO_KEYS if k in st}
    info["cross_layer_shape"] = st.get("cross_layer_shape")
    info["worker"] = ws
    if args.p_tp > 1 or args.d_tp > 1:
        info["tp"], info["tp_rank"] = st["tp"], st["tp_rank"]
    info["setup_s"] = round(time.time() - t0, 2)
    info["xlkv_log"] = logs.shim_lines()
    return info


# ---------------------------------------------------------------------------------- P side
def _prefill(st, args, info, cmd_q, res_q, logs):
    import pickle
    ref = fill_reference(st)
    if st["tp"] == 1:
        # engine core: worker handshake metadata -> scheduler connector side channel
        serve_handshake(st, worker_handshake_metadata(st))
    else:
        # TP N: the engine core gathers every rank's metadata (the parent does that
        # here) and rank 0's process serves the merged dict ("serve" below)
        # pickled here, so that the parent never has to import vLLM to pass it on
        info["handshake"] = {k: pickle.dumps(v) for k, v in
                             (worker_handshake_metadata(st) or {}).items()}
    info["reference"] = layer_bytes(ref, st["names"])
    info["ref_shape"] = list(ref[st["names"][0]].shape)
    res_q.put(("ready", info))
    _PrefillLoop(st, args, res_q, logs).run(cmd_q, args.timeout * 4)
    res_q.put(("p_exit", {"errors": logs.errors()[-20:]}))


class _PrefillLoop:
    """P's scheduler steps between the parent's commands ("send": a request whose blocks
    D may pull, "serve": the merged TP handshake, "status", "stop"); reports "sent" when
    the connector says a request finished sending."""

    def __init__(self, st, args, res_q, logs):
        self.st, self.res_q, self.logs = st, res_q, logs
        self.push = getattr(args, "transfer", "pull") == "push"
        # push: P's own agent makes the transfer (WRITE); count it there
        self.tel, self.marks = [], {}
        self.calls = wrap_xfer_counter(st, self.tel) if self.push else []
        self.done_sending = set()

    def run(self, cmd_q, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                cmd = cmd_q.get(timeout=0.02)
            except queue_mod.Empty:
                cmd = None
            if cmd is None:
                self.poll()
            elif cmd[0] == "stop":
                break
            else:
                self.command(cmd)

    def command(self, cmd):
        if cmd[0] == "send":
            req = cmd[1]
            md = new_md(self.st)
            md.reqs_in_batch = set([req]) | set(getattr(md, "reqs_in_batch", set()))
            md.reqs_to_send = {req: time.perf_counter() + 120}
            if self.push:  # what P's scheduler hands its workers when the request finished
                md.push_finished_blocks = {req: block_ids_arg(self.st, cmd[2])}
                self.marks[req] = (len(self.calls), len(self.tel))
            s, r = tick(self.st, md)
            self.done_sending |= set(s or ())
            self.res_q.put(("send_ack", req))
        elif cmd[0] == "serve":
            import pickle
            serve_handshake(self.st, {k: pickle.loads(v) for k, v in cmd[1].items()})
            self.res_q.put(("serving", sorted(map(str, cmd[1]))))
        elif cmd[0] == "status":
            self.res_q.put(("status", sorted(self.done_sending), self.logs.errors()[-20:]))

    def poll(self):
        s, r = tick(self.st)
        if not s:
            return
        new = set(s) - self.done_sending
        self.done_sending |= set(s)
        for q in new:
            if q in self.marks:  # push: what P's agent moved for it
                c0, t0_ = self.marks.pop(q)
                self.res_q.put(("sent", q, {"xfer_calls": self.calls[c0:], "nixl_desc_counts": self.tel[t0_:]}))
            else:
                self.res_q.put(("sent", q))


# ---------------------------------------------------------------------------------- D side
def _decode(st, args, info, cmd_q, res_q, logs):
    push = getattr(args, "transfer", "pull") == "push"
    if push:  # P handshakes with D before it WRITEs: D's engine core serves metadata too
        serve_handshake(st, worker_handshake_metadata(st))
    res_q.put(("ready", info))
    telemetry = []
    calls = wrap_xfer_counter(st, telemetry, getattr(args, "plant_fault", None))
    while True:
        cmd = cmd_q.get(timeout=args.timeout * 4)
        if cmd[0] == "stop":
            break
        res_q.put(("recv", _receive(st, args, cmd[1:], calls, telemetry, logs)))
    res_q.put(("d_exit", {}))


def _receive(st, args, request, calls, telemetry, logs):
    """One request: D asks for P's blocks (or, push, registers its own), steps until the
    connector reports it received, and returns the outcome with its layers' bytes."""
    req, remote_ids, local_ids, p_info = request
    res = {"req": req, "remote_block_ids": remote_ids, "local_block_ids": local_ids}
    n_calls0, n_tel0, n_log0 = len(calls), len(telemetry), len(logs.records)
    err0 = len(logs.errors())
    md = _recv_metadata(st, args, req, remote_ids, local_ids, p_info)
    t1 = time.time()
    recv_done = False
    s, r = tick(st, md)
    while time.time() - t1 < args.timeout:
        if r and req in r:
            recv_done = True
            break
        time.sleep(0.01)
        s, r = tick(st)
    res["recv_done"] = recv_done
    res["shim_log"] = logs.shim_lines(since=n_log0)  # the shim's lines during this receive
    res["recv_s"] = round(time.time() - t1, 3)
    try:
        res["invalid_block_ids"] = sorted(st["conn"].get_block_ids_with_load_errors())
    except Exception as e:
        res["invalid_block_ids"] = f"n/a {e!r}"
    res["xfer_calls"] = calls[n_calls0:]
    res["nixl_desc_counts"] = telemetry[n_tel0:]
    res["errors"] = logs.errors()[err0:][-10:]
    flat = [b for g in local_ids for b in g] if local_ids and isinstance(local_ids[0], (list, tuple)) \
        else local_ids
    if getattr(args, "plant_fault", None) == "corrupt" and \
            st["tp_rank"] == st["tp"] - 1 and flat:
        plant_corruption(st, flat)
    if getattr(args, "plant_fault", None) == "shift-group" and flat:
        plant_group_shift(st, local_ids)
    if isinstance(st.get("restage_rows"), list):  # --restage-rows: the rows it permuted for this request
        res["restaged"] = st["restage_rows"][:]
        del st["restage_rows"][:]
    res["layers"] = layer_bytes(st["kv_caches"], st["names"])
    return res


def _recv_metadata(st, args, req, remote_ids, local_ids, p_info):
    """The connector metadata D's scheduler hands its workers for a remote prefill."""
    md = new_md(st)
    params = dict(remote_block_ids=block_ids_arg(st, remote_ids),
                  remote_engine_id=p_info["engine_id"], remote_request_id=req,
                  remote_host=p_info.get("host", "127.0.0.1"), remote_port=p_info["port"],
                  tp_size=p_info.get("tp_size", 1), do_remote_prefill=True,
                  do_remote_decode=False)
    lids = block_ids_arg(st, local_ids)
    if getattr(args, "transfer", "pull") == "push":
        # what D's push scheduler does in update_state_after_alloc: D does not know
        # P's blocks; it registers its own with P (a NIXL notification) and waits
        params["remote_block_ids"] = ()
        md.push_registrations = {req: dict(
            request_id=req, decode_engine_id="d-engine",
            decode_host=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"),
            decode_port=args.d_port, decode_tp_size=st["tp"], local_block_ids=lids,
            remote_engine_id=p_info["engine_id"], remote_host=p_info.get("host", "127.0.0.1"),
            remote_port=p_info["port"], remote_tp_size=p_info.get("tp_size", 1),
            remote_pp_size=1)}
    if hasattr(md, "add_new_req_to_recv"):
        md.add_new_req_to_recv(req, lids, params)
    else:
        kw(md.add_new_req, request_id=req, local_block_ids=lids,
           kv_transfer_params=params, load_remote_cache=True)
    return md
