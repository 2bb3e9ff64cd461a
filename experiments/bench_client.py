"""One resident `vllm bench serve` for a whole benchmark job (started by pdtools/job_bench.py).

Each `python -m vllm.entrypoints.cli.main bench serve ...` run pays for importing vLLM and torch
before its first request: on 2 x H200 with vLLM 0.33.0 that was 20-30 s a repetition while the
requests themselves took 0.2-3 s (experiments/results/logs-2026-11-27c-2xH200-handoff.tar.xz:call22), so a
grid of 18 repetitions per config filled a device call.  This process imports vLLM's benchmark
once and runs every repetition with vLLM's own code: ``vllm.benchmarks.serve.add_cli_args`` parses
the same arguments the CLI would get and ``vllm.benchmarks.serve.main`` runs them (what
`vllm bench serve` itself calls, 0.14-0.33), so a repetition measures what the CLI measured.

Protocol (no stdout parsing): one JSON object per line on stdin,
``{"argv": [...after "bench serve"...], "log": PATH, "done": PATH}``; the run's printed output goes
to ``log``; when it ends ``done`` is written with ``{"rc": 0 or 1, "error": "..."}``.  End of stdin
ends the process.  Run under the Python that has vLLM ($PY), as ``python bench_client.py``.
"""

import argparse
import contextlib
import json
import os
import sys
import traceback


def _parser():
    from vllm.benchmarks.serve import add_cli_args
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        try:
            from vllm.utils import FlexibleArgumentParser
        except ImportError:  # a stand-in vLLM
            FlexibleArgumentParser = argparse.ArgumentParser
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return parser


def run_one(parser, bench_main, job):
    rc, error = 0, ""
    with open(job["log"], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            print("bench_client: vllm bench serve %s" % " ".join(job["argv"]), flush=True)
            bench_main(parser.parse_args(job["argv"]))
        except SystemExit as e:  # argparse's errors, a benchmark's own exit
            rc = e.code if isinstance(e.code, int) else 1
            error = "exit %s" % e.code
        except BaseException as e:  # noqa: BLE001 - report it, keep serving the next repetition
            rc, error = 1, "%s: %s" % (type(e).__name__, e)
            traceback.print_exc()
            if isinstance(e, KeyboardInterrupt):
                raise
    tmp = job["done"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"rc": rc, "error": error}, f)
    os.replace(tmp, job["done"])   # the waiter sees a whole file or none
    return rc


def main():
    from vllm.benchmarks.serve import main as bench_main
    parser = _parser()
    for line in sys.stdin:
        line = line.strip()
        if line:
            run_one(parser, bench_main, json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
