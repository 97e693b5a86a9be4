"""What a run leaves behind: the table on the terminal, results/<device>.json, results/<device>.png
and benchmarks/RESULTS.md, the last three always regenerated from the JSON files."""
import datetime
import glob
import json
import math
import os

from . import WORKLOADS
from .common import KINDS, median_ratio, per_unit

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
HEADERS = {"gradcore": "gradcore", "floor": "floor", "torch": "PyTorch"}
RATIOS = ("gradcore/torch", "gradcore/floor")
RATIO_HEADERS = {"gradcore/torch": "gradcore/PyTorch", "gradcore/floor": "gradcore/floor"}
LIBRARIES = {"numpy": "NumPy", "cupy": "CuPy"}


# ================================================================================ figures
def number(value):
    """Three significant digits, no trailing dot, no exponent: 7.99, 0.673, 11.9, 125, 1234."""
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:#.3g}".rstrip(".")


def reference_figure(entry, record):
    """A reference's line: its label, its figure per unit, and its ratio to PyTorch's figure of
    the same run when there is one (the implementations took turns: as fair as the table's)."""
    unit = "µs" if record["time_unit"] == "us" else record["time_unit"]
    text = f"{entry['label']}: {number(per_unit(entry, record))} {unit}/{record['unit']}"
    ratio = median_ratio(entry, record["results"].get("torch", {}))
    if ratio is not None:
        text += f" ({ratio:.3f}x PyTorch)"
    return text


def rows(record, micro="µs"):
    """The table rows of one workload record: its time if it was timed, then its memory figures.

    Each row: {"label", "unit", "cells": {kind: text}, "values": {kind: float or None},
    "ratios": {key: float or None} or None where ratios mean nothing (leak's growth)}.
    """
    out = []
    if record.get("timed", True):
        time_unit = micro if record["time_unit"] == "us" else record["time_unit"]
        values = {kind: per_unit(record["results"][kind], record) for kind in KINDS}
        out.append(_row(record["name"], f"{time_unit}/{record['unit']}", values,
                        record["results"], record["ratios"]))
    memory = record.get("memory")
    if memory:
        for spec in memory["rows"]:
            results = memory["results"]
            values = {kind: results[kind].get(spec["key"]) if results[kind]["status"] == "ok"
                      else None for kind in KINDS}
            ratios = None
            if spec["ratios"]:
                ratios = {key: _safe_ratio(values["gradcore"], values[key.split("/")[1]])
                          for key in RATIOS}
            out.append(_row(spec["label"], memory["unit"], values, results, ratios))
    return out


def _safe_ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _row(label, unit, values, entries, ratios):
    cells = {}
    for kind in KINDS:
        if values[kind] is not None:
            cells[kind] = f"{number(values[kind])} {unit}"
        else:
            cells[kind] = "FAILED" if entries[kind]["status"] == "error" else "n/a"
    return {"label": label, "unit": unit, "cells": cells, "values": values, "ratios": ratios}


def ratio_text(row, key):
    if row["ratios"] is None:
        return "-"
    ratio = row["ratios"].get(key)
    return "n/a" if ratio is None else f"{number(ratio)}x"


def met_text(target):
    return {True: "met", False: "NOT met", None: "not measured"}[target["met"]]


# ================================================================================ the terminal
def print_table(report, micro):
    info = report["machine"]
    library = LIBRARIES.get(report["floor_library"], report["floor_library"])
    where = info["gpu"] if report["device"].startswith("cuda") else info["cpu"]
    threads = info["threads"]["suite"]
    print(f"gradcore benchmarks on device {report['device']} ({where}; {info['usable_cpus']} "
          f"CPU(s) usable; {threads} thread{'s' if threads != 1 else ''} for BLAS and PyTorch)")
    print(f"times: median of the timed runs, the implementations taking turns; floor = "
          f"hand-written {library}, no autodiff; n/a = not run (see notes)\n")

    table = [["workload", *(HEADERS[kind] for kind in KINDS), *RATIO_HEADERS.values()]]
    notes = []
    for record in report["workloads"].values():
        for row in rows(record, micro):
            table.append([row["label"], *(row["cells"][kind] for kind in KINDS),
                          *(ratio_text(row, key) for key in RATIOS)])
        notes.extend(_notes(record, library))
    _print_aligned(table)

    targets = [(name, record["target"]) for name, record in report["workloads"].items()
               if record.get("target")]
    if targets:
        print("\ntargets (issue 5):")
        _print_aligned([[f"  {name}", t["text"], t["measured"], met_text(t)]
                        for name, t in targets], header=False)
    print("\nnotes:")
    for line in notes:
        print(line)


def _print_aligned(table, header=True):
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) if header else c.ljust(w) for c, w in zip(row[1:], widths[1:])]
        print("  ".join(cells).rstrip())
        if header and i == 0:
            print("  ".join("-" * w for w in widths))


