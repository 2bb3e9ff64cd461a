"""The parent's side of one run: start P's and D's rank workers, wire the handshake, send
every case's request through P and D, check D's bytes, and build the result dict."""
import os
import queue as queue_mod
import tempfile
import time

from . import blocksizes, model
from .cases import CASES, REFUSED_PEER, expected_pairs, group_case, selected
from .checks import group_breakdown, join_reference, verify
from .netns import NetnsPair, link_flap
from .procs import Ranks, expect, parse_env, side_env


def _load():
    """The machine's load average (1, 5, 15 min) and cores: a wait that ran out on a loaded machine."""
    try:
        return "%s on %d cores" % ("/".join("%.1f" % x for x in os.getloadavg()), os.cpu_count() or 0)
    except OSError:
        return "unknown"


def new_result(args, env_p, env_d):
    return {"vllm": None, "platform": None, "backend": None, "kv_layout": None,
            "cross_layer": None, "num_regions": None, "descs_per_block": None,
            "block_len": None, "transfer_verified": False, "cases": {}, "errors": [],
            "env_p": {k: v for k, v in env_p.items()}, "env_d": {k: v for k, v in env_d.items()},
            "native_opt_in": args.native_opt_in, "transfer": args.transfer,
            "inherited": {k: os.environ[k] for k in os.environ
                          if k.startswith(("ENABLE_XLKV", "XLKV", "VLLM_KV_CACHE_LAYOUT",
                                           "VLLM_USE_V2"))}}


