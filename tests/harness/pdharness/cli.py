"""The harness's command line: the options, then one run (session.PairRun) whose result is
written to --out; a one-line summary on stdout; exit 0 when every case's bytes matched."""
import argparse
import json
import os
import signal
import sys

from . import model
from .cases import CASE_CHOICES
from .session import PairRun

SUMMARY_KEYS = ("vllm", "backend", "kv_layout", "cross_layer", "num_regions", "descs_per_block",
                "block_len", "transfer_verified")


def build_parser():
    ap = argparse.ArgumentParser(description=sys.modules[__package__].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", action="append", choices=CASE_CHOICES,
                    help="run only these cases (default: all, in order; a model with several KV cache "
                         "groups: groups)")
    ap.add_argument("--family", choices=model.FAMILY_NAMES, default="dense",
                    help="the model's shape (pdharness/model.py FAMILIES, keyed by the package's family names): "
                         "dense (tiny Llama), one-kv-head (MQA: one KV head), mla (DeepSeek-V2-shaped MLA), "
                         "sliding-window (gpt-oss-shaped sliding-window + full hybrid: several KV cache groups)")
    ap.add_argument("--native-opt-in", action="store_true",
                    help="kv_connector_extra_config enable_cross_layers_blocks=True (0.16-0.28)")
    ap.add_argument("--p-env", action="append", default=[], metavar="KEY=VAL")
    ap.add_argument("--d-env", action="append", default=[], metavar="KEY=VAL")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                    help="set on both sides")
    ap.add_argument("--timeout", type=float, default=60.0, help="per step, seconds")
    ap.add_argument("--setup-timeout", type=float, default=float(os.environ.get("XLKV_SETUP_TIMEOUT", 0)) or None,
                    help="seconds each side may take to start (default XLKV_SETUP_TIMEOUT, else 180 plus 60 per "
                         "extra TP rank)")
    ap.add_argument("--p-block-size", type=int, default=None, help="KV block size of P (default 16)")
    ap.add_argument("--d-block-size", type=int, default=None, help="KV block size of D (default 16)")
    ap.add_argument("--p-connector", choices=("nixl", "multi", "multi-mixed"), default="nixl",
                    help="P's connector: NixlConnector, or NixlConnector inside a MultiConnector "
                         "(multi-mixed: with the example storage connector beside it)")
    ap.add_argument("--d-connector", choices=("nixl", "multi", "multi-mixed"), default="nixl")
    ap.add_argument("--kernel-block-size", type=int, default=None,
                    help="kernel block size the attention backend supports (< the block size: each "
                         "logical block is split into several kernel blocks)")
    ap.add_argument("--p-kernel-block-size", type=int, default=None,
                    help="--kernel-block-size on P only (a different attention kernel block on one side)")
    ap.add_argument("--d-kernel-block-size", type=int, default=None, help="--kernel-block-size on D only")
    ap.add_argument("--over-allocate", type=int, default=0, metavar="N",
                    help="allocate N blocks more than the scheduler's budget (virtual capacity)")
    ap.add_argument("--kv-buffer-device", default=None,
                    help="kv_buffer_device on both sides (default cuda; cpu = NIXL host-buffer mode)")
    ap.add_argument("--p-tp", type=int, default=1, metavar="N",
                    help="tensor-parallel size of P: N worker ranks, one process each (gloo group)")
    ap.add_argument("--d-tp", type=int, default=1, metavar="N", help="tensor-parallel size of D")
    ap.add_argument("--attn-backend", choices=("FLASH_ATTN", "TRITON_ATTN"), default="FLASH_ATTN",
                    help="attention backend of both sides (its KV cache shape; no kernel runs): TRITON_ATTN is "
                         "blocks-first")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="KV heads of the model (default: the family's, %d for dense; each TP rank holds "
                         "KV heads / TP)" % model.NUM_KV_HEADS)
    ap.add_argument("--plant-fault", choices=("corrupt", "swap-d-ranks", "misorder", "uneven-regions", "shift-group",
                                              "head-offset"),
                    default=None,
                    help="harness self-test, the run must fail: 'corrupt' changes one received "
                         "element on D's last rank; 'swap-d-ranks' starts D's ranks in reverse "
                         "order while the parent checks them as if they were in order; 'misorder' reverses the local "
                         "descriptor ids of every transfer without their remote partners; 'uneven-regions' hands "
                         "D's connector worker, at registration, regions that disagree on their block count (the "
                         "first layer one block short, or the cross-layer tensor plus a view one block shorter); "
                         "'shift-group' replaces the last KV cache group's first received block by the next block; "
                         "'head-offset' (0.29+) makes vLLM's head slot of every decode rank inside a remote block 0")
    ap.add_argument("--restage-rows", action="store_true",
                    help="D only, vLLM 0.29+ with BHLNC rows and D's blocks a multiple of P's: before vLLM's receive "
                         "post-processing, permute each received row with xlkv_autopatch.block_sizes.staged_order (a "
                         "stand-in, on the worker instance, for the shim's patches/block_size_restage.py, for runs "
                         "without the shim: VLLM_KV_CACHE_LAYOUT=BHLNC)")
    ap.add_argument("--transfer", choices=("pull", "push"), default="pull",
                    help="pull: NixlConnector (D READs from P); push: NixlPushConnector (P WRITEs "
                         "into D's blocks; releases that have it, TP 1 only)")
    ap.add_argument("--kv-extra", action="append", default=[], metavar="KEY=JSON",
                    help="an entry of the NixlConnector's kv_connector_extra_config on both sides, e.g. "
                         "enforce_handshake_compat=false")
    ap.add_argument("--refused-peer-block-size", type=int, default=None, metavar="N",
                    help="start a second prefill engine with N-token blocks (and --refused-peer-env); D's "
                         "first request goes to it and must fail at handshake, then the cases run against "
                         "the compatible prefill on the same D (TP 1 on both sides)")
    ap.add_argument("--refused-peer-env", action="append", default=[], metavar="KEY=VAL",
                    help="environment of that second prefill engine (on top of --env)")
    ap.add_argument("--refused-peer-port", type=int, default=None,
                    help="its side-channel port (default --p-port + 2)")
    ap.add_argument("--netns", action="store_true",
                    help="P and D in two network namespaces joined by a veth pair (two hosts on one "
                         "machine): side channel and NIXL (UCX_TLS=tcp) over the pair; needs root")
    ap.add_argument("--link-flap", type=float, default=None, metavar="SECONDS",
                    help="--netns: after the cases, take the veth down for SECONDS while D reads a "
                         "request, then up; then one more request must arrive exactly")
    ap.add_argument("--link-flap-rate", default="256kbit",
                    help="P's egress during that read (tc tbf rate), so that the link drops mid-transfer: at "
                         "1mbit a 256 KiB read (0.26.0 stock, 32 descriptors) had crossed whole before a loaded "
                         "2-core machine's poll saw 64 KiB (CI, 2026-11-26); 256kbit gives it 8 s")
    ap.add_argument("--p-port", type=int, default=int(os.environ.get("XLKV_P_PORT", 5611)))
    ap.add_argument("--d-port", type=int, default=int(os.environ.get("XLKV_D_PORT", 5612)))
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.refused_peer_block_size or args.refused_peer_env:
        assert args.p_tp == 1 and args.d_tp == 1, "--refused-peer-* runs at TP 1 on both sides"
        args.refused_peer_port = args.refused_peer_port or args.p_port + 2
    model.set_family(args.family)
    model.set_kv_heads(args.kv_heads or model.NUM_KV_HEADS)
    args.kv_heads = model.NUM_KV_HEADS
    if args.link_flap and not args.netns:
        ap.error("--link-flap needs --netns")
    if args.netns:  # a SIGTERM still runs the run's finally (which removes the namespaces)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.transfer == "push" and (args.p_tp > 1 or args.d_tp > 1):
        ap.error("--transfer push runs at TP 1 only")
    result = PairRun(args).run()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: result[k] for k in SUMMARY_KEYS}))
    return 0 if result["transfer_verified"] else 1