def _notes(record, library):
    """The lines under the table that say what a workload's rows measured."""
    name = record["name"]
    lines = [f"  {name}: {record['summary']}", f"    counted: {record['convention']}"]
    if record["floor_label"]:
        lines.append(f"    floor: {library}, {record['floor_label']}")
    sections = []
    if record.get("timed", True):
        sections.append(("", record["results"]))
        torch = record["results"]["torch"]
        if torch["status"] == "ok":
            threads = torch["torch_threads"]
            lines.append(f"    PyTorch: on {torch['torch_device']}, {threads} "
                         f"thread{'s' if threads != 1 else ''}")
        lines.append(f"    runs: {record['settings']['warmup']} warm-up + "
                     f"{record['settings']['repeat']} timed per implementation")
    if record.get("memory"):
        lines.append(f"    memory: {record['memory']['summary']}")
        sections.append(("memory ", record["memory"]["results"]))
    for prefix, results in sections:
        for kind, entry in results.items():
            if entry["status"] in ("skipped", "none"):
                lines.append(f"    {prefix}{HEADERS[kind]}: n/a: {entry['reason']}")
            elif entry["status"] == "error":
                lines.append(f"    {prefix}{HEADERS[kind]}: FAILED: {entry['error']}")
    for key, entry in record.get("references", {}).items():
        if entry["status"] == "ok":
            lines.append(f"    reference, {reference_figure(entry, record)}")
        elif entry["status"] == "error":
            lines.append(f"    reference {key}: FAILED: {entry['error']}")
    return lines


# ================================================================================ JSON
def json_path(device_name):
    """results/cpu.json, results/cuda.json (GPU 0), results/cuda1.json."""
    name = device_name.replace(":0", "").replace(":", "")
    return os.path.join(RESULTS, f"{name}.json")


