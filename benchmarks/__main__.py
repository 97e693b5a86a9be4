"""`python -m benchmarks [--device cpu|cuda|auto] [--only NAME ...] [--repeat N] [--warmup N]
[--threads N] [--out DIR | --publish]`: run the suite, print a table, write DEVICE.json, DEVICE.png
and RESULTS.md to benchmarks/results/local/ (ignored by git), to DIR, or with --publish to the
committed benchmarks/results/ and benchmarks/RESULTS.md. `--write-results`: only regenerate the
markdown and charts of that destination from its JSON files. `--profile NAME`: cProfile of
gradcore's run of one workload instead."""
import argparse
import cProfile
import datetime
import os
import pstats
import sys

import backends

from . import WORKLOADS, load, torch_compiled
from .common import (TORCH_COMPILE, Progress, at_least, check_targets, command_line,
                     graphs_wanted, load_average, machine_info, prepare, resolve_device,
                     run_child, run_workload, thread_environment, time_once, timing_figures)
from .memory import MEMORY_WEIGHT, measure, measured_kinds
from .report import LOCAL, PUBLISHED, PUBLISHED_MD, print_table, write_all, write_json

DEFAULT_REPEAT = 20
DEFAULT_WARMUP = 3


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time gradcore against hand-written NumPy/CuPy (the floor) and PyTorch.")
    try:  # the workloads read their GRADCORE_BENCH_* variables as they load, for --help too
        load()
        graphs_wanted(os.environ)
    except ValueError as e:
        parser.error(str(e))
    parser.add_argument("--device", default="auto", metavar="{cpu,cuda,auto}",
                        help="where to run (also cuda:N); auto = cuda if a GPU is usable, else cpu")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=WORKLOADS,
                        help=f"run only these workloads (of: {', '.join(WORKLOADS)}); the others "
                             "keep their last figures in the destination's JSON")
    parser.add_argument("--repeat", type=at_least(1), metavar="N",
                        help=f"timed runs per figure, the median is reported (default "
                             f"{DEFAULT_REPEAT}{_own_defaults('repeat')})")
    parser.add_argument("--warmup", type=at_least(0), metavar="N",
                        help=f"untimed runs before timing (default "
                             f"{DEFAULT_WARMUP}{_own_defaults('warmup')})")
    parser.add_argument("--threads", type=at_least(1), default=1, metavar="N",
                        help="threads for the BLAS under NumPy and for PyTorch, the same for both "
                             "(default 1: spinning BLAS threads on a busy machine swamp the "
                             "figures)")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="skip torch.compile of each PyTorch run (timed in a process of its "
                             "own; a cold compile takes up to a minute per workload)")
    parser.add_argument("--profile", metavar="NAME", choices=WORKLOADS,
                        help="print the top of a cProfile of gradcore's run of NAME; no figures")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", default=LOCAL,
                       help="write DIR/DEVICE.json, DIR/DEVICE.png and DIR/RESULTS.md (default "
                            "benchmarks/results/local, which git ignores)")
    where.add_argument("--publish", action="store_true",
                       help="write the committed figures instead: benchmarks/results/DEVICE.json "
                            "and .png, and benchmarks/RESULTS.md")
    parser.add_argument("--write-results", action="store_true",
                        help="run nothing: regenerate RESULTS.md and the charts of the "
                             "destination (--out's, or --publish's) from its JSON files")
    args = parser.parse_args(argv)
    if args.write_results:
        return args
    if args.device != "auto":
        try:
            kind = backends.parse_device(args.device).type
        except ValueError:
            kind = None
        if kind not in ("cpu", "cuda"):
            parser.error(f"--device: expected cpu, cuda, cuda:N or auto, got {args.device!r}")
    try:
        args.device = resolve_device(args.device)
    except backends.DeviceUnavailableError as e:
        parser.error(f"--device {args.device}: {e}")
    if not args.profile:  # checked before the run, which takes minutes, not after it
        folder = destination(args)[0]
        problem = _unwritable(folder)
        if problem:
            where = f"--publish: {_shown(folder)}" if args.publish else f"--out {args.out}"
            parser.error(f"{where}: {problem}")
    return args


