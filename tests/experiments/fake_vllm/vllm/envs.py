"""Fake vllm.envs: only what experiments/pdtools (vllminfo) looks for (the name of the variable)."""
import os

environment_variables = {
    "VLLM_BATCH_INVARIANT": lambda: bool(int(os.getenv("VLLM_BATCH_INVARIANT", "0"))),
}
