#!/usr/bin/env python3
"""CPU-only prefill->decode proof harness for vLLM's real NixlConnector + real NIXL (UCX):
the command line.  The harness itself is the package beside this file (pdharness/; its
__init__ says what it does, ``--help`` too).

Run with the python of an env made by mkenv.sh, from any folder:
    python tests/harness/pd_harness.py --out result.json [--case NAME] [--native-opt-in]
                                      [--p-env KEY=VAL] [--d-env KEY=VAL] [--timeout 60]
                                      [--netns [--link-flap SECONDS]]   (two hosts on one machine; root)
"""
import os
import sys

if __name__ == "__main__":
    # run as a script, this file's folder is sys.path[0] already (and spawned rank workers
    # inherit it); put it there for any other way of running it
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    # vLLM 0.29+ import humming-kernels, whose import starts two background builds of its CUDA
    # launcher (a python that imports torch each; they fail on a machine without CUDA): on a
    # small CPU machine that is two extra torch imports per vLLM process.  Its own switch.
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    from pdharness.cli import main
    sys.exit(main())
