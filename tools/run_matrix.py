#!/usr/bin/env python3
"""Compatibility matrix: every vLLM release, really installed, really transferring.

    python3 tools/run_matrix.py [--releases "0.12.0 0.13.0 ..."] \
        [--out experiments/results/compat-matrix.json] [--logs /tmp/xlkv-matrix]

For each release: tests/harness/mkenv.sh installs it (a base environment per torch pin, an
overlay environment per other release of that pin), the shim is installed into that environment (editable:
.pth + entry point), then

1. ``python -m xlkv_autopatch status --json`` (every patch target resolves),
2. the P->D harness with the flag off (stock) and on (ENABLE_XLKV=true on both),
3. the harness with ENABLE_XLKV on the decode side only (must be refused at handshake),
4. the safety cases, each with ENABLE_XLKV on both sides (``SAFETY``): NixlConnector inside a
   MultiConnector on one side, a plain one on the other (must transfer exactly, cross-layer);
   a MultiConnector with a child that takes no cross-layer blocks (must never transfer); a
   16-token kernel block under 32-token KV blocks (must transfer exactly: cross-layer up to
   0.28, the stock layout with a WARNING from 0.29); tensors with 10 blocks more than the
   budget (must transfer exactly, blocks beyond the budget included, up to 0.28; refused
   with the cause from 0.29); prefill TP 1 -> decode TP 2 (two decode ranks: allowed and
   exact, one descriptor per block, on 0.12-0.22 and 0.26-0.28; refused at handshake with
   the cause on 0.23-0.25 and 0.29+),
5. from the stock and xlkv runs, the descriptors NIXL really moved (its telemetry) for the
   block orders of a loaded server (``ORDER_CASES``: both sides descending, interleaved runs,
   a prefix-cache hit on D): with xlkv they must merge to 1, 2 and 1 per cross-layer region
   (``merged_descriptors`` in the row; bytes are compared in every case); and one more xlkv
   run of those cases with the ordering off (``XLKV_COALESCE=false``), which must keep vLLM's
   order: one descriptor per block and cross-layer region (``xlkv_keep_order``),
6. where the release has vLLM's push connector (``NixlPushConnector``: P WRITEs into D's
   blocks), the harness with ``--transfer push``, stock and xlkv, on the block-order cases and
   ``noncontig``: bytes compared, the descriptors P's agent moved (``push`` in the row; with
   xlkv they must merge as in 5); ``push: {"available": false}`` where the release has none,

and one row is written (rows of other releases already in --out are kept):
``{vllm, mechanism, status: pass|fail|unsupported, descriptors_per_block_stock,
descriptors_per_block_xlkv, transfer_verified, notes, details}``.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(ROOT, "tests", "harness", "pd_harness.py")
ALL = ("0.11.2 0.12.0 0.13.0 0.14.1 0.15.1 0.16.0 0.17.1 0.18.1 0.19.1 0.20.2 0.21.0 0.22.1 0.23.0 0.24.0 "
       "0.25.1 0.26.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0")
MECHANISMS = {
    "backport": "backport: prefer_cross_layer_blocks + register_cross_layers_kv_cache redirect",
    "native": "native opt-in (enable_cross_layers_blocks) enabled from the flag",
    "runner": "native opt-in + V1 model runner forced",
    "layout": "block-outermost KV cache layout (BLNHC)",
}


def mechanism(release):
    v = tuple(int(x) for x in release.split(".")[:2])
    if v < (0, 12):
        return "none (unsupported)"
    if v < (0, 16):
        return MECHANISMS["backport"]
    if v < (0, 22):
        return MECHANISMS["native"]
    if v < (0, 29):
        return MECHANISMS["runner"]
    return MECHANISMS["layout"]


#: the harness's block-order cases and the NIXL descriptors each must come to with xlkv's
#: descriptor ordering (patches/transfer_order.py), per cross-layer descriptor of a block
ORDER_CASES = {"reversed": 1, "interleaved": 2, "shared": 1}


def merged_descriptors(stock, xlkv, keep_order=None):
    """{case: {blocks, stock, xlkv, expected_xlkv[, xlkv_keep_order, expected_keep_order]}} of
    the descriptors NIXL moved (its telemetry, after merging) for the block-order cases, plus
    "problems"; {} on releases whose vLLM reads no NIXL telemetry.  keep_order: the xlkv run
    with XLKV_COALESCE=false (vLLM's descriptor order: one descriptor per block and region,
    since none of these cases lists a run that continues on both sides).  Every count is
    taken only from a case whose bytes were compared and found exact."""
    out, problems = {}, []
    per = xlkv.get("descs_per_block") or 0
    for case, merged in ORDER_CASES.items():
        s, x = (stock.get("cases") or {}).get(case) or {}, (xlkv.get("cases") or {}).get(case) or {}
        if "nixl_descs" not in x:
            continue
        want = merged * per if xlkv.get("cross_layer") else None
        blocks = len(x.get("local_block_ids") or [])
        out[case] = {"blocks": blocks, "stock": s.get("nixl_descs"),
                     "xlkv": x["nixl_descs"], "expected_xlkv": want}
        for name, run in (("stock", s), ("xlkv", x)):
            if not run.get("bytes_ok"):
                problems.append("%s blocks, %s: bytes not exact" % (case, name))
        if want is not None and x["nixl_descs"] != want:
            problems.append("%s blocks: NIXL moved %s descriptors with xlkv, %s expected"
                            % (case, x["nixl_descs"], want))
        if keep_order is not None:
            k = (keep_order.get("cases") or {}).get(case) or {}
            want_k = blocks * per if keep_order.get("cross_layer") else None
            out[case]["xlkv_keep_order"] = k.get("nixl_descs")
            out[case]["expected_keep_order"] = want_k
            if not k.get("bytes_ok"):
                problems.append("%s blocks, xlkv with XLKV_COALESCE=false: bytes not exact" % case)
            if want_k is None or k.get("nixl_descs") != want_k:
                problems.append("%s blocks: NIXL moved %s descriptors with XLKV_COALESCE=false, %s expected"
                                % (case, k.get("nixl_descs"), want_k))
    if out and problems:
        out["problems"] = problems
    return out


ORDER_ARGS = [a for c in ORDER_CASES for a in ("--case", c)]
PUSH_CASES = ["noncontig"] + list(ORDER_CASES)


def has_push_connector(py, logs):
    """Whether this release's connector factory knows NixlPushConnector (checked in its env)."""
    r = sh([py, "-c", "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as F; "
                      "print('NixlPushConnector' in getattr(F, '_registry', {}))"], os.path.join(logs, "push-probe.log"))
    return r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == ["True"]


