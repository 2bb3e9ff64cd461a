"""What a staged vLLM release knows, read from its sources without importing it."""

import os

BATCH_INVARIANT_FILES = ("envs.py", "model_executor/layers/batch_invariant.py")


def vllm_has_batch_invariant(pkg_dir):
    """Does the vLLM package in pkg_dir read VLLM_BATCH_INVARIANT?  (0.12-0.17 read it in
    model_executor/layers/batch_invariant.py, later releases in envs.py; 0.11 and older do
    not know it and would ignore it silently.)  Reads the sources; does not import vLLM."""
    for rel in BATCH_INVARIANT_FILES:
        path = os.path.join(pkg_dir, rel)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if '"VLLM_BATCH_INVARIANT"' in f.read():
                    return True
        except OSError:
            continue
    return False