class PairRun:
    """One run: P (and a refused second prefill with --refused-peer-*) and D, the cases."""

    def __init__(self, args):
        self.args = args
        self.t_start = time.time()
        self.refused_peer = bool(args.refused_peer_block_size or args.refused_peer_env)
        self.tp_run = args.p_tp > 1 or args.d_tp > 1
        self.expected_owner = {}  # D block -> P block, of every case received so far
        # --p-block-size != --d-block-size: cases and checks token by token (blocksizes.py)
        self.bs = (args.p_block_size or model.BLOCK_SIZE, args.d_block_size or model.BLOCK_SIZE)
        self.hetero_bs = self.bs[0] != self.bs[1] and not (args.refused_peer_block_size or args.refused_peer_env)
        self.expected_tokens = {}  # with hetero_bs: D block -> its tokens' (P block, P token), so far

    def run(self):
        """Runs everything; returns the result dict (transfer_verified: every case passed)."""
        args = self.args
        cases = selected(args.case, args.over_allocate)
        both = parse_env(args.env)
        # --netns: P and D in two network namespaces joined by a veth pair (removed in finally)
        self.net = NetnsPair() if getattr(args, "netns", False) else None
        self.host = dict(self.net.addr) if self.net else {"p": "127.0.0.1", "d": "127.0.0.1"}
        net = self.net.env if self.net else (lambda side: None)
        env_p = side_env(both, args.p_env, args.p_port, self.host["p"], net("p"))
        env_d = side_env(both, args.d_env, args.d_port, self.host["d"], net("d"))
        self.result = result = new_result(args, env_p, env_d)
        env_x = None
        if self.refused_peer:
            env_x = side_env(both, args.refused_peer_env, args.refused_peer_port, self.host["p"], net("p"))
            result["env_refused_peer"] = env_x
        tmpdir = tempfile.mkdtemp(prefix="pdh-")
        model.write_model_dir(os.path.join(tmpdir, "tinyllama"))
        # one process per TP rank and side (P rank i: self.p.cmd[i], self.p.res[i]); TP 1: one P, one D
        self.ranks = Ranks(args, tmpdir)
        if self.net:  # the refused second prefill (role "p") runs on P's host
            self.ranks.netns = dict(self.net.ns)
            result["netns"] = self.net.describe()
        self.p, self.d = self.ranks.side(args.p_tp), self.ranks.side(args.d_tp)
        self.x = self.ranks.side(1) if self.refused_peer else None
        if self.tp_run:
            result["tp"] = {"p": args.p_tp, "d": args.d_tp}
            if args.plant_fault:
                result["planted_fault"] = args.plant_fault
        all_ok = False
        try:
            self._start(env_p, env_d, env_x)
            self._setup_phase()
            if self.refused_peer:
                self._refused_peer_request()
            all_ok = self._run_cases(cases)
            if getattr(args, "link_flap", None):
                all_ok &= link_flap(self, args.link_flap, args.link_flap_rate)
            for side in (self.d, self.p, self.x):
                if side is not None:
                    side.put(("stop",))
            result["timing_s"] = round(time.time() - self.t_start, 2)
        except Exception as e:
            result["errors"].append(f"{type(e).__name__}: {e}"[:6000])
            all_ok = False
        finally:
            self.ranks.join()
            if self.net:
                self.net.close()
                result["netns"]["left_behind"] = self.net.leftovers()
        self._finish(all_ok)
        return result

    # ------------------------------------------------------------------- start and set-up
    def _start(self, env_p, env_d, env_x):
        args, ranks = self.args, self.ranks
        ranks.start_side("p", self.p, env_p, list(range(args.p_tp)))
        # swap-d-ranks (planted fault): the process the parent checks as rank i is rank N-1-i
        ranks.start_side("d", self.d, env_d, [args.d_tp - 1 - i if args.plant_fault == "swap-d-ranks" else i
                                              for i in range(args.d_tp)])
        if self.tp_run:
            self.result["tp"]["forked_from_one_process"] = list(ranks.forked_sides)
        if self.refused_peer:
            # a second prefill engine that D must refuse at handshake (its own block size / env)
            ranks.start("p", self.x, 0, env_x, 0, engine_id=REFUSED_PEER["engine_id"],
                        p_block_size=args.refused_peer_block_size or args.p_block_size)

    def _setup_phase(self):
        args = self.args
        p_infos = self.p.expect_all(("ready",), args.setup_timeout or 180 + 60 * (args.p_tp - 1), "P setup")
        d_infos = self.d.expect_all(("ready",), args.setup_timeout or 180 + 60 * (args.d_tp - 1), "D setup")
        if args.p_tp > 1:
            # the engine core merges the workers' {(pp, tp) rank: metadata} dicts and its
            # scheduler-side connector serves them (P rank 0's process plays that part)
            merged = {}
            for info in p_infos:
                merged.update(info.pop("handshake", None) or {})
            self.p.cmd[0].put(("serve", merged))
            expect(self.p.res[0], ("serving",), args.timeout, "P handshake listener")
        p_info = p_infos[0]
        p_info["engine_id"] = "p-engine"
        p_info["port"] = args.p_port
        p_info["host"] = self.host["p"]
        p_info["tp_size"] = args.p_tp
        self._describe(p_infos, d_infos)
        self.p_info, self.d_infos = p_info, d_infos
        # the whole model's reference (P TP N: the ranks' head slices joined)
        self.p_ref = join_reference(p_infos) if args.p_tp > 1 else p_info

    def _describe(self, p_infos, d_infos):
        """The result's header: each side's set-up, D's regions and descriptors per block."""
        result = self.result
        p_info, d_info = p_infos[0], d_infos[0]
        for side, info in (("p", p_info), ("d", d_info)):
            result[side] = {k: v for k, v in info.items() if k not in ("reference", "handshake")}
        if self.tp_run:
            for side, infos in (("p_ranks", p_infos), ("d_ranks", d_infos)):
                result[side] = [{k: info.get(k) for k in ("tp_rank", "cross_layer", "layer_view_shape",
                                                          "cross_layer_shape", "xlkv_log")}
                                | {"worker": info["worker"]} for info in infos]
        w = d_info["worker"]
        result.update(family=d_info.get("family"), kv_cache_groups=d_info.get("kv_cache_groups"),
                      hybrid_allocator=d_info.get("hybrid_allocator"),
                      registered=w.get("registered"))
        result.update(vllm=d_info["vllm"], platform=d_info["platform"],
                      backend=d_info["backend"], kv_layout=d_info.get("kv_layout"),
                      cross_layer=d_info["cross_layer"], num_regions=w.get("num_regions"))
        nd = w.get("num_descs") or w.get("len_src_blocks_data")  # <=0.15: no num_descs
        if nd and w.get("num_blocks"):
            result["descs_per_block"] = nd / w["num_blocks"]
            if result["descs_per_block"] == int(result["descs_per_block"]):
                result["descs_per_block"] = int(result["descs_per_block"])
        bl = w.get("block_len_per_layer") or w.get("block_len")
        if isinstance(bl, list) and bl and len(set(bl)) == 1:
            bl = bl[0]
        result["block_len"] = bl
        result["p_d_layout_match"] = (p_info["worker"].get("num_regions") == w.get("num_regions")
                                      and p_info.get("cross_layer") == d_info.get("cross_layer"))

    def _refused_peer_request(self):
        """First a request D must refuse: it has to fail that request and keep serving (the
        cases then run on the same D processes against the compatible prefill).  What the run
        waited for, and how long, stays in result["refused_peer"] whatever comes back: a set-up
        that did not finish, D dying, D not answering, and D's answer without a refusal or an
        error each read differently there."""
        args, result = self.args, self.result
        rp = result["refused_peer"] = {}
        setup = args.setup_timeout or 180
        self._wait(rp, "the refused peer's set-up (its rank worker's 'ready')", setup, "peer_died",
                   lambda: expect(self.x.res[0], ("ready",), setup, "refused peer setup"))
        suffix, remote, local = REFUSED_PEER["request"]
        pmsg = {"engine_id": REFUSED_PEER["engine_id"], "port": args.refused_peer_port, "tp_size": 1,
                "host": self.host["p"]}
        self.d.put(("recv", "req-refused-" + suffix, remote, local, pmsg))
        rs = self._wait(rp, "D's answer to the refused request (its receive loop steps up to --timeout %gs)"
                        % args.timeout, args.timeout + 15, "d_died",
                        lambda: self.d.expect_all(("recv",), args.timeout + 15, "D recv req-refused-" + suffix))
        for x in rs:
            x.pop("layers", None)
        rp.update({k: rs[0].get(k) for k in ("recv_done", "invalid_block_ids", "errors", "xfer_calls",
                                             "local_block_ids", "recv_s")})
        rp["errors"] = [e for x in rs for e in x.get("errors") or []]
        rp["shim_log"] = [line for x in rs for line in x.get("shim_log") or []][-10:]
        exc = [e.rsplit(" | ", 1)[1] for e in rp["errors"] if " | " in e]
        rp["failure_reason"] = (exc or rp["errors"] or [None])[-1]
        rp["failed"] = all(x["recv_done"] and x["invalid_block_ids"] for x in rs if
                           isinstance(x["invalid_block_ids"], list)) and not rs[0].get("xfer_calls")
        if not rp["errors"]:
            # nothing logged: D's answer says whether its connector finished the request (a silent
            # refusal) or stepped until --timeout without news (the handshake never completed)
            rp["no_refusal"] = (
                "D's connector %s the request after %ss with no ERROR logged (%s; load average %s)"
                % ("finished" if all(x.get("recv_done") for x in rs) else "neither finished nor failed",
                   rp.get("recv_s"), "invalid blocks %s, NIXL transfers %s" % (rp["invalid_block_ids"],
                                                                               rp["xfer_calls"]), _load()))

    def _wait(self, rp, what, limit, died, fn):
        """``fn()``, or on its failure ``rp`` says what was waited for, how long and why it ended: under
        "no_answer" when nothing came within ``limit`` seconds, else under ``died`` (a rank's fatal)."""
        t0 = time.time()
        rp["waiting_for"] = what
        try:
            out = fn()
        except Exception as e:
            rp.update(waited_s=round(time.time() - t0, 1), limit_s=limit, load_average=_load(),
                      since_start_s=round(time.time() - self.t_start, 1))
            key = "no_answer" if isinstance(e, TimeoutError) else died
            rp[key] = f"{type(e).__name__}: {e}"[:3000]
            raise
        del rp["waiting_for"]
        return out

    # ------------------------------------------------------------------------------ cases
    def _run_cases(self, cases):
        all_ok = True
        groups = self.p_info.get("kv_cache_groups") or []
        CASES["groups"] = group_case(groups or [{}])
        if len(groups) > 1 and not self.args.case:
            cases = ["groups"]  # several KV cache groups: block ids per group
        if self.hetero_bs:  # different block sizes: their own requests (blocksizes.cases)
            bs_cases = blocksizes.cases(self.bs[0], self.bs[1], groups)
            CASES.update(bs_cases)
            cases = list(bs_cases)
            self.result["block_sizes"] = {"p": self.bs[0], "d": self.bs[1]}
        for cname in cases:
            for suffix, remote, local, ntok in CASES[cname]:
                c = {"num_tokens": ntok}
                c0 = self.net.counters() if self.net else None
                try:
                    self._transfer(c, f"req-{cname}-{suffix}", remote, local)
                except Exception as e:
                    c["ok"] = False
                    c["error"] = f"{type(e).__name__}: {e}"[:3000]
                if c0:  # --netns: what crossed the veth during this request
                    c["veth"] = NetnsPair.delta(c0, self.net.counters())
                if not c["ok"]:
                    self._failure(cname, c)
                self.result["cases"][cname] = c
                all_ok &= c["ok"]
        return all_ok

    def _transfer(self, c, req, remote, local, during=None):
        """One request: P registers it, D pulls it; D's bytes checked against P's.
        ``during()`` runs while D is pulling (--link-flap)."""
        args = self.args
        self.p.put(("send", req, remote))
        self.p.expect_all(("send_ack",), args.timeout, "P send registration")
        pmsg = {k: self.p_info[k] for k in ("engine_id", "port", "tp_size", "host")}
        self.d.put(("recv", req, remote, local, pmsg))
        if during:
            during()
        rs = self.d.expect_all(("recv",), args.timeout + 15, f"D recv {req}")
        layers = [r.pop("layers") for r in rs]
        r = rs[0]
        c.update(r)
        if len(rs) > 1:
            c["errors"] = [e for x in rs for e in x.get("errors") or []]
        ok_recv = True
        for x in rs:
            ok_recv &= bool(x["recv_done"] and not x["invalid_block_ids"]
                            if isinstance(x["invalid_block_ids"], list) else x["recv_done"])
        if ok_recv and self.hetero_bs:
            self.expected_tokens.update(blocksizes.token_sources(remote, local, c["num_tokens"], *self.bs))
        elif ok_recv:
            for lb, rb in expected_pairs(remote, local):
                self.expected_owner[lb] = rb
        p_counts = self._wait_sent(c, req, ok_recv)
        nblk = sum(map(len, local)) if local and isinstance(local[0], list) else len(local)
        c["block_ids"] = nblk  # block ids transferred, every KV cache group's together
        if self.hetero_bs:
            c["remote_block_ids_count"] = sum(map(len, remote)) if remote and isinstance(remote[0], list) \
                else len(remote)
        self._count_descriptors(c, r, p_counts, nblk)
        bad = self._verify_ranks(c, rs, layers, nblk)
        if local and isinstance(local[0], list):
            c["groups"] = group_breakdown(self.p_info["kv_cache_groups"], local, remote, bad)
        c["bytes_ok"] = not bad
        c["mismatches"] = bad[:10]
        c["num_mismatches"] = len(bad)
        c["ok"] = bool(ok_recv) and not bad

    def _wait_sent(self, c, req, ok_recv):
        """Waits for P (every rank) to see the completion notification(s); returns what
        push P's agents moved."""
        end = time.time() + (10 if ok_recv else 2)
        waiting = set(range(self.args.p_tp))
        p_counts = []
        while time.time() < end and waiting:
            for i in sorted(waiting):
                try:
                    m = self.p.res[i].get(timeout=0.2)
                except queue_mod.Empty:
                    continue
                if m[0] == "sent" and m[1] == req:
                    waiting.discard(i)
                    if len(m) > 2:
                        p_counts.append(m[2])
                if m[0] == "fatal":
                    raise RuntimeError(m[1]["error"])
        c["p_done_sending"] = not waiting
        return p_counts

    def _count_descriptors(self, c, r, p_counts, nblk):
        src = r
        if self.args.transfer == "push":  # P's agent made the transfer (WRITE)
            c["transfer"] = "push"
            c["d_xfer_calls"] = r.get("xfer_calls")
            src = {k: [x for pc in p_counts for x in pc.get(k) or []]
                   for k in ("xfer_calls", "nixl_desc_counts")}
        if src.get("nixl_desc_counts"):
            c["nixl_descs"] = sum(src["nixl_desc_counts"])
        if src.get("xfer_calls"):
            c["xfer_descs"] = sum(src["xfer_calls"])
            c["xfer_descs_per_block"] = sum(src["xfer_calls"]) / nblk

    def _verify_ranks(self, c, rs, layers, nblk):
        """Every D rank's bytes against P's reference; the mismatches, all ranks together."""
        bad = []
        for i, (x, lay) in enumerate(zip(rs, layers)):
            try:
                if self.hetero_bs:
                    bad_i = blocksizes.verify_tokens(
                        self.p_ref, lay, self.expected_tokens, self.d_infos[i]["layer_view_shape"], self.bs[1],
                        d_rank=i, d_tp=self.args.d_tp, replicated=model.FAMILY == "mla")
                elif self.tp_run:
                    bad_i = verify(self.p_ref, lay, self.expected_owner,
                                   d_shape=self.d_infos[i]["layer_view_shape"], d_rank=i,
                                   d_tp=self.args.d_tp)
                else:
                    bad_i = verify(self.p_info, lay, self.expected_owner)
            except Exception as e:
                bad_i = [f"verify failed: {type(e).__name__}: {e}"]
            bad.extend(bad_i)
            if len(rs) > 1:
                c.setdefault("ranks", []).append({
                    "recv_done": x["recv_done"], "invalid_block_ids": x["invalid_block_ids"],
                    "xfer_descs_per_block": (sum(x["xfer_calls"]) / nblk
                                             if x.get("xfer_calls") else None),
                    "bytes_ok": not bad_i, "num_mismatches": len(bad_i)})
        return bad

    def _failure(self, cname, c):
        reasons = [e for e in (c.get("errors") or []) if e]
        if c.get("error"):
            reasons.append(c["error"])
        if not reasons:
            reasons.append(f"recv_done={c.get('recv_done')} invalid_block_ids="
                           f"{c.get('invalid_block_ids')} mismatches="
                           f"{c.get('num_mismatches')}")
        # the exception text of the last logged failure is the reason D saw
        exc = [e.split(" | ", 1)[1] for e in reasons if " | " in e]
        c["failure_reason"] = (exc or reasons)[-1][:1500]
        self.result["errors"].extend(f"{cname}: {r}"[:2000] for r in reasons)

    def _finish(self, all_ok):
        result = self.result
        result["transfer_verified"] = bool(all_ok) and bool(result["cases"])
        if result["descs_per_block"] is None:
            # releases whose worker exposes no descriptor count (0.12-0.13): the descriptors really
            # handed to NIXL per transferred block, when every case agrees
            sent = {c.get("xfer_descs_per_block") for c in result["cases"].values()}
            if len(sent) == 1 and None not in sent and float(next(iter(sent))).is_integer():
                result["descs_per_block"] = int(next(iter(sent)))
                result["descs_per_block_source"] = "descriptors sent"
