"""Command line: ``python -m xlkv_autopatch status [--json] [--no-resolve]``."""

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
    args = parser.parse_args(argv)
    from . import status_report

    # vLLM logs to stdout; keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        info = status_report.collect(resolve=not args.no_resolve)
    if args.json:
        json.dump(info, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(status_report.render(info))
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
