"""`python -m benchmarks [--device cpu|cuda|auto] [--only NAME ...] [--repeat N] [--warmup N]`:
run the suite, print a table, write benchmarks/results/DEVICE.json."""
import argparse
import datetime
import json
import os
import shlex
import sys

import backends

from . import WORKLOADS, load
from .common import KINDS, machine_info, per_unit, resolve_device, run_workload

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HEADERS = {"gradcore": "gradcore", "floor": "floor", "torch": "PyTorch"}
LIBRARIES = {"numpy": "NumPy", "cupy": "CuPy"}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time gradcore against hand-written NumPy/CuPy (the floor) and PyTorch.")
    parser.add_argument("--device", default="auto", metavar="{cpu,cuda,auto}",
                        help="where to run (also cuda:N); auto = cuda if a GPU is usable, else cpu")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=WORKLOADS,
                        help=f"run only these workloads (of: {', '.join(WORKLOADS)})")
    parser.add_argument("--repeat", type=_positive, default=20, metavar="N",
                        help="timed runs per figure; the median is reported (default 20)")
    parser.add_argument("--warmup", type=_count, default=3, metavar="N",
                        help="untimed runs before timing (default 3)")
    args = parser.parse_args(argv)
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
    return args


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def progress(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = args.device
    progress(f"running on device {device}")
    info = machine_info(device)
    records = {}
    workloads = load(args.only)
    for i, workload in enumerate(workloads, 1):
        progress(f"workload {i}/{len(workloads)}: {workload.name}")
        records[workload.name] = run_workload(workload, device, args.repeat, args.warmup, progress)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "benchmarks", *argv]),
        "python_executable": sys.executable,
        "device": str(device),
        "floor_library": backends.backend_for_device(device).name,
        "settings": {"repeat": args.repeat, "warmup": args.warmup,
                     "statistic": "median of the timed runs",
                     "clock": "time.perf_counter, device synchronized before each reading",
                     "gc": "enabled; gc.collect() before each timed run"},
        "machine": info,
        "workloads": records,
    }
    path = write_json(report, device)
    print_table(report, _micro())
    print(f"\nresults: {os.path.relpath(path)}")
    failed = [f"{name}/{kind}" for name, record in records.items()
              for kind, entry in {**record["results"], **record["references"]}.items()
              if entry["status"] == "error"]
    if failed:
        progress(f"FAILED: {', '.join(failed)} (see the notes)")
    return 1 if failed else 0


# ================================================================================ output
def write_json(report, device):
    """The report as results/<device>.json (cpu.json, cuda.json, cuda1.json), written atomically."""
    os.makedirs(RESULTS, exist_ok=True)
    name = device.type if device.index in (None, 0) else f"{device.type}{device.index}"
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def _micro():
    """"µs" if the terminal can print it, else "us"."""
    try:
        "µ".encode(sys.stdout.encoding or "ascii")
        return "µs"
    except (UnicodeEncodeError, LookupError):
        return "us"


def _number(value):
    """Three significant digits, no trailing dot: 7.99, 0.673, 11.9, 125."""
    return f"{value:#.3g}".rstrip(".")


def print_table(report, micro):
    info = report["machine"]
    library = LIBRARIES.get(report["floor_library"], report["floor_library"])
    settings = report["settings"]
    where = info["gpu"] if report["device"].startswith("cuda") else info["cpu"]
    print(f"gradcore benchmarks on device {report['device']} ({where}; "
          f"{info['usable_cpus']} CPU(s) usable); median of {settings['repeat']} timed runs "
          f"after {settings['warmup']} warm-up runs")
    print(f"floor = hand-written {library}, no autodiff; the implementations take turns, one run "
          "each per round; n/a = not run (see notes)\n")

    rows = [["workload", *(HEADERS[kind] for kind in KINDS), "gradcore/PyTorch", "gradcore/floor"]]
    notes = []
    for name, record in report["workloads"].items():
        unit = f"{micro if record['time_unit'] == 'us' else record['time_unit']}/{record['unit']}"
        row = [name]
        for kind in KINDS:
            entry = record["results"][kind]
            value = per_unit(entry, record)
            if value is not None:
                row.append(f"{_number(value)} {unit}")
            else:
                row.append("FAILED" if entry["status"] == "error" else "n/a")
        for key in ("gradcore/torch", "gradcore/floor"):
            ratio = record["ratios"][key]
            row.append("n/a" if ratio is None else f"{_number(ratio)}x")
        rows.append(row)
        notes.extend(_notes(name, record, unit, library))

    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nnotes:")
    for line in notes:
        print(line)


def _notes(name, record, unit, library):
    """The lines under the table that say what a row measured."""
    lines = [f"  {name}: {record['summary']}",
             f"    ops: {record['convention']}"]
    if record["floor_label"]:
        lines.append(f"    floor: {library}, {record['floor_label']}")
    torch = record["results"]["torch"]
    if torch["status"] == "ok":
        threads = torch["torch_threads"]
        lines.append(f"    PyTorch: on {torch['torch_device']}, "
                     f"{threads} thread{'s' if threads != 1 else ''} (torch.set_num_threads)")
    for kind, entry in record["results"].items():
        if entry["status"] in ("skipped", "none"):
            lines.append(f"    {HEADERS[kind]}: n/a: {entry['reason']}")
        elif entry["status"] == "error":
            lines.append(f"    {HEADERS[kind]}: FAILED: {entry['error']}")
    for key, entry in record["references"].items():
        if entry["status"] == "ok":
            figure = _number(per_unit(entry, record))
            lines.append(f"    reference, {entry['label']}: {figure} {unit}")
        elif entry["status"] == "error":
            lines.append(f"    reference {key}: FAILED: {entry['error']}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
