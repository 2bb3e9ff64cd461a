"""Driving one rank's connector as the engine core and the model runner do: a scheduler
step (tick), the handshake metadata and its side channel, and pass-through counters on
the NIXL agent (the descriptors handed to NIXL and those it moved)."""
from .compat import kw, new_md, role


def tick(state, md=None):
    conn = state["conn"]
    conn.bind_connector_metadata(md if md is not None else new_md(state))
    conn.start_load_kv(None)
    done = conn.get_finished(set())
    conn.clear_connector_metadata()
    return done


def worker_handshake_metadata(st):
    """This rank's handshake metadata, from the release's own
    GPU Worker.get_kv_connector_handshake_metadata ({tp_rank: ...} or {(pp, tp): ...})."""
    from vllm.v1.worker.gpu_worker import Worker as GpuWorker
    gw = object.__new__(GpuWorker)  # not __init__'ed; only what the method reads
    rank = st.get("tp_rank", 0)
    for a, v in (("vllm_config", st["cfg"]), ("parallel_config", st["cfg"].parallel_config),
                 ("model_runner", st["runner"]), ("rank", rank), ("local_rank", rank)):
        try:
            setattr(gw, a, v)
        except Exception:
            pass
    return GpuWorker.get_kv_connector_handshake_metadata(gw)


def serve_handshake(st, content):
    """What the engine core does with the workers' merged metadata: a scheduler-role
    connector serves it on vLLM's zmq side channel."""
    sched = kw(type(st["outer"]), vllm_config=st["cfg"], role=role("SCHEDULER"),
               kv_cache_config=st["kvcc"])
    st["sched"] = sched
    if content:
        if hasattr(sched, "set_xfer_handshake_metadata_pp_aware"):
            sched.set_xfer_handshake_metadata_pp_aware(content)
        else:
            sched.set_xfer_handshake_metadata(content)


def wrap_xfer_counter(state, telemetry, plant_fault=None):
    """Pass-through wrappers on the NIXL agent: make_prepped_xfer counts the descriptors
    vLLM hands over (before any merge), get_xfer_telemetry appends to ``telemetry`` the
    descriptors NIXL really moved (descCount, after its merge; what vLLM's KV metrics
    report) whenever vLLM reads it."""
    w = state["conn"].connector_worker
    agent = getattr(w, "nixl_wrapper", None)
    calls = []
    if agent is None:
        return calls
    tel_orig = getattr(agent, "get_xfer_telemetry", None)
    if tel_orig is not None:
        def tel(*a, **k):
            res = tel_orig(*a, **k)
            try:
                telemetry.append(int(res.descCount))
            except Exception:
                pass
            return res
        try:
            agent.get_xfer_telemetry = tel
        except Exception:
            pass
    orig = agent.make_prepped_xfer

    def counted(*a, **k):
        try:
            local_ids = a[2] if len(a) > 2 else k.get("local_indices")
            calls.append(len(local_ids))
        except Exception:
            pass
        if plant_fault == "misorder" and len(a) > 4 and len(a[2]) > 1:
            # planted fault (harness self-test): the local descriptor ids reordered without
            # their remote partners, as a wrong coalescing step would; the byte check must catch it
            a = list(a)
            a[2] = a[2][::-1].copy() if hasattr(a[2], "copy") else list(a[2])[::-1]
        return orig(*a, **k)

    try:
        agent.make_prepped_xfer = counted
    except Exception:
        pass
    return calls