def _own_defaults(setting):
    """"; 5 for deep, deep_checkpoint and big": the workloads whose own default for `setting`
    ("repeat" or "warmup") replaces the suite's, for --help."""
    names = {}
    for workload in load():
        if getattr(workload, setting) is not None:
            names.setdefault(getattr(workload, setting), []).append(workload.name)
    return "".join(f"; {value} for " + (f"{', '.join(these[:-1])} and {these[-1]}"
                                         if len(these) > 1 else these[0])
                   for value, these in names.items())


def _unwritable(folder):
    """Why the suite cannot write its results to `folder`, made here if need be; "" if it can."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "not a folder: name a folder for the results (it is made if need be)"
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return f"cannot make that folder ({e.strerror}): name another"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "cannot write to that folder: name another"
    return ""


def destination(args):
    """(the folder of DEVICE.json and DEVICE.png, the path of RESULTS.md) that `args` write."""
    if args.publish:
        return PUBLISHED, PUBLISHED_MD
    return args.out, os.path.join(args.out, "RESULTS.md")


def _shown(path):
    """`path` as the user would type it: relative when under the working directory."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def _micro():
    """"µs" if the terminal can print it, else "us"."""
    try:
        "µ".encode(sys.stdout.encoding or "ascii")
        return "µs"
    except (UnicodeEncodeError, LookupError):
        return "us"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.write_results:
        written = write_all(*destination(args))
        print("\n".join(f"wrote {_shown(path)}" for path in written)
              or f"nothing to regenerate: no JSON file in {_shown(destination(args)[0])}")
        return 0
    environment = thread_environment(args.threads)
    if environment != os.environ:
        # The BLAS reads its thread count once, when NumPy loads: start again with it set.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks", *argv], environment)
    if args.profile:
        return profile(args)
    return run_suite(args, argv)


# ================================================================================ the suite
def _runs(workload, args):
    repeat = args.repeat or workload.repeat or DEFAULT_REPEAT
    warmup = args.warmup if args.warmup is not None else (
        workload.warmup if workload.warmup is not None else DEFAULT_WARMUP)
    return repeat, warmup


def _compiles(workload, args):
    """Whether the suite times torch.compile of `workload`'s PyTorch run."""
    return workload.timed and workload.torch is not None and not args.no_torch_compile


def _units(workload, args):
    """The progress bar's units of work for `workload`: 1 per timing round; for the torch.compile
    child, as many as the rounds it times (two PyTorch runs each, after compiling); MEMORY_WEIGHT
    per memory child."""
    rounds = sum(_runs(workload, args)) if workload.timed else 0
    compiling = rounds if _compiles(workload, args) else 0
    children = len(measured_kinds(workload)) * MEMORY_WEIGHT if workload.memory else 0
    return rounds + compiling + children


def run_suite(args, argv):
    device = args.device
    workloads = load(args.only)
    progress = Progress(sum(_units(w, args) for w in workloads))
    progress.say(f"running {len(workloads)} workload(s) on device {device}, "
                 f"{args.threads} thread(s) for BLAS and PyTorch")
    info = machine_info(device, args.threads)
    command = command_line(argv, os.environ)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    records = {}
    try:
        for i, workload in enumerate(workloads, 1):
            progress.say(f"workload {i}/{len(workloads)}: {workload.name}")
            records[workload.name] = run_one(workload, device, args, command, started, info,
                                             progress)
    finally:
        progress.close()

    report = {
        "date": started,
        "command": command,
        "python_executable": sys.executable,
        "device": str(device),
        "floor_library": backends.backend_for_device(device).name,
        "machine": info,
        "workloads": records,
    }
    folder, markdown = destination(args)
    print_table(report, _micro())  # first, so that a failure to write loses no figure from view
    try:
        path = write_json(report, folder)
        written = write_all(folder, markdown)
    except OSError as e:
        print(f"\nthe results were not saved: {e}", file=sys.stderr)
        return 1
    hint = "" if args.publish else " (not the committed figures: --publish writes those)"
    print(f"\nwritten{hint}:\n  " + "\n  ".join(_shown(p) for p in [path, *written]))
    failed = [f"{name}/{kind}" for name, record in records.items()
              for section in (record.get("results", {}), record.get("references", {}),
                              record.get("memory", {}).get("results", {}))
              for kind, entry in section.items() if entry["status"] == "error"]
    if failed:
        print(f"FAILED: {', '.join(failed)} (see the notes)", file=sys.stderr)
    return 1 if failed else 0


