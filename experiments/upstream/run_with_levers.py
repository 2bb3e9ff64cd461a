#!/usr/bin/env python3
"""vLLM's own NIXL unit tests (the ids pinned for CPU in cpu-passing.json), flag on with both
handoff levers (XLKV_EARLY_LOAD=1, XLKV_NOTICE_WAIT=1), in one release's environment.

usage: python3 experiments/upstream/run_with_levers.py RELEASE PYTHON OUT.json
Prints the outcome counts and the ids that did not pass; exit 1 if any did not.
"""
import collections
import importlib.util
import json
import os
import sys

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_tests.py")
spec = importlib.util.spec_from_file_location("upstream_tests", TOOL)
up = importlib.util.module_from_spec(spec)
spec.loader.exec_module(up)


def main(release, python, out):
    os.environ["XLKV_EARLY_LOAD"] = "1"
    os.environ["XLKV_NOTICE_WAIT"] = "1"
    ids = json.load(open(up.CPU_PINS))[release]["passing_stock"]
    up.run(release, python, "on", out, "cpu-levers", ids=ids, timeout=1500)
    outcomes = json.load(open(out))["modes"]["on"]["outcomes"]
    bad = [t for t in ids if outcomes.get(t) != "passed"]
    print(release, dict(collections.Counter(outcomes.get(t) for t in ids)), bad[:10])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
