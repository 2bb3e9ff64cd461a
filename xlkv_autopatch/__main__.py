"""Command line: ``python -m xlkv_autopatch status [--json] [--no-resolve] [--model DIR [--tp N] [--pp N]
[--prefill-tp N --decode-tp M] [--block-size N --prefill-block-size M]]``."""

import argparse
import contextlib
import json
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m xlkv_autopatch")
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="where the shim is, the installed vLLM, every knob, the activation paths, "
                                       "which patches apply, and every start-up refusal it can predict "
                                       "(exit 1 with a PROBLEM line each)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--no-resolve", action="store_true", help="do not import vLLM to resolve patch targets")
    st.add_argument("--model", metavar="DIR", help="also say what the shim does for the model in this Hugging Face "
                                                   "config folder (its family, layout and descriptors per block)")
    st.add_argument("--tp", type=int, default=1, help="with --model: the tensor-parallel size (default 1)")
    st.add_argument("--pp", type=int, default=1, help="with --model: the pipeline-parallel size (default 1)")
    st.add_argument("--prefill-tp", type=int, default=None, metavar="N",
                    help="with --model and --decode-tp: a prefill/decode pair at these TP sizes: is it served, with "
                         "which layout on each side, and the descriptors per block per remote rank")
    st.add_argument("--decode-tp", type=int, default=None, metavar="N", help="with --model and --prefill-tp")
    st.add_argument("--block-size", type=int, default=None, metavar="N",
                    help="with --model: vLLM's --block-size (default 16)")
    st.add_argument("--kernel-block-size", type=int, default=None, metavar="N",
                    help="with --model: the attention kernel's block in tokens, where it is smaller than --block-size "
                         "(vLLM picks it with the attention backend; status cannot know it otherwise)")
    st.add_argument("--prefill-block-size", type=int, default=None, metavar="N",
                    help="with --model: the prefill engine's --block-size, where it differs from decode's (--block-size): "
                         "is that pair served (the NIXL handshake's answer), at how many descriptors per decode block; "
                         "without --prefill-tp/--decode-tp both sides run at --tp")
    args = parser.parse_args(argv)
    if (args.prefill_tp is None) != (args.decode_tp is None) or (args.prefill_tp and not args.model):
        parser.error("--prefill-tp and --decode-tp go together, with --model")
    if args.prefill_block_size is not None and not args.model:
        parser.error("--prefill-block-size goes with --model")
    from . import status_report

    # vLLM logs to stdout; keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        info = status_report.collect(resolve=not args.no_resolve)
        if args.model:
            _add_model(info, args)
    if args.json:
        json.dump(info, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        text = status_report.render(info).split("\n")
        if args.model:  # before the PROBLEM lines (the verdict is the first line)
            from . import model_report

            at = next((i for i, line in enumerate(text) if line.startswith("PROBLEM:")), len(text))
            text[at:at] = model_report.render(info["model"]) + (
                model_report.render_pair(info["pair"]) if "pair" in info else [])
        print("\n".join(text))
    return 0 if info["ok"] else 1


def _add_model(info, args):
    from . import model_report
    from .flag import knob

    sizes = dict(block_size=args.block_size, kernel_block_size=args.kernel_block_size)
    info["model"] = model_report.collect(args.model, tp=args.tp, pp=args.pp,
                                         use_vllm=bool(info.get("vllm_installed")), **sizes)
    try:
        strict = knob("XLKV_STRICT")
    except Exception:  # a bad value is already a PROBLEM of its own
        strict = False
    strict = strict and info["flag"]["on"]
    found = model_report.problems(info["model"], strict)
    if args.prefill_tp is not None or args.prefill_block_size is not None:
        if args.prefill_tp is None:
            args.prefill_tp = args.decode_tp = args.tp
        info["pair"] = pair = model_report.pair(args.model, prefill_tp=args.prefill_tp, decode_tp=args.decode_tp,
                                                pp=args.pp, use_vllm=bool(info.get("vllm_installed")),
                                                prefill_block_size=args.prefill_block_size, **sizes)
        what = "prefill TP %d -> decode TP %d%s" % (args.prefill_tp, args.decode_tp, (
            ", prefill %d-token -> decode %d-token blocks" % (pair["prefill_block_size"], pair["decode_block_size"])
            if pair.get("prefill_block_size") else ""))
        stops = {name: model_report.start_up_stop(side, strict) for name, side in pair.get("sides", {}).items()}
        stopped = [name for name, why in stops.items() if why]
        if stopped and not pair.get("error"):
            pair.update(served=False, reason="not served: %s %s not start (%s)" % (
                " and ".join(stopped), "does" if len(stopped) == 1 else "do", "the PROBLEM line says why" if info["problems"] or found else
                "; ".join(stops[n] for n in stopped)), descriptors_per_block_per_remote_rank={"stock": None,
                                                                                                "xlkv": None})
            if not (info["problems"] or found):  # no PROBLEM line names it yet: this one does
                found.append("%s with ENABLE_XLKV on both: %s" % (what, pair["reason"]))
        elif not pair.get("served", False):
            found.append("%s with ENABLE_XLKV on both: %s" % (
                what, info["pair"].get("reason") or info["pair"].get("error")))
    info["problems"].extend(found)
    info["ok"] = info["ok"] and not found


if __name__ == "__main__":
    sys.exit(main())
