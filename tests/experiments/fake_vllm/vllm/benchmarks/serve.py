"""The fake vLLM's benchmark module: ``add_cli_args`` and ``main``, as `vllm bench serve` calls them
(experiments/bench_client.py imports them once and runs every repetition through them)."""

import sys

from vllm.entrypoints.cli.main import add_bench_args, bench_main


def add_cli_args(parser):
    add_bench_args(parser)


def main(args):
    rc = bench_main(args)
    if rc:
        sys.exit(rc)   # the real main raises on a failed run; exit code 1 either way
    return {}