def push_results(stock, xlkv):
    """The push runs (--transfer push) as a row field, plus its problems.  A case that stock vLLM's
    own push gets wrong is recorded in ``vllm_failures`` (vLLM's behaviour, not the shim's); there
    the shim must produce the very same result (same mismatches), everywhere else exact bytes."""
    out = {"available": True, "connector": "NixlPushConnector", "cases": PUSH_CASES, "problems": []}
    keys = ("ok", "bytes_ok", "transfer", "xfer_descs", "nixl_descs", "num_mismatches", "failure_reason")
    for name, d in (("stock", stock), ("xlkv", xlkv)):
        out[name] = {"transfer_verified": bool(d.get("transfer_verified")), "cross_layer": d.get("cross_layer"),
                     "descs_per_block": d.get("descs_per_block"),
                     "connector_class": (d.get("p") or {}).get("connector_class"),
                     "errors": [str(e)[:400] for e in d.get("errors") or []][:3],
                     "cases": {c: {k: (str(v.get(k))[:400] if k == "failure_reason" else v.get(k)) for k in keys}
                               for c, v in (d.get("cases") or {}).items()}}
        if set(out[name]["cases"]) != set(PUSH_CASES):
            out["problems"].append("push, %s: ran %s: %s" % (name, sorted(out[name]["cases"]),
                                                           (d.get("errors") or ["?"])[0][:200]))
        if not str(out[name]["connector_class"]).endswith("NixlPushConnector"):
            out["problems"].append("push, %s: the harness ran %s" % (name, out[name]["connector_class"]))
        if any(v.get("transfer") != "push" for v in (d.get("cases") or {}).values()):
            out["problems"].append("push, %s: a case did not run as a push" % name)
    sc, xc = out["stock"]["cases"], out["xlkv"]["cases"]
    # stock's own failures: the transfer completed but wrote other blocks' bytes (vLLM's pairing)
    out["vllm_failures"] = {c: "stock push: %s mismatches" % v.get("num_mismatches")
                            for c, v in sc.items() if v.get("ok") is False}
    for c, v in xc.items():
        if c in out["vllm_failures"]:
            if v.get("num_mismatches") != sc[c].get("num_mismatches"):
                out["problems"].append("push %s: xlkv %s mismatches, stock %s" % (
                    c, v.get("num_mismatches"), sc[c].get("num_mismatches")))
        elif v.get("ok") is not True:
            out["problems"].append("push, xlkv, %s: not exact: %s" % (c, v.get("failure_reason")))
    if xlkv.get("cross_layer") is not True:
        out["problems"].append("push, xlkv: not cross-layer")
    order = merged_descriptors(stock, xlkv)
    out["merged_descriptors"] = {c: v for c, v in order.items() if c != "problems"}
    out["problems"].extend(p for p in order.get("problems", [])
                           if not any(p.startswith("%s blocks, " % c) for c in out["vllm_failures"]))
    if len(out["merged_descriptors"]) != len(ORDER_CASES):
        out["problems"].append("push: NIXL telemetry missing for %s"
                               % sorted(set(ORDER_CASES) - set(out["merged_descriptors"])))
    out["as_expected"] = not out["problems"]
    return out


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH", "XLKV_VLLM_VERSION",
                                                            "VLLM_KV_CACHE_LAYOUT", "XLKV_STRICT")}
    env.update(extra or {})
    return env