def _torch_compiled(workload, device, args, repeat, warmup, progress):
    """torch.compile's entry for `workload`, from a process of its own (see torch_compiled.py),
    with the figure per unit the table's other entries have."""
    if args.no_torch_compile:
        return {"status": "skipped", "reason": "not run: --no-torch-compile"}
    progress.say(f"{workload.name}: torch.compile, in a process of its own (compiling can take "
                 "a minute)")
    entry = run_child("torch_compiled", [workload.name, device, args.threads, repeat, warmup],
                      env=thread_environment(args.threads), timeout=torch_compiled.TIMEOUT_S)
    progress.advance(f"{workload.name}: torch.compile done", repeat + warmup)
    if entry.get("status") == "ok":
        entry.update(timing_figures(workload, entry["samples_s_per_run"]))
    elif entry.get("status") == "error":
        progress.say(f"{workload.name}/torch.compile FAILED: {entry['error']}")
    return entry


def run_one(workload, device, args, command, started, info, progress):
    """The JSON record of one workload: what it is, its times, its memory, its targets."""
    repeat, warmup = _runs(workload, args)
    record = {
        "name": workload.name,
        "device": str(device),
        "run_started": started,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "git": info["git"],
        "versions": info["versions"],  # a later --only run into the same file may differ
        "settings": {"repeat": repeat, "warmup": warmup, "threads": args.threads,
                     "statistic": "median of the timed runs",
                     "clock": "time.perf_counter, device synchronized before each reading",
                     "gc": "enabled; gc.collect() before each timed run",
                     "order": ("implementations take turns, one run each per round, in orders "
                               "where each follows every other as often (to within one run)")},
        "summary": workload.summary,
        "count": workload.count,
        "unit": workload.unit,
        "convention": workload.convention,
        "time_unit": workload.time_unit,
        "floor_label": workload.floor_label,
        "timed": workload.timed,
        "load_average_at_start": load_average(),
    }
    if workload.timed:
        record.update(run_workload(workload, device, repeat, warmup, args.threads, progress))
        if workload.torch is not None:
            record["results"][TORCH_COMPILE] = _torch_compiled(workload, device, args, repeat,
                                                               warmup, progress)
    if workload.memory is not None:
        progress.say(f"{workload.name}: memory, one fresh process per implementation")
        record["memory"] = measure(workload, device, args.threads, progress)
    record["load_average_at_end"] = load_average()
    record["targets"] = check_targets(workload.targets, record)
    return record


# ================================================================================ --profile
def profile(args, lines=15):
    """cProfile of gradcore's run of one workload (after warm-up), top `lines` by own time."""
    workload = load([args.profile])[0]
    repeat, warmup = _runs(workload, args)
    contender = prepare("gradcore", workload.gradcore, args.device, args.threads)
    for _ in range(warmup):
        time_once(contender.run, contender.sync)
    profiler = cProfile.Profile()
    runs = min(repeat, 5)
    profiler.enable()
    for _ in range(runs):
        contender.run()
    contender.sync()
    profiler.disable()
    print(f"cProfile of gradcore's {workload.name} on {args.device}: {runs} run(s) after "
          f"{warmup} warm-up; {workload.summary}")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
