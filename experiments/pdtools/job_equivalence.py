"""The equivalence job (experiments/pd_equivalence.sh): greedy outputs of P/D with and without
the shim, the KV every P/D answer moved, the shim's descriptors per block, negative controls.

What it checks, its settings (EQ_*) and exit codes: experiments/README.md, "pd_equivalence.sh".
For each config in EQ_CONFIGS a fresh 1P1D pair serves the fixed prompts (a) to D alone (local
prefill) and (b) through the proxy (P/D, with the blocks D pulled per request); then a
single-request probe of PROBE_LEN tokens gives the descriptors per block (id).  A negative
control ``nc-<cfg>`` runs right after <cfg> with P kept and only D restarted.
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

from . import configs, equivalence
from .cpuchecks import require_gpus_or_cpu_checks
from .gates import shim
from .pair import Pair, log_offset
from .prompts import DEFAULT_EQ_LENGTHS
from .runs import (corruption_description, kv_probe, load_json, parse_lengths, prom_scrape, run_to_file,
                   summary_to_file)
from .settings import (EXIT_FAIL, EXIT_SETUP, EXIT_UNSUPPORTED, die, log, python_path, require_vllm,
                       vllm_package_dir)
from .vllminfo import vllm_has_batch_invariant

#: EQ_REFERENCE: "auto" (by the model's family) or one of the summary's references
REFERENCES = ("auto",) + equivalence.REFERENCES


def _batch_invariant(settings, version, env):
    """EQ_BATCH_INVARIANT=auto|1|0 -> True when every server gets VLLM_BATCH_INVARIANT=1 (the vLLM
    that children of ``env`` import knows it), else False (they get no VLLM_BATCH_INVARIANT)."""
    want = settings.get("EQ_BATCH_INVARIANT", "auto")
    pkg = vllm_package_dir(python_path(env))
    known = bool(pkg) and vllm_has_batch_invariant(pkg)
    if want == "0":
        log("kernels: vLLM defaults (EQ_BATCH_INVARIANT=0)")
        return False
    if known:
        log("kernels: VLLM_BATCH_INVARIANT=1 (deterministic; EQ_BATCH_INVARIANT=0 for vLLM's defaults)")
        return True
    if want == "1":
        die(EXIT_SETUP, "EQ_BATCH_INVARIANT=1, but vLLM %s does not know VLLM_BATCH_INVARIANT (it would be ignored). "
            "Use EQ_BATCH_INVARIANT=0." % version)
    log("kernels: vLLM defaults (vLLM %s has no VLLM_BATCH_INVARIANT)" % version)
    return False


def _check_options(settings):
    if settings.get("EQ_BATCH_INVARIANT", "auto") not in ("auto", "0", "1"):
        die(EXIT_SETUP, "EQ_BATCH_INVARIANT must be auto, 0 or 1 (got '%s')" % settings.get("EQ_BATCH_INVARIANT"))
    if settings.get("EQ_REFERENCE", "auto") not in REFERENCES:
        die(EXIT_SETUP, "EQ_REFERENCE must be %s or %s (got '%s')"
            % (", ".join(REFERENCES[:-1]), REFERENCES[-1], settings.get("EQ_REFERENCE")))


def _order(eq_configs, nc_configs):
    """Each negative control right after its own config (it keeps that config's P)."""
    ordered = []
    for cfg in eq_configs:
        ordered.append(cfg)
        ordered += [c for c in nc_configs if c == configs.NEGATIVE_PREFIX + cfg]
    return ordered + [c for c in nc_configs if c not in ordered]


def main(settings, eq_json=None):
    """The job with the door's ``settings``; the summary goes to ``eq_json`` (default EQ_JSON, else
    WORK/equivalence.json).  Its exit code."""
    s = settings
    _check_options(s)
    eq_configs = s.get("EQ_CONFIGS", "stock shim").split()
    lengths_text = s.get("EQ_LENGTHS", ",".join(map(str, DEFAULT_EQ_LENGTHS)))
    lengths = parse_lengths(lengths_text)
    max_tokens, n_logprobs = s.get_int("EQ_MAX_TOKENS", "32"), s.get_int("EQ_LOGPROBS", "5")
    tol = float(s.get("EQ_LOGPROB_TOL", "0"))
    nc_request = s.get("EQ_NEGATIVE_CONTROL", "")
    corruption_how = s.get("NC_CORRUPTION", "shift")
    nc_lengths = parse_lengths(s.get("EQ_NC_LENGTHS") or lengths_text)
    kv_wait = float(s.get("EQ_KV_WAIT", "15"))
    probe_len = s.get_int("PROBE_LEN", "1600")
    work = s.get("WORK")
    eq_json = eq_json or s.get("EQ_JSON") or os.path.join(work, "equivalence.json")
    # EQ_SERVE_ARGS set but empty: no flags of its own (it is read as is, not through the defaults)
    serve_args = "%s %s" % (s.environ.get("EQ_SERVE_ARGS", "--no-enable-prefix-caching"), s.get("SERVE_EXTRA_ARGS"))
    fragment_n = s.get_int("EQ_FRAGMENT", "0")
    include = s.get("EQ_INCLUDE", "").split()

    pair = Pair(s, serve_args=shlex.split(serve_args))
    with pair:
        require_gpus_or_cpu_checks(pair)
        pair.version = version = require_vllm(pair.child_env())
        pair.ensure_model()
        reference = s.get("EQ_REFERENCE", "auto")
        if reference == "auto":
            # vLLM's own P/D differs from one whole prefill for latent and sliding-window attention
            reference = "local" if pair.shape.attention == shim("families").FULL else "pd-stock"
            log("reference: %s (EQ_REFERENCE=auto, a %s model)" % (reference, pair.model_family))
        else:
            log("reference: %s" % reference)
        if reference.startswith("pd-"):
            ref_cfg = reference[len("pd-"):]
            if ref_cfg not in eq_configs + include:
                die(EXIT_SETUP, "EQ_REFERENCE=%s compares with %s P/D: put %s in EQ_CONFIGS (or EQ_INCLUDE from "
                    "an earlier call)" % (reference, ref_cfg, ref_cfg))
        # a fresh start, except the files of the configs EQ_INCLUDE takes from an earlier call
        keep = {"eq-%s-%s.json" % (k, c) for c in include for k in ("local", "pd", "probe")} | \
            {"eq-%s-d-registration.json" % c for c in include}
        for name in os.listdir(work):
            if name.startswith("eq-") and name.endswith((".json", ".log")) and name not in keep:
                os.remove(os.path.join(work, name))
        if os.path.exists(pair.commands_file):
            os.remove(pair.commands_file)
        batch_invariant = _batch_invariant(s, version, pair.child_env())
        # every child of the pair from here on: VLLM_BATCH_INVARIANT=1, or none (not even the caller's)
        pair.env_changes["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else None
        if corruption_how not in ("shift", "swap-layers"):
            die(EXIT_SETUP, "NC_CORRUPTION must be shift or swap-layers (got '%s')" % corruption_how)
        nc_configs = [configs.NEGATIVE_PREFIX + c for c in nc_request.replace(",", " ").split()]
        for n in nc_lengths:
            if n not in lengths:
                die(EXIT_SETUP, "EQ_NC_LENGTHS: %d is not in EQ_LENGTHS (%s): a control needs the baseline's answer"
                    % (n, lengths_text))
        run_configs = []
        for cfg in _order(eq_configs, nc_configs):
            ok, why = configs.supported(cfg, version, s, pair.child_env())
            if ok:
                run_configs.append(cfg)
                continue
            print(why, file=sys.stderr)
            if cfg in ("shim", "nc-shim"):
                die(EXIT_UNSUPPORTED, "vLLM %s is not supported by the shim (see above)" % version)
            log("skipping %s" % cfg)
        if not run_configs:
            die(EXIT_SETUP, "no config to run")
        if reference == "local" and not include and all(configs.router(c) == "dynamo" for c in run_configs):
            die(EXIT_SETUP, "every config runs through Dynamo, whose decode worker has no endpoint of its own for local "
                "prefill: put a lab config first (EQ_CONFIGS=\"stock %s\")" % " ".join(eq_configs))

        pd_url, local_url = pair.url("proxy", "/v1/completions"), pair.url("D", "/v1/completions")
        prom_d = pair.url("D", "/metrics")
        runs, probes = {}, {}
        running = None      # the config whose pair still runs (kept for its negative control)
        path = lambda name: os.path.join(work, name)
        for cfg in run_configs:
            log("=== %s ===" % cfg)
            if running and cfg == configs.NEGATIVE_PREFIX + running:
                pair.restart_decode(cfg, "eq-" + cfg)
            else:
                pair.stop_all()
                pair.start_pair(cfg, "eq-" + cfg)
            pair.use_registration()
            if fragment_n > 0:
                log("%s: fragmenting the free block queues: %d prompts of mixed lengths around %s"
                    % (cfg, fragment_n, s.get("FRAG_LEN", "2048")))
                if not pair.fragmenting_load(pair.url("proxy", ""), fragment_n, s.get("FRAG_OUTPUT_LEN", "16"),
                                             path("eq-fragment-%s.log" % cfg)):
                    die(EXIT_FAIL, "fragmenting load failed (%s)" % cfg)
            running = None
            # through Dynamo's frontend: OpenAI's fields alone, the ids read back through the model's vocabulary
            vocab = equivalence.vocabulary(pair.model) if pair.router == "dynamo" else None
            pd_kw = dict(prom_url=prom_d, bytes_per_block=pair.bytes_per_block, kv_wait=kv_wait, logprobs=n_logprobs,
                         vocab=vocab)
            if cfg.startswith(configs.NEGATIVE_PREFIX):   # only P/D, through a D that corrupts what it received
                runs["pd:" + cfg] = run_to_file(pd_url, pair.model, "pd:" + cfg, nc_lengths, max_tokens,
                                                path("eq-pd-%s.json" % cfg), **pd_kw)
                with open(pair.d_log, errors="replace") as f:
                    lines = [l for l in f if "xlkv negative control:" in l][:3]
                if lines:
                    sys.stderr.write("".join(lines))
                else:
                    log("WARNING: no negative-control line in %s" % pair.d_log)
                pair.stop_all()
                continue
            # (a) local prefill on D, then (b) P/D through the proxy (with the KV D pulled per request); a Dynamo
            # worker has no HTTP server of its own: its configs are compared with the first config's local prefill
            if pair.router == "dynamo":
                log("%s: no local run (Dynamo's decode worker serves only through the frontend)" % cfg)
            else:
                runs["local:" + cfg] = run_to_file(local_url, pair.model, "local:" + cfg, lengths, max_tokens,
                                                   path("eq-local-%s.json" % cfg), logprobs=n_logprobs)
            runs["pd:" + cfg] = run_to_file(pd_url, pair.model, "pd:" + cfg, lengths, max_tokens,
                                            path("eq-pd-%s.json" % cfg), **pd_kw)
            # descriptor probe: one request of PROBE_LEN tokens (a whole number of blocks), alone;
            # first let the lines of the runs above be written (at most 20 s, or KV_WAIT if less)
            pair.wait_kv_lines(pair.d_log, 0, limit=min(float(s.get("KV_WAIT", "60")), 20))
            off = log_offset(pair.d_log)
            before = prom_scrape(prom_d)
            run_to_file(pd_url, pair.model, "probe:" + cfg, [probe_len], 2, path("eq-probe-run-%s.json" % cfg),
                        seed=7, logprobs=0, quiet=True, vocab=vocab)
            pair.wait_kv_lines(pair.d_log, off)
            after = prom_scrape(prom_d)
            for n, d in (("eq-prom0-%s.json" % cfg, before), ("eq-prom1-%s.json" % cfg, after)):
                with open(path(n), "w") as f:
                    json.dump(d, f)
            probes[cfg] = kv_probe(pair.d_log, off, before, after, pair.bytes_per_block, pair.d_log,
                                   pair.d_reg_report, probe_len, s.get_int("BLOCK_SIZE"))
            with open(path("eq-probe-%s.json" % cfg), "w") as f:
                json.dump(probes[cfg], f, sort_keys=True)
            running = cfg
        pair.stop_all()
    for cfg in include:      # runs of an earlier call (same WORK)
        found = False
        for kind in ("local", "pd"):
            d = load_json(path("eq-%s-%s.json" % (kind, cfg)))
            if d is not None:
                runs[d["label"]] = d["results"]
                found = True
        probe = load_json(path("eq-probe-%s.json" % cfg))
        if probe is not None:
            probes[cfg] = probe
        if not found:
            die(EXIT_SETUP, "EQ_INCLUDE: no run files of %s in %s" % (cfg, work))
        log("included from an earlier call: %s" % cfg)
    meta = {"model_family": pair.model_family, "model_shape": dataclasses.asdict(pair.shape), "reference": reference,
            "vllm_version": version, "gpu": pair.gpu_slug, "model": pair.model, "block_size": s.get_int("BLOCK_SIZE"),
            "tp_p": pair.tp_p, "tp_d": pair.tp_d, "probe_len": probe_len, "max_tokens": max_tokens,
            "serve_args": " ".join(serve_args.split()), "batch_invariant": batch_invariant,
            # the servers' own flag (pair.py adds --enforce-eager unless ENFORCE_EAGER=0), which serve_args omits
            "cuda_graphs": s.get("ENFORCE_EAGER") == "0",
            "logprobs": n_logprobs,
            "negative_control_requested": nc_request + (" (included: %s)" % " ".join(include) if include else ""),
            "fragment_prompts": fragment_n, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    corruption = None
    if nc_configs or any(c.startswith(configs.NEGATIVE_PREFIX) for c in include):
        corruption = corruption_description(corruption_how)
    s = summary_to_file(runs, probes, lengths, meta, eq_json, logprob_tol=tol, corruption=corruption,
                        reference=reference)
    log("summary JSON: %s" % eq_json)
    return 0 if s["pass"] else EXIT_FAIL


def resummarize(eq_json, work):
    """The summary ``eq_json`` judged again with this checkout's rules from the run files its job left in ``work``
    (eq-local-*.json, eq-pd-*.json, eq-probe-*.json): no server is started.  Runs through Dynamo get their chosen
    logprobs from their own top-k lists (``chosen_from_top``; the printed ones kept as ``logprobs_printed``), the
    ids mapped back to the lab tokenizer's strings (make_model.py: ``w<k>`` is id k).  The file is rewritten with
    ``resummarized``: when, by which commit, what the verdict was before.  Its exit code (0: pass)."""
    with open(eq_json) as f:
        old = json.load(f)
    runs, probes = {}, {}
    for name in sorted(os.listdir(work)):
        if not name.startswith(("eq-local-", "eq-pd-")) or not name.endswith(".json"):
            continue
        d = load_json(os.path.join(work, name))
        cfg = d["label"].split(":", 1)[1]
        if configs.router(cfg) == "dynamo":
            for r in d["results"]:
                if r.get("top_logprobs") and r.get("token_ids") is not None and "logprobs_printed" not in r:
                    exact = equivalence.chosen_from_top(["w%d" % t for t in r["token_ids"]], r["top_logprobs"])
                    r["logprobs_printed"] = r["logprobs"]
                    r["logprobs"] = [e if e is not None else c for e, c in zip(exact, r["logprobs"])]
        runs[d["label"]] = d["results"]
    for name in sorted(os.listdir(work)):
        if name.startswith("eq-probe-") and not name.startswith("eq-probe-run-") and name.endswith(".json"):
            probes[name[len("eq-probe-"):-len(".json")]] = load_json(os.path.join(work, name))
    order = [r["label"] for r in old.get("runs", [])] if isinstance(old.get("runs"), list) else []
    runs = {l: runs[l] for l in order if l in runs} or runs
    meta = {k: old[k] for k in ("model_family", "model_shape", "reference", "vllm_version", "gpu", "model",
                                "block_size", "tp_p", "tp_d", "probe_len", "max_tokens", "serve_args",
                                "batch_invariant", "cuda_graphs", "logprobs", "negative_control_requested",
                                "fragment_prompts", "date") if k in old}
    corruption = next((n.get("corruption") for n in old.get("negative_control") or [] if n.get("corruption")), None)
    meta["resummarized"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                     text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                                                     ).stdout.strip(),
                            "from": os.path.abspath(work), "pass_before": old.get("pass"),
                            "logprob_problems_before": old.get("logprob_problems"),
                            "descriptor_pass_before": old.get("descriptor_pass")}
    s = summary_to_file(runs, probes, old["prompt_lengths"], meta, eq_json, logprob_tol=old.get("logprob_tol", 0.0),
                        corruption=corruption, reference=old.get("reference", "local"))
    return 0 if s["pass"] else EXIT_FAIL
