"""What Python's garbage collector costs a loop of gradcore graphs, and what gc.freeze() saves.

The suite times each run from a collected heap (gc.collect() before it), so its medians leave out
the collector's full passes. A training loop does not collect between steps: every node of a
graph is a few Python objects, a graph alive across collections is promoted to the oldest
generation, and once enough are, Python walks every tracked object of the process. That costs in
proportion to everything the process holds (PyTorch alone brings ~150,000 objects).

    python -m benchmarks.collector [--runs N]

runs wide's gradcore loop N times in a fresh process per setting (with and without PyTorch
imported, with and without gc.freeze() after start-up) and prints the mean and median time per
run, and how many full passes ran and how long they took.
"""
import argparse
import gc
import json
import statistics
import sys
import time

from . import wide
from .common import at_least, resolve_device, run_child

SETTINGS = (("numpy only", False, False), ("numpy only, gc.freeze()", False, True),
            ("PyTorch imported", True, False), ("PyTorch imported, gc.freeze()", True, True))


def measure(runs, with_torch, freeze):
    """In this process: time `runs` runs of wide's gradcore loop; a dict of figures."""
    if with_torch:
        import torch  # noqa: F401  (its objects are what the full passes walk)
    run = wide.make_gradcore(resolve_device("cpu"))
    run()
    if freeze:
        gc.freeze()
    tracked = len(gc.get_objects())  # what a full pass walks: frozen objects are left out
    full = {"count": 0, "seconds": 0.0}
    started = []

    def watch(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        else:
            full["count"] += 1
            full["seconds"] += time.perf_counter() - started.pop()

    gc.callbacks.append(watch)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    gc.callbacks.remove(watch)
    return {"tracked": tracked, "mean_ms": statistics.mean(times) * 1e3,
            "median_ms": statistics.median(times) * 1e3, "full_passes": full["count"],
            "full_ms": full["seconds"] * 1e3}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.collector", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=at_least(1), default=60, metavar="N",
                        help="runs per setting (default 60)")
    parser.add_argument("--child", nargs=2, type=int, metavar=("TORCH", "FREEZE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.runs, *map(bool, args.child))))
        return 0
    print(f"wide's gradcore loop on cpu, {args.runs} runs per setting, a fresh process each")
    print(f"{'setting':32s} {'objects walked':>15s} {'mean':>9s} {'median':>9s}  full passes")
    failed = 0
    for label, with_torch, freeze in SETTINGS:
        r = run_child("collector", ["--runs", args.runs, "--child", int(with_torch), int(freeze)])
        if r.get("status") == "error":
            print(f"{label:32s} n/a: {r['error']}")
            failed += 1
            continue
        print(f"{label:32s} {r['tracked']:15,d} {r['mean_ms']:6.2f} ms {r['median_ms']:6.2f} ms"
              f"  {r['full_passes']}, {r['full_ms']:.0f} ms in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
