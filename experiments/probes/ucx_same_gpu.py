#!/usr/bin/env python3
"""Which UCX transport moves KV between two processes on one GPU, and how fast?

P and D sharing one GPU moved KV at 0.1-0.5 GB/s inside vLLM (device-log.md, 2026-11-23),
three orders of magnitude below two GPUs over NVLink.  This probe takes vLLM out of the
picture: two processes (a target that owns the source bytes, a reader that pulls them, as
vLLM's decode side does), each with its own NIXL agent (UCX backend) and its own CUDA
allocation on the same device, one READ of N blocks, timed, bytes checked.  Each variant is
a fresh pair of processes with its own environment (UCX_TLS ...), and UCX_PROTO_INFO=y makes
UCX print the protocol it selected; the lines are kept in the JSON.

    python experiments/probes/ucx_same_gpu.py [--out FILE] [--reps 5]
        [--variant NAME=VAR=VALUE;VAR=VALUE ...]   (default: default, ipc, no-ipc; see VARIANTS)
        [--shape NAME=BLOCKS:BYTES ...] (default: cross-layer 640 x 1.75 MiB, stock 3584 x 32 KiB)
        [--reader-device N]             (default 0: the target's device; 1 on a two-GPU machine)

Needs torch with CUDA and nixl (a vLLM bundle's site on PYTHONPATH).  Exit 1 if any
variant failed or moved wrong bytes.
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time

#: UCX environments tried: name -> variables (UCX_PROTO_INFO=y is added to each)
VARIANTS = {
    "default": {},
    "ipc": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp,self,sm"},
    "no-ipc": {"UCX_TLS": "cuda_copy,tcp,self,sm"},
}
#: transfer shapes: name -> (descriptors, bytes each); one 10240-token Qwen3-0.6B request is
#: 640 cross-layer blocks of 1.75 MiB (xlkv), or 56 x 32 KiB per block (stock up to 0.25)
SHAPES = {"cross-layer": (640, 1835008), "stock": (3584, 32768)}


def _target(conn, nbytes, device):
    import torch
    from nixl._api import nixl_agent, nixl_agent_config
    torch.cuda.set_device(device)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    agent = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(src.data_ptr(), nbytes, device, "")], "VRAM")
    conn.send((agent.get_agent_metadata(), src.data_ptr(), int(src.to(torch.int64).sum().item())))
    conn.recv()   # the reader is done
    conn.close()


def _reader(conn, nbytes, device, n, bb, reps):
    import torch
    from nixl._api import nixl_agent, nixl_agent_config
    torch.cuda.set_device(device)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    agent = nixl_agent("reader", nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    agent.register_memory([(dst.data_ptr(), nbytes, device, "")], "VRAM")
    meta, src_base, src_sum = conn.recv()
    remote = agent.add_remote_agent(meta)
    lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.data_ptr() + i * bb, bb, device) for i in range(n)], "VRAM")
    rh = agent.prep_xfer_dlist(remote, [(src_base + i * bb, bb, 0) for i in range(n)], "VRAM")
    ids = list(range(n))
    times, ok = [], True
    for _ in range(reps):
        dst.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = agent.make_prepped_xfer("READ", lh, ids, rh, ids, b"probe")
        state = agent.transfer(h)
        while state == "PROC":
            state = agent.check_xfer_state(h)
        times.append((time.perf_counter() - t0) * 1e3)
        agent.release_xfer_handle(h)
        torch.cuda.synchronize()
        ok = ok and state == "DONE" and int(dst.to(torch.int64).sum().item()) == src_sum
    conn.send({"ms": [round(t, 3) for t in times], "bytes_ok": ok})
    conn.close()


def proto_tables(text, limit=400):
    """UCX_PROTO_INFO's tables for the endpoints to the peer (a process's tables for its own
    "self" endpoint are left out), and every line naming cuda_ipc (UCX_LOG_LEVEL=debug)."""
    keep, block_is_peer = [], False
    for ln in text.splitlines():
        body = re.sub(r"^(\[[^]]*\]\s*)+", "", ln).strip()   # UCX's [time] [host:pid:thread] prefix
        if "cfg#" in body:
            block_is_peer = " self cfg#" not in body
        if ("|" in body and block_is_peer) or "cuda_ipc" in body:
            keep.append(body)
    return keep[:limit]


def child(args):
    """One variant: target and reader processes; prints one JSON line."""
    n, bb = args.blocks, args.block_bytes
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    c, d = ctx.Pipe()
    t = ctx.Process(target=_target, args=(a, n * bb, 0))
    r = ctx.Process(target=_reader, args=(d, n * bb, args.reader_device, n, bb, args.reps))
    t.start()
    r.start()

    def recv(conn):   # a child that died (no GPU, no NIXL) ends the variant instead of hanging it
        while not conn.poll(0.5):
            if not (t.is_alive() and r.is_alive()):
                raise SystemExit("a probe process died (exit codes: target %s, reader %s)" % (t.exitcode, r.exitcode))
        return conn.recv()
    c.send(recv(b))        # target's metadata -> reader
    res = recv(c)          # reader's result
    b.send("done")
    r.join(60)
    t.join(60)
    print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variant", action="append", default=[], help="NAME=VAR=VALUE;VAR=VALUE")
    ap.add_argument("--shape", action="append", default=[], help="NAME=BLOCKS:BYTES")
    ap.add_argument("--reader-device", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--block-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=120)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    variants = dict(VARIANTS)
    if args.variant:   # NAME (one of VARIANTS) or NAME=VAR=VALUE;VAR=VALUE
        variants = {}
        for v in args.variant:
            name, _, env = v.partition("=")
            variants[name] = dict(kv.split("=", 1) for kv in env.split(";")) if env else VARIANTS[name]
    shapes = dict(SHAPES)
    if args.shape:
        shapes = {}
        for s in args.shape:
            name, _, spec = s.partition("=")
            blocks, _, nbytes = spec.partition(":")
            shapes[name] = (int(blocks), int(nbytes))
    out = {"command": " ".join(["python"] + sys.argv), "reader_device": args.reader_device,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    try:
        from importlib import metadata
        out["nixl"] = metadata.version("nixl")
        import torch
        out["torch"], out["gpu"] = torch.__version__, torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001 - recorded, the children will fail loudly
        out["env_error"] = repr(e)
    bad = 0
    for vname, venv in variants.items():
        for sname, (n, bb) in shapes.items():
            env = dict(os.environ, UCX_PROTO_INFO="y", **venv)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--blocks", str(n), "--block-bytes", str(bb),
                   "--reps", str(args.reps), "--reader-device", str(args.reader_device)]
            t0 = time.time()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                text, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                               for x in (e.stdout, e.stderr))
                rc = "timeout"
            res = None
            for line in text.splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
            proto = proto_tables(text)
            row = {"variant": vname, "env": venv, "shape": sname, "descriptors": n, "block_bytes": bb,
                   "total_mb": round(n * bb / 1e6, 1), "rc": rc, "wall_s": round(time.time() - t0, 1),
                   "proto_info": proto}
            if res:
                ms = sorted(res["ms"])
                med = ms[len(ms) // 2]
                row.update(ms=res["ms"], median_ms=med, gb_per_s=round(n * bb / med / 1e6, 2), bytes_ok=res["bytes_ok"])
                bad |= not res["bytes_ok"]
                print("%-8s %-12s %5d x %8d B  median %9.2f ms  %7.2f GB/s  bytes %s" % (
                    vname, sname, n, bb, med, row["gb_per_s"], "ok" if res["bytes_ok"] else "WRONG"), flush=True)
            else:
                row["tail"] = text.splitlines()[-25:]
                bad = 1
                print("%-8s %-12s FAILED rc=%s\n  %s" % (vname, sname, rc, "\n  ".join(row["tail"])), flush=True)
            out["runs"].append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