def sh(cmd, log, env=None, timeout=3600):
    with open(log, "a") as f:
        f.write("\n$ %s\n" % " ".join(cmd))
        f.flush()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=clean_env(env), cwd=ROOT,
                           timeout=timeout)
    return r


def harness(py, logs, name, args, env=None):
    out = os.path.join(logs, name + ".json")
    if os.path.exists(out):
        os.remove(out)
    log = os.path.join(logs, name + ".log")
    t0 = time.time()
    try:
        sh([py, HARNESS, "--out", out, "--timeout", "60"] + args, log, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return {"errors": ["harness timed out"], "transfer_verified": False, "_s": round(time.time() - t0)}
    if not os.path.exists(out):
        return {"errors": ["no result; see %s" % log], "transfer_verified": False}
    data = json.load(open(out))
    data["_s"] = round(time.time() - t0)
    data["_log_text"] = open(log).read()[-20000:]
    return data


def _rel(release):
    return tuple(int(x) for x in release.split(".")[:2])


def _text(d):
    return json.dumps(d.get("errors")) + json.dumps([d.get("p", {}).get("xlkv_log"), d.get("d", {}).get("xlkv_log")]) \
        + d.get("_log_text", "")


def _safety_multi(release, py, logs):
    # before 0.16 vLLM's MultiConnector cannot serve the NIXL handshake: it is the decode side
    side = "--p-connector" if _rel(release) >= (0, 16) else "--d-connector"
    d = harness(py, logs, "multi", [side, "multi"], env={"ENABLE_XLKV": "true"})
    ok = bool(d.get("transfer_verified")) and d.get("p", {}).get("cross_layer") is True \
        and d.get("d", {}).get("cross_layer") is True
    return d, ok, "%s MultiConnector, other side plain: %s" % (side[2], "exact, cross-layer" if ok else "FAILED")


def _safety_multi_mixed(release, py, logs):
    d = harness(py, logs, "multi-mixed", ["--case", "noncontig", "--d-connector", "multi-mixed"],
                env={"ENABLE_XLKV": "true"})
    text = _text(d)
    ok = not d.get("transfer_verified") and ("NIXL handshake refused" in text or "hash mismatch" in text)
    if _rel(release) < (0, 29):
        ok = ok and "also runs" in text and d.get("d", {}).get("cross_layer") is False
    named = "NIXL handshake refused" in text
    return d, ok, "MultiConnector with a non-cross-layer child: %s" % (
        ("refused (%s)" % ("xlkv names the cause" if named else "vLLM's hash check")) if ok else "NOT refused")


def _safety_kernel(release, py, logs):
    d = harness(py, logs, "kernel-block", ["--kernel-block-size", "16", "--p-block-size", "32", "--d-block-size", "32"],
                env={"ENABLE_XLKV": "true"})
    cases = (d.get("cases") or {}).values()
    if _rel(release) >= (0, 29):
        ok = bool(d.get("transfer_verified")) and d.get("cross_layer") is False and "is smaller than the KV block" in _text(d)
        return d, ok, "kernel block 16 < block 32: %s" % ("stock layout + WARNING, exact" if ok else "FAILED")
    ok = bool(d.get("transfer_verified")) and d.get("cross_layer") is True and cases and \
        all(c.get("xfer_descs_per_block") == 2 for c in cases)
    return d, ok, "kernel block 16 < block 32: %s" % ("exact, 2 descriptors per block" if ok else "FAILED")


def _safety_over(release, py, logs):
    d = harness(py, logs, "over-allocated", ["--over-allocate", "10"], env={"ENABLE_XLKV": "true"})
    if _rel(release) >= (0, 29):
        ok = not d.get("transfer_verified") and "vLLM cannot register this KV cache with NIXL" in _text(d)
        return d, ok, "over-allocated tensors: %s" % ("refused with the cause" if ok else "NOT refused")
    ok = bool(d.get("transfer_verified")) and (d.get("cases") or {}).get("virtual", {}).get("ok") is True
    return d, ok, "over-allocated tensors: %s" % ("exact, blocks beyond the budget included" if ok else "FAILED")


def hetero_tp_allowed(release):
    """Where xlkv lets prefill TP 1 -> decode TP 2 through (FLASH_ATTN cross-layer blocks keep
    heads outermost); refused with the cause on 0.23-0.25 and 0.29+."""
    v = _rel(release)
    return (0, 12) <= v < (0, 23) or (0, 26) <= v < (0, 29)


def _safety_hetero_tp(release, py, logs):
    d = harness(py, logs, "hetero-tp", ["--d-tp", "2"], env={"ENABLE_XLKV": "true"})
    cases = (d.get("cases") or {}).values()
    if hetero_tp_allowed(release):
        ok = bool(d.get("transfer_verified")) and d.get("descs_per_block") == 1 and cases and all(
            [x.get("xfer_descs_per_block") for x in c.get("ranks") or []] == [1, 1] for c in cases)
        return d, ok, "prefill TP 1 -> decode TP 2: %s" % (
            "allowed, each decode rank exact, 1 descriptor per block" if ok else "FAILED")
    ok = not d.get("transfer_verified") and "heterogeneous TP" in _text(d) and \
        "NIXL handshake refused: prefill TP 1, decode TP 2" in _text(d)
    return d, ok, "prefill TP 1 -> decode TP 2: %s" % ("refused with the cause" if ok else "NOT refused")


SAFETY = (("multiconnector", _safety_multi), ("multiconnector_mixed", _safety_multi_mixed),
          ("kernel_block", _safety_kernel), ("over_allocated", _safety_over),
          ("hetero_tp", _safety_hetero_tp))


ONLY_ORDER = False


def run_release(release, logs):
    logs = os.path.join(logs, release)
    os.makedirs(logs, exist_ok=True)
    row = {"vllm": release, "mechanism": mechanism(release), "status": "fail",
           "descriptors_per_block_stock": None, "descriptors_per_block_xlkv": None,
           "transfer_verified": False, "notes": "", "details": {}}
    r = sh(["bash", os.path.join(ROOT, "tests", "harness", "mkenv.sh"), release], os.path.join(logs, "mkenv.log"))
    if r.returncode != 0:
        row["notes"] = "could not install vLLM %s (see mkenv.log)" % release
        return row
    py = r.stdout.strip().splitlines()[-1]
    sh([py, "-m", "pip", "install", "-q", "wrapt>=1.14", "packaging>=21"], os.path.join(logs, "shim.log"))
    r = sh([py, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT], os.path.join(logs, "shim.log"))
    if r.returncode != 0:
        row["notes"] = "could not install the shim"
        return row
    st = sh([py, "-m", "xlkv_autopatch", "status", "--json"], os.path.join(logs, "status.log"))
    try:
        status = json.loads(st.stdout)
    except ValueError:
        status = {"ok": False, "problems": ["status printed no JSON"]}
    row["details"]["status_ok"] = status.get("ok")
    row["details"]["patch_sets"] = [g["name"] for g in status.get("patch_sets", []) if g.get("applies")]
    if not status.get("supported"):
        probe = sh([py, "-c", "import vllm.distributed.kv_transfer.kv_connector.factory"],
                   os.path.join(logs, "refusal.log"), env={"ENABLE_XLKV": "1"})
        text = open(os.path.join(logs, "refusal.log")).read()
        refused = probe.returncode != 0 and "is not supported" in text
        row["status"] = "unsupported"
        row["notes"] = ("ENABLE_XLKV refuses this release at vLLM import (%s)" % (
            "checked" if refused else "NOT refused: check refusal.log"))
        row["details"]["refused"] = refused
        return row
    stock = harness(py, logs, "stock", [])
    xlkv = harness(py, logs, "xlkv", [], env={"ENABLE_XLKV": "true"})
    if ONLY_ORDER:  # --only-order: the descriptor-order and push runs only
        mismatch, refused = {}, None
        row["details"]["partial"] = ("--only-order: the stock, xlkv, ordering-off and push runs only; the decode-only "
                                     "refusal and the safety cases were not run")
    else:
        mismatch = harness(py, logs, "decode-only", ["--case", "noncontig", "--d-env", "ENABLE_XLKV=1"])
        refused = (not mismatch.get("transfer_verified")) and "NIXL handshake refused" in (
            json.dumps(mismatch.get("errors")) + mismatch.get("_log_text", ""))
    row["descriptors_per_block_stock"] = stock.get("descs_per_block")
    row["descriptors_per_block_xlkv"] = xlkv.get("descs_per_block")
    row["transfer_verified"] = bool(stock.get("transfer_verified") and xlkv.get("transfer_verified"))
    for name, d in (("stock", stock), ("xlkv", xlkv), ("decode_only", mismatch)):
        row["details"][name] = {k: d.get(k) for k in ("cross_layer", "num_regions", "descs_per_block", "block_len",
                                                     "kv_layout", "backend", "transfer_verified", "_s")}
        row["details"][name]["errors"] = [str(e)[:400] for e in d.get("errors") or []]
        row["details"][name]["cases"] = {c: v.get("ok") for c, v in (d.get("cases") or {}).items()}
    row["details"]["decode_only_refused"] = refused
    # the ordering off (XLKV_COALESCE=false) on the block-order cases: vLLM's own order
    keep = harness(py, logs, "xlkv-keep-order", ORDER_ARGS, env={"ENABLE_XLKV": "true", "XLKV_COALESCE": "false"})
    row["details"]["xlkv_keep_order"] = {k: keep.get(k) for k in ("cross_layer", "descs_per_block",
                                                                  "transfer_verified", "_s")}
    row["details"]["xlkv_keep_order"]["errors"] = [str(e)[:400] for e in keep.get("errors") or []][:3]
    order = merged_descriptors(stock, xlkv, keep)
    if order:
        row["merged_descriptors"] = order
    # vLLM's push connector (WRITE), where the release has it
    if has_push_connector(py, logs):
        push_args = [a for c in PUSH_CASES for a in ("--case", c)] + ["--transfer", "push"]
        row["push"] = push_results(harness(py, logs, "push-stock", push_args),
                                   harness(py, logs, "push-xlkv", push_args, env={"ENABLE_XLKV": "true"}))
    else:
        row["push"] = {"available": False, "connector": None}
    safety_problems, safety_notes = [], []
    for name, fn in (() if ONLY_ORDER else SAFETY):
        d, ok, note = fn(release, py, logs)
        row["details"][name] = {k: d.get(k) for k in ("cross_layer", "num_regions", "descs_per_block",
                                                     "transfer_verified", "_s")}
        row["details"][name]["cases"] = {c: v.get("ok") for c, v in (d.get("cases") or {}).items()}
        row["details"][name]["errors"] = [str(e)[:400] for e in d.get("errors") or []][:3]
        row["details"][name]["as_expected"] = ok
        row["details"][name]["note"] = note
        (safety_notes if ok else safety_problems).append(note)
        if name == "hetero_tp":  # its own row field: the rule this release must follow
            row["hetero_tp_1to2"] = {"expected": "allowed" if hetero_tp_allowed(release) else "refused",
                                     "transfer_verified": bool(d.get("transfer_verified")),
                                     "descs_per_block": d.get("descs_per_block"), "as_expected": ok}
    row["details"]["safety_cases_passed"] = "not run" if ONLY_ORDER else "%d/%d" % (len(safety_notes), len(SAFETY))
    s, x = row["descriptors_per_block_stock"], row["descriptors_per_block_xlkv"]
    problems = []
    if not status.get("ok"):
        problems.append("status: %s" % "; ".join(status.get("problems", []))[:300])
    if not stock.get("transfer_verified"):
        problems.append("stock transfer not verified: %s" % (stock.get("errors") or ["?"])[0][:200])
    if not xlkv.get("transfer_verified"):
        problems.append("xlkv transfer not verified: %s" % (xlkv.get("errors") or ["?"])[0][:200])
    if not (isinstance(s, int) and isinstance(x, int) and x <= 2 and x < s):
        problems.append("descriptors per block stock %s, xlkv %s" % (s, x))
    if not refused and not ONLY_ORDER:
        problems.append("decode-only ENABLE_XLKV was not refused at handshake")
    problems.extend(order.get("problems", []) if order else [])
    problems.extend(row["push"].get("problems", []))
    problems.extend(safety_problems)
    row["status"] = "fail" if problems else "pass"
    row["notes"] = "; ".join(problems) if problems else (
        "cross-layer %s, %s region(s), %s B per block; %s"
        % (xlkv.get("cross_layer"), xlkv.get("num_regions"), xlkv.get("block_len"),
           "only the order and push runs (--only-order)" if ONLY_ORDER else
           "decode-only flag refused at handshake; safety cases %s" % row["details"]["safety_cases_passed"]))
    return row


def shim_state():
    """The shim the run used (editable install of this checkout): HEAD and files changed since."""
    def git(*a):
        r = subprocess.run(["git"] + list(a), capture_output=True, text=True, cwd=ROOT)
        return r.stdout.rstrip("\n") if r.returncode == 0 else None
    dirty = git("status", "--porcelain", "--", "xlkv_autopatch", "setup.py", "setup.cfg", "xlkv_autopatch.pth")
    return {"commit": (git("rev-parse", "--short", "HEAD") or "").strip() or None,
            "uncommitted": [line[3:] for line in (dirty or "").splitlines()]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", default=ALL)
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "compat-matrix.json"))
    ap.add_argument("--logs", default="/tmp/xlkv-matrix")
    ap.add_argument("--only-order", action="store_true",
                    help="only the stock, xlkv, ordering-off (XLKV_COALESCE=false) and push runs; the row says so "
                         "(details.partial) and is not a support-table row by itself")
    args = ap.parse_args()
    global ONLY_ORDER
    ONLY_ORDER = args.only_order
    # run a snapshot of the harness (the script and its package beside it), so edits during a
    # long matrix run cannot break it
    global HARNESS
    os.makedirs(args.logs, exist_ok=True)
    snapshot = os.path.join(args.logs, "pd_harness.py")
    shutil.copyfile(HARNESS, snapshot)
    package = os.path.join(args.logs, "pdharness")
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(os.path.join(os.path.dirname(HARNESS), "pdharness"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    HARNESS = snapshot
    rows = {}
    if os.path.exists(args.out):
        for r in json.load(open(args.out)).get("rows", []):
            rows[r["vllm"]] = r
    for release in args.releases.split():
        t0 = time.time()
        shim_at_start = shim_state()
        try:
            row = run_release(release, args.logs)
        except Exception as e:  # record and go on with the next release
            row = {"vllm": release, "mechanism": mechanism(release), "status": "fail",
                   "descriptors_per_block_stock": None, "descriptors_per_block_xlkv": None,
                   "transfer_verified": False, "notes": "runner error: %s: %s" % (type(e).__name__, e), "details": {}}
        row["details"]["seconds"] = round(time.time() - t0)
        row["details"]["date"] = datetime.date.today().isoformat()
        row["details"]["shim"] = {"at_start": shim_at_start, "at_end": shim_state()}
        rows[release] = row
        print("%-8s %-11s stock %-4s xlkv %-4s verified %-5s %s" % (
            release, row["status"], row["descriptors_per_block_stock"], row["descriptors_per_block_xlkv"],
            row["transfer_verified"], row["notes"][:160]), flush=True)
        ordered = sorted(rows.values(), key=lambda r: tuple(int(x) for x in r["vllm"].split(".")))
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"command": "python3 tools/run_matrix.py --releases '%s'" % args.releases,
                       "harness": "tests/harness/pd_harness.py (fakecuda platform, FLASH_ATTN, HND, 4 layers, "
                                  "2 KV heads, head 64, bf16, block 16; real NIXL UCX on host memory)",
                       "rows": ordered}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
