#!/usr/bin/env python3
"""The wire time of a P/D transfer's bytes: a timed copy GPU0 -> GPU1 of the same size.

    python3 experiments/wire_copy.py [--bytes 1174405120] [--reps 20] [--out wire.json]

Default size: one 10240-token request of the Qwen3-0.6B shape (640 blocks x 1.75 MiB =
1.09 GiB, what D pulls per request at 64 x 10240).  torch copies one contiguous tensor from
cuda:0 to cuda:1 (peer-to-peer over NVLink where the machine has it), timed with CUDA events
after a warm-up; the JSON holds every repetition, the median and the GB/s.  This is the floor
no P/D transfer of those bytes beats; vLLM's "Avg xfer time" also waits for an engine step.
Exit 3 without two GPUs (nothing measured, said so).
"""
import argparse
import json
import statistics
import sys

BLOCK = 16 * 28 * 2 * 8 * 128 * 2  # Qwen3-0.6B shape, 16-token block, bf16


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=640 * BLOCK)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("wire_copy: torch is not importable here", file=sys.stderr)
        return 3
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("wire_copy: needs two GPUs (found %d); nothing measured"
              % (torch.cuda.device_count() if torch.cuda.is_available() else 0), file=sys.stderr)
        return 3
    src = torch.empty(a.bytes, dtype=torch.uint8, device="cuda:0").random_(0, 255)
    dst = torch.empty(a.bytes, dtype=torch.uint8, device="cuda:1")
    peer = torch.cuda.can_device_access_peer(0, 1)
    dst.copy_(src)
    torch.cuda.synchronize(0), torch.cuda.synchronize(1)
    ms = []
    for _ in range(a.reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(0):
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    same = bool(torch.equal(dst.cpu()[:1 << 20], src.cpu()[:1 << 20]))
    med = statistics.median(ms)
    res = {"bytes": a.bytes, "reps": a.reps, "ms": ms, "median_ms": med, "min_ms": min(ms), "max_ms": max(ms),
           "gb_s": a.bytes / med / 1e6, "peer_access": peer, "first_mib_equal": same,
           "gpus": [torch.cuda.get_device_name(i) for i in range(2)], "torch": torch.__version__,
           "command": " ".join(sys.argv)}
    print("wire_copy: %.2f GiB cuda:0 -> cuda:1 median %.2f ms (%.2f-%.2f), %.0f GB/s, peer access %s"
          % (a.bytes / 2 ** 30, med, min(ms), max(ms), res["gb_s"], peer))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
