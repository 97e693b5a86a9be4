"""torch.compile's figure for one workload, taken in a process of its own.

After torch.compile has run in a process, the Python code run there afterwards is slower (on
our VM gradcore's eager figures came out 10-20% slower and its recordings ten times slower), so
the suite never compiles in its own process: `python -m benchmarks.torch_compiled NAME DEVICE
THREADS REPEAT WARMUP` builds the workload's PyTorch run twice, eager and through
torch.compile (the first call, which compiles, outside the clock), times them in turns as the
suite does (with two, each always runs right after the other), checks both last results,
and prints one JSON line: the compiled run's figures, its compile time and graphs, and PyTorch
eager's median in the same process. Where torch.compile compiles no graph (hod: Dynamo skips a
frame that calls torch.autograd.grad) the entry is "skipped": its run would be PyTorch eager.
"""
import json
import statistics

from . import load
from .common import Unavailable, child_main, prepare, resolve_device, take_turns, torch_compiled

TIMEOUT_S = 900  # a cold compile of chain or wide takes about a minute on our VM


def child(argv):
    name, device_name, threads, repeat, warmup = argv
    workload = load([name])[0]
    device = resolve_device(device_name)
    try:
        eager = prepare("torch", workload.torch, device, int(threads))
        # verify knows PyTorch's run as "torch", compiled or not
        compiled = prepare("torch", lambda torch, where: torch_compiled(
            torch, workload.torch(torch, where)), device, int(threads))
    except Unavailable as e:
        print(json.dumps({"status": "skipped", "reason": str(e)}))
        return 0
    facts = compiled.facts
    if facts["graphs"] == 0:  # Dynamo skipped every frame: timing it would time PyTorch eager
        why = f" (the first: {facts['first_graph_break']})" if facts["first_graph_break"] else ""
        print(json.dumps({"status": "skipped", "reason": (
            f"ran eagerly: torch.compile compiled no graph, {facts['graph_breaks']} graph "
            f"break(s){why}")}))
        return 0
    take_turns(workload, [eager, compiled], device, int(warmup), int(repeat))
    for contender in (eager, compiled):
        if contender.error is not None:
            print(json.dumps({"status": "error", "error": contender.error}))
            return 0
    print(json.dumps({
        "status": "ok", "compile_s": facts["compile_s"],
        "graphs": facts["graphs"], "graph_breaks": facts["graph_breaks"],
        "median_s_per_run": statistics.median(compiled.samples),
        "samples_s_per_run": compiled.samples,
        "torch_eager_median_s_per_run": statistics.median(eager.samples),
        "torch_device": compiled.facts["torch_device"],
        "torch_threads": compiled.facts["torch_threads"],
    }))
    return 0


if __name__ == "__main__":
    child_main(child)