def write_json(report):
    """Write the report as results/<device>.json, atomically. Workloads this run did not measure
    (--only) keep their figures from the file, each record with its own date and command."""
    path = json_path(report["device"])
    try:
        with open(path) as f:
            previous = json.load(f)
        if previous.get("device") != report["device"]:
            previous = {}
    except (OSError, ValueError):
        previous = {}
    kept = {name: record for name, record in previous.get("workloads", {}).items()
            if record.get("name") == name}  # an older file's records lack it: dropped
    kept.update(report["workloads"])
    report = {**report, "workloads": {name: kept[name] for name in WORKLOADS if name in kept}}
    os.makedirs(RESULTS, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def load_reports():
    """Every results/*.json, the CPU first."""
    reports = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        try:
            with open(path) as f:
                reports.append((path, json.load(f)))
        except (OSError, ValueError):
            continue
    return sorted(reports, key=lambda pair: (not pair[1].get("device") == "cpu", pair[0]))


# ================================================================================ RESULTS.md
def _when(iso):
    moment = datetime.datetime.fromisoformat(iso).astimezone(datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _machine_line(info, device):
    cpus = info.get("usable_cpus") or info.get("logical_cpus")
    vm = " virtual machine" if info.get("virtual_machine") else ""
    text = f"{cpus}-core{vm} ({info.get('cpu')})"
    if device.startswith("cuda"):
        text = f"{info.get('gpu')} on a {text}"
    return text


def _busy(record, info):
    """True if the machine was loaded by other work when the record's run started."""
    load = record.get("load_average_at_start")
    return bool(load) and load[0] >= 0.5 * (info.get("usable_cpus") or 1)


def write_results_md(reports):
    """benchmarks/RESULTS.md from the JSON reports (never edited by hand)."""
    out = ["# Benchmark results", "",
           "Generated by `python -m benchmarks` from `benchmarks/results/*.json` after every run "
           "(`python -m benchmarks --write-results` regenerates it without running anything): "
           "do not edit it by hand. What each workload does and how to run the suite: the "
           "Benchmarks section of README.md.", ""]
    for path, report in reports:
        out += _device_section(os.path.relpath(path, HERE), report)
    with open(RESULTS_MD + ".tmp", "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
    os.replace(RESULTS_MD + ".tmp", RESULTS_MD)
    return RESULTS_MD


def _device_section(relpath, report):
    info = report["machine"]
    device = report["device"]
    library = LIBRARIES.get(report["floor_library"], report["floor_library"])
    versions = info["versions"]
    threads = info["threads"]["suite"]
    out = [f"## {device}: {_machine_line(info, device)}", ""]
    shared = ""
    if any(_busy(record, info) for record in report["workloads"].values()):
        machine = "VM" if info.get("virtual_machine") else "machine"
        shared = (f" Figures were taken on a shared {info.get('usable_cpus')}-core {machine} "
                  "while other jobs ran on it (see the load averages below), so they are noisy: "
                  "the implementations take turns run by run and each figure is a median, which "
                  "keeps the ratios fair, but absolute times vary from run to run.")
    out += [f"NumPy {versions['numpy']}, PyTorch {versions['torch'] or 'not installed'}, "
            f"CuPy {versions['cupy'] or 'not installed'}, Python {versions['python']}, "
            f"BLAS {info.get('numpy_blas')}; {threads} thread{'s' if threads != 1 else ''} for "
            f"the BLAS and for PyTorch. Floor = the same arithmetic by hand in {library}, no "
            f"autodiff. Raw figures, every sample and the machine: "
            f"[{relpath}]({relpath}); chart: [{relpath[:-5]}.png]({relpath[:-5]}.png).{shared}",
            ""]

    # when and how each figure was taken: one line per run of the suite
    runs = {}
    for name, record in report["workloads"].items():
        started = record.get("run_started", record.get("date", report["date"]))
        runs.setdefault((started, record.get("command", "")), []).append((name, record))
    for (started, command), members in runs.items():
        names = ", ".join(name for name, _ in members)
        git = members[0][1].get("git") or {}
        at = ""
        if git.get("commit"):
            at = f" at commit {git['commit'][:10]}"
            at += " with uncommitted changes" if git.get("dirty") else ""
        loads = [record["load_average_at_start"][0] for _, record in members
                 if record.get("load_average_at_start")]
        load = ""
        if loads:
            low, high = min(loads), max(loads)
            load = f"; 1-minute load average {low:.2f}" + (f" to {high:.2f}" if high > low else "")
            load += " as its workloads started"
        out.append(f"- {names}: taken {_when(started)} on {device} with `{command}`{at}{load}.")
    out.append("")

    table = [["workload", *(HEADERS[k] for k in KINDS), *RATIO_HEADERS.values(),
              "target (issue 5)"]]
    for record in report["workloads"].values():
        target = record.get("target")
        for i, row in enumerate(rows(record)):
            goal = ""
            if target and i == target.get("row", 0):
                met = met_text(target)
                goal = f"{target['text'].replace('<=', '≤')}: " + (
                    f"**{met}**" if target["met"] is False else met)
            table.append([row["label"], *(row["cells"][k] for k in KINDS),
                          *(ratio_text(row, key) for key in RATIOS), goal])
    out += _markdown_table(table, "l" + "r" * (len(table[0]) - 2) + "l")

    out.append("What each row measures:")
    out.append("")
    for name, record in report["workloads"].items():
        line = f"- **{name}**: {record['summary']}. Counted: {record['convention']}."
        if record["floor_label"]:
            line += f" Floor: {record['floor_label']}."
        if record.get("memory"):
            line += f" Memory: {record['memory']['summary']}."
        for key, entry in record.get("references", {}).items():
            if entry["status"] == "ok":
                line += f" Reference, {reference_figure(entry, record)}."
        out.append(line)
    out.append("")
    return out


def _markdown_table(table, align):
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    return lines + [""]


# ================================================================================ the chart
def write_chart(path, report):
    """results/<device>.png: one panel per table row, a bar per implementation. Returns the path,
    or None (and says why) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed (pip install -e '.[bench]'): no chart")
        return None
    panels = [row for record in report["workloads"].values() for row in rows(record)]
    if not panels:
        return None
    columns = min(4, math.ceil(len(panels) ** 0.5))
    lines = -(-len(panels) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(3.4 * columns, 2.9 * lines),
                                squeeze=False)
    colours = {"gradcore": "#1f77b4", "floor": "#7f7f7f", "torch": "#ff7f0e"}
    library = LIBRARIES.get(report["floor_library"], report["floor_library"])
    labels = {"gradcore": "gradcore", "floor": f"floor\n({library})", "torch": "PyTorch"}
    for ax, row in zip(axes.flat, panels):
        kinds = [k for k in KINDS if row["values"][k] is not None]
        heights = [row["values"][k] for k in kinds]
        bars = ax.bar([labels[k] for k in kinds], heights, color=[colours[k] for k in kinds])
        for bar, value in zip(bars, heights):
            ax.annotate(number(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        title = row["label"]
        if row["ratios"] and row["ratios"].get("gradcore/torch") is not None:
            title += f"  ({number(row['ratios']['gradcore/torch'])}x PyTorch)"
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(row["unit"], fontsize=8)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.2)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    info = report["machine"]
    where = info["gpu"] if report["device"].startswith("cuda") else info["cpu"]
    figure.suptitle(f"gradcore benchmarks, {report['device']} ({where}), {_when(report['date'])}"
                    "; lower is better", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_all():
    """RESULTS.md and every chart, from the JSON files. Returns the paths written."""
    reports = load_reports()
    written = [write_results_md(reports)]
    for path, report in reports:
        chart = write_chart(path[:-len(".json")] + ".png", report)
        if chart:
            written.append(chart)
    return written
