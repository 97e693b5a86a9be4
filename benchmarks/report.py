"""What a run leaves behind: the table on the terminal, and in a results folder <device>.json,
<device>.png and RESULTS.md, the last two always regenerated from the folder's JSON files.

A run writes to LOCAL (benchmarks/results/local/, which git ignores) or to `--out DIR`; only
`--publish` writes the committed figures: PUBLISHED (benchmarks/results/) and PUBLISHED_MD."""
import datetime
import glob
import json
import math
import os
import textwrap

from . import WORKLOADS, load
from .common import (KINDS, REPLAY, TIME_ROW, TORCH_COMPILE, check_targets, gradcore_ratios,
                     measured, median_ratio, number, per_unit, ratio, replay_row)

HERE = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = os.path.join(HERE, "results")
PUBLISHED_MD = os.path.join(HERE, "RESULTS.md")
LOCAL = os.path.join(PUBLISHED, "local")
WIDTH = 100  # columns of the terminal output
HEADERS = {"gradcore": "gradcore", "floor": "floor", "torch": "PyTorch"}
NAMES = {**HEADERS, "torch_compile": "torch.compile"}  # every implementation, for the notes
RATIO_HEADERS = {"gradcore/torch": "gradcore/PyTorch", "gradcore/floor": "gradcore/floor"}
LIBRARIES = {"numpy": "NumPy", "cupy": "CuPy"}
REPORT_KEYS = ("device", "floor_library", "machine", "workloads")  # what a report has, at least


# ================================================================================ figures
def reference_figure(entry, record):
    """A reference's line: its label, its figure per unit, and its ratio to PyTorch's figure of
    the same run when there is one (the implementations took turns: as fair as the table's)."""
    unit = "µs" if record["time_unit"] == "us" else record["time_unit"]
    text = f"{entry['label']}: {number(per_unit(entry, record))} {unit}/{record['unit']}"
    ratio = median_ratio(entry, record["results"].get("torch", {}))
    if ratio is not None:
        text += f" ({ratio:.3f}x PyTorch)"
    return text


def bandwidth(record, report):
    """On a GPU, for a workload that declares the least memory traffic of a run: the bandwidth
    each implementation reached with it, against the GPU's peak where the run recorded it."""
    if not report["device"].startswith("cuda") or record["name"] not in WORKLOADS:
        return None
    traffic = load([record["name"]])[0].traffic
    if traffic is None:
        return None
    size, counted = traffic
    reached = []
    for kind, entry in record.get("results", {}).items():
        seconds = measured(entry, "median_s_per_run")
        if seconds:
            reached.append((NAMES.get(kind, kind), size / seconds))
    if not reached:
        return None
    peak = report["machine"].get("gpu_peak_bytes_per_s")
    best = max(reached, key=lambda pair: pair[1])
    against = (f"; the GPU's peak by its specification: {peak / 1e12:.3g} TB/s, {best[0]} at "
               f"{best[1] / peak:.0%} of it" if peak else "; the GPU's peak: not recorded")
    return (f"memory traffic: at least {size / 1e9:.3g} GB a run ({counted}); reached: "
            + ", ".join(f"{name} {rate / 1e12:.3g} TB/s" for name, rate in reached) + against)


def rows(record, micro="µs"):
    """The table rows of one workload record: its time if it was timed, then its memory figures,
    each with the replay's row under it where there is one.

    Each row: {"id": "time", "replay", a memory figure's key or "replay KEY" (what a target's
    `row` names), "label", "unit", "values": {kind: float or None}, "ratios": {key: float or
    None} or None where ratios mean nothing (leak's growth), "cells": its line of the table,
    "replay": whether it is a replay's row, its figure in the gradcore column}.
    """
    out = []
    if record.get("timed", True):
        time_unit = micro if record["time_unit"] == "us" else record["time_unit"]
        unit = f"{time_unit}/{record['unit']}"
        values = {kind: per_unit(record["results"][kind], record) for kind in KINDS}
        out.append(_row(TIME_ROW, record["name"], unit, values, record["results"],
                        record["ratios"]))
        replay = record["results"].get(REPLAY, {"status": "none"})
        if replay["status"] != "none":
            out.append(_replay_row(TIME_ROW, unit, per_unit(replay, record), replay,
                                   record["ratios"], replay_floor(record)))
    memory = record.get("memory") or {"rows": (), "results": {}}
    results = memory["results"]
    for spec in memory["rows"]:
        values = {kind: measured(entry, spec["key"]) for kind, entry in results.items()}
        ratios = gradcore_ratios(values) if spec["ratios"] else None
        out.append(_row(spec["key"], spec["label"], memory["unit"], values, results, ratios))
        replay = results.get(REPLAY, {"status": "none"})
        if ratios is not None and replay["status"] != "none":
            out.append(_replay_row(spec["key"], memory["unit"], values[REPLAY], replay, ratios))
    return out


def _row(row_id, label, unit, values, entries, ratios):
    """A row of the table; a kind missing from `values` gets an empty cell."""
    values = {kind: values.get(kind) for kind in KINDS}
    cells = [number(values[kind]) if values[kind] is not None
             else "" if kind not in entries
             else "FAILED" if entries[kind]["status"] == "error" else "n/a" for kind in KINDS]
    cells += ["-" if ratios is None else "n/a" if ratios.get(key) is None
              else f"{number(ratios[key])}x" for key in RATIO_HEADERS]
    return {"id": row_id, "label": label, "unit": unit, "values": values, "ratios": ratios,
            "cells": [label, unit, *cells], "replay": False, "floor_key": None}


def _replay_row(under, unit, value, entry, ratios, floor=None):
    """The replay's row under the row `under`: gradcore.compile's figure in gradcore's column,
    its ratios to PyTorch and the floor (from `ratios`, "replay/torch"...) in gradcore's. With
    `floor` (a reference's entry: see `replay_floor`), that reference's figure in the floor's
    column, and the ratio to it in gradcore/floor."""
    ratios = {f"gradcore/{other}": ratios.get(f"{REPLAY}/{other}") for other in ("torch", "floor")}
    values, entries = {"gradcore": value}, {"gradcore": entry}
    if floor is not None:
        values["floor"], entries["floor"] = floor["figure"], floor["entry"]
        ratios["gradcore/floor"] = ratio(value, floor["figure"])
    row = _row(replay_row(under), f"  {REPLAY}", unit, values, entries, ratios)
    return {**row, "replay": True, "floor_key": floor["key"] if floor else None}


def replay_floor(record):
    """The reference that stands as the floor of the record's replay time row (its workload's
    `replay_floor`), where it ran: {"key", "label", "entry", "figure": per unit}; else None."""
    if record.get("name") not in WORKLOADS:
        return None
    key = load([record["name"]])[0].replay_floor
    entry = record.get("references", {}).get(key, {})
    figure = per_unit(entry, record)
    if not key or figure is None:
        return None
    return {"key": key, "label": entry["label"], "entry": entry, "figure": figure}


def targets_of(record):
    """The record's targets: a list of {"text", "measured", "met", "row": a row id}. An older
    record has one "target" whose row is an index into the rows its table had: the time row
    (0) if it was timed, then the memory rows."""
    if "targets" in record:
        return record["targets"]
    target = record.get("target")
    if not target:
        return []
    ids = ([TIME_ROW] if record.get("timed", True) else []) + [
        spec["key"] for spec in (record.get("memory") or {}).get("rows", ())]
    return [{**target, "row": ids[min(target.get("row", 0), len(ids) - 1)] if ids else TIME_ROW}]


def checked(report):
    """`report` with the targets of each record checked again by its workload's Targets as they
    are now (a rule can change after a run: mlp's floor target became CPU-only), a record that
    names no device taken to be on the report's."""
    workloads = {}
    for name, record in report["workloads"].items():
        record = upgraded(record)
        if name in WORKLOADS:
            record = {**record, "device": record.get("device") or report["device"]}
            record["targets"] = check_targets(load([name])[0].targets, record)
        workloads[name] = record
    return {**report, "workloads": workloads}


def upgraded(record):
    """`record` with its targets as this version writes them (see `targets_of`)."""
    if "target" not in record:
        return record
    return {**{key: value for key, value in record.items() if key != "target"},
            "targets": targets_of(record)}


def met_text(target):
    return {True: "met", False: "NOT met", None: "not measured"}[target["met"]]


def table(records, micro="µs", targets=False):
    """The rows of the figures' table as lists of cells, the header first; `targets` adds a
    column saying whether the targets of each row were met (markdown bold where one was not)."""
    header = ["workload", "unit", *HEADERS.values(), *RATIO_HEADERS.values()]
    out = [header + ["target"] if targets else header]
    for record in records:
        shown = rows(record, micro)
        goals = {}
        for target in targets_of(record) if shown else ():
            met = met_text(target)
            goal = f"{target['text'].replace('<=', '≤')}: " + (
                f"**{met}**" if target["met"] is False else met)
            # a row id the record's table lacks goes on its first row rather than nowhere
            row = target["row"] if any(r["id"] == target["row"] for r in shown) else shown[0]["id"]
            goals.setdefault(row, []).append(goal)
        for row in shown:
            out.append(row["cells"] + ["; ".join(goals.get(row["id"], []))] if targets
                       else row["cells"])
    return out


def _library(report):
    return LIBRARIES.get(report["floor_library"], report["floor_library"])


def _threads(count):
    return f"{count} thread{'s' if count != 1 else ''}"


# ================================================================================ the terminal
def print_table(report, micro):
    """This run's figures, targets and notes, every line within WIDTH columns."""
    info = report["machine"]
    library = _library(report)
    where = info["gpu"] if report["device"].startswith("cuda") else info["cpu"]
    _say(f"gradcore benchmarks on device {report['device']} ({where}; {info['usable_cpus']} "
         f"CPU(s) usable; {_threads(info['threads']['suite'])} for BLAS and PyTorch)")
    _say(f"times: median of the timed runs, the implementations taking turns; floor = "
         f"hand-written {library}, no autodiff; n/a = not run (see notes)")
    loads = [record["load_average_at_start"][0] for record in report["workloads"].values()
             if record.get("load_average_at_start")]
    shared = shared_machine(report, f"1-minute load average up to {max(loads, default=0):.2f} "
                                    "as the workloads started")
    if shared:
        _say(shared)
    print()
    records = report["workloads"].values()
    lines = table(records, micro)
    widths = [max(map(len, column)) for column in zip(*lines)]
    lines.insert(1, ["-" * width for width in widths])
    for cells in lines:  # label and unit to the left, figures to the right
        print("  ".join(cell.ljust(width) if i < 2 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(cells, widths))).rstrip())
    targets = [(record["name"], target) for record in records for target in targets_of(record)]
    if targets:
        print("\ntargets:")
        for name, target in targets:
            _say(f"  {name}: {target['text']}: {target['measured']}, {met_text(target)}")
    print("\nnotes:")
    for record in records:
        for line in _notes(record, library, report):
            _say(line)


def _say(line):
    """Print `line` within WIDTH columns, going on indented two more than it starts."""
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    print(textwrap.fill(line, WIDTH, subsequent_indent=indent))


def _replay_floor_text(floor):
    return (f"the replay row's floor is the reference ({floor['label']}): the replay's tape "
            "computes as it does, the floor does not")


def _notes(record, library, report):
    """The lines under the table that say what a workload's rows measured."""
    lines = [f"  {record['name']}: {record['summary']}", f"    counted: {record['convention']}"]
    if record["floor_label"]:
        lines.append(f"    floor: {library}, {record['floor_label']}")
    results, memory = record.get("results", {}), record.get("memory", {})
    torch = results.get("torch", {})
    if torch.get("status") == "ok":
        lines.append(f"    PyTorch: on {torch['torch_device']}, {_threads(torch['torch_threads'])}")
    if record.get("timed", True):
        lines.append(f"    runs: {record['settings']['warmup']} warm-up + "
                     f"{record['settings']['repeat']} timed per implementation")
    if memory:
        lines.append(f"    memory: {memory['summary']}")
    for prefix, section in (("", results), ("memory ", memory.get("results", {}))):
        for kind, entry in section.items():
            if entry["status"] in ("skipped", "none"):
                lines.append(f"    {prefix}{NAMES.get(kind, kind)}: n/a: {entry['reason']}")
            elif entry["status"] == "error":
                lines.append(f"    {prefix}{NAMES.get(kind, kind)}: FAILED: {entry['error']}")
    compiled = results.get(TORCH_COMPILE, {})
    if compiled.get("status") == "ok":
        unit = "µs" if record["time_unit"] == "us" else record["time_unit"]
        versus = compiled["median_s_per_run"] / compiled["torch_eager_median_s_per_run"]
        lines.append(f"    torch.compile of the PyTorch run: {number(per_unit(compiled, record))} "
                     f"{unit}/{record['unit']}, {versus:.3g}x PyTorch eager timed beside it in a "
                     f"process of its own, after {compiled['compile_s']:.3g} s of compiling"
                     + (f" {compiled['graphs']} graph(s)" if compiled.get("graphs") else ""))
    replay = results.get(REPLAY, {})
    if replay.get("status") == "ok":
        eager = measured(results.get("gradcore", {}), "median_s_per_run")
        times = f" ({replay['recording_s'] / eager:.1f}x one eager run)" if eager else ""
        lines.append(f"    replay: gradcore.compile of gradcore's run, recorded in "
                     f"{replay['recording_s'] * 1e3:.3g} ms{times} (the median of three, "
                     f"after a first that pays one-time set-up): a tape of "
                     f"{replay['tape_ops']:,} ops, replayed as compiled Python"
                     + (f" launching {replay['graphs']} device graph(s) for its runs of GPU ops"
                        if replay.get("graphs") else "")
                     + (f" (not as graphs: {'; '.join(replay['why_not_graphs'])})"
                        if replay.get("why_not_graphs") else "")
                     + (f"; a call costs {replay['call_overhead_us']:.2g} µs besides its ops"
                        if "call_overhead_us" in replay else ""))
    floor = replay_floor(record)
    if floor:
        lines.append(f"    {_replay_floor_text(floor)}")
    for key, entry in record.get("references", {}).items():
        if entry["status"] == "ok":
            lines.append(f"    reference, {reference_figure(entry, record)}")
        elif entry["status"] == "error":
            lines.append(f"    reference {key}: FAILED: {entry['error']}")
    rates = bandwidth(record, report)
    if rates:
        lines.append(f"    {rates}")
    return lines


# ================================================================================ JSON
def write_json(report, folder):
    """Write the report as FOLDER/<device>.json (cpu.json; cuda.json for GPU 0, cuda1.json...).
    Workloads this run did not measure (--only) keep their figures from the file there, each
    record with its own date and command."""
    path = os.path.join(folder, report["device"].replace(":0", "").replace(":", "") + ".json")
    previous = _read_json(path) or {}
    if previous.get("device") != report["device"]:
        previous = {}
    kept = {name: upgraded(record) for name, record in previous.get("workloads", {}).items()
            if record.get("name") == name}  # an older file's records lack it: dropped
    kept.update(report["workloads"])
    report = {**report, "workloads": {name: kept[name] for name in WORKLOADS if name in kept}}
    os.makedirs(folder, exist_ok=True)
    _write(path, json.dumps(report, indent=2) + "\n")
    return path


def _read_json(path):
    """What the JSON file at `path` holds; None if it cannot be read or is not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write(path, text):
    """Replace the file at `path` at once: a reader never sees half of it."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_all(folder, markdown):
    """The results markdown (at `markdown`) and a chart per FOLDER/*.json, from those files;
    a JSON file that is no report of the suite's is left alone, with a note. Returns the paths
    written: none when there is no report."""
    reports = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        report = _read_json(path)
        if isinstance(report, dict) and all(key in report for key in REPORT_KEYS):
            reports.append((path, checked(report)))
        elif report is not None:  # a file of the user's in --out's folder
            print(f"note: {path} is left out of the results: it is no report of the suite's "
                  f"(those have the keys {', '.join(REPORT_KEYS)})")
    reports.sort(key=lambda pair: pair[1]["device"] != "cpu")  # the CPU first
    if not reports:
        return []
    _write(markdown, results_md(reports, os.path.dirname(markdown)))
    charts = [write_chart(path[:-len(".json")] + ".png", report) for path, report in reports]
    return [markdown, *filter(None, charts)]


# ================================================================================ RESULTS.md
def _when(iso):
    moment = datetime.datetime.fromisoformat(iso).astimezone(datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _run(record, report):
    """The run a record comes from: (its start, its commit's first 10 digits or "", dirty)."""
    git = record.get("git") or {}
    return (record.get("run_started", record.get("date", report["date"])),
            (git.get("commit") or "")[:10], bool(git.get("dirty")))


def shared_machine(report, loads):
    """A sentence saying that other work shared the machine, where the 1-minute load average as
    one of the report's workloads started was 1 (the suite's own process, busy all along) plus
    half its usable CPUs or more; "" otherwise. `loads`: where the load averages are, or what
    they were, in parentheses after "on it"."""
    info = report["machine"]
    at_start = [record.get("load_average_at_start") for record in report["workloads"].values()]
    threshold = 1 + 0.5 * (info.get("usable_cpus") or 1)
    if not any(load and load[0] >= threshold for load in at_start):
        return ""
    host = "VM" if info.get("virtual_machine") else "machine"
    return (f"Figures were taken on a shared {info.get('usable_cpus')}-core {host} while other "
            f"jobs ran on it ({loads}), so they are noisy: the implementations take turns run "
            "by run and each figure is a median, which keeps the ratios fair, but absolute times "
            "vary from run to run.")


def results_md(reports, where):
    """The text of RESULTS.md, to be saved in the folder `where`, from the JSON reports."""
    out = ["# Benchmark results", "",
           "Generated by `python -m benchmarks` from the JSON files it links to "
           "(`--write-results` regenerates it without running anything): do not edit it by "
           "hand. Only `python -m benchmarks --publish` updates the committed copy, "
           "benchmarks/RESULTS.md; other runs write to benchmarks/results/local/ (or `--out "
           "DIR`). What each workload does and how to run the suite: the Benchmarks section of "
           "README.md.", ""]
    for path, report in reports:
        out += _device_section(os.path.relpath(path, where), report)
    return "\n".join(out).rstrip() + "\n"


def _software(record, info):
    """The versions and thread count `record`'s figures were taken with: its own, where it keeps
    them, else those of the file's machine (`info`, the last run's)."""
    versions = record.get("versions", info["versions"])
    threads = record.get("settings", {}).get("threads", info["threads"]["suite"])
    return (f"NumPy {versions['numpy']}, PyTorch {versions['torch'] or 'not installed'}, "
            f"CuPy {versions['cupy'] or 'not installed'}, Python {versions['python']}, "
            f"BLAS {info.get('numpy_blas')}; {_threads(threads)} for the BLAS and for PyTorch")


def _device_section(relpath, report):
    info, device = report["machine"], report["device"]
    records = report["workloads"].values()
    cpus = info.get("usable_cpus") or info.get("logical_cpus")
    vm = " virtual machine" if info.get("virtual_machine") else ""
    machine = f"{cpus}-core{vm} ({info.get('cpu')})"
    if device.startswith("cuda"):
        machine = f"{info.get('gpu')} on a {machine}"
    out = [f"## {device}: {machine}", ""]
    shared = shared_machine(report, "see the load averages below")
    shared = f" {shared}" if shared else ""
    software = {_software(record, info) for record in records} or {_software({}, info)}
    several = len(software) > 1  # runs merged by --only that differ: each run line says its own
    common = "Versions and threads: each run's, below" if several else software.pop()
    out += [f"{common}. Floor = the same arithmetic by hand in {_library(report)}, no "
            f"autodiff. Raw figures, every sample and the machine: "
            f"[{relpath}]({relpath}); chart: [{relpath[:-5]}.png]({relpath[:-5]}.png).{shared}",
            ""]

    # when and how each figure was taken: one line per run of the suite
    runs = {}
    for record in records:
        runs.setdefault((*_run(record, report), record.get("command", "")), []).append(record)
    for (started, commit, dirty, command), members in runs.items():
        names = ", ".join(record["name"] for record in members)
        at = f" at commit {commit}" if commit else ""
        at += " with uncommitted changes" if commit and dirty else ""
        loads = [record["load_average_at_start"][0] for record in members
                 if record.get("load_average_at_start")]
        load = ""
        if loads:
            low, high = min(loads), max(loads)
            load = f"; 1-minute load average {low:.2f}" + (f" to {high:.2f}" if high > low else "")
            load += " as its workloads started"
        own = f"; {_software(members[0], info)}" if several else ""
        out.append(f"- {names}: taken {_when(started)} on {device} with `{command}`{at}{load}"
                   f"{own}.")

    header, *body = table(records, targets=True)
    out += ["", "| " + " | ".join(header) + " |",
            "|---|---|" + "---:|" * (len(header) - 3) + "---|"]
    out += ["| " + " | ".join(cells) + " |" for cells in body]
    out += ["", "What each row measures:", ""]
    for record in records:
        line = f"- **{record['name']}**: {record['summary']}. Counted: {record['convention']}."
        if record["floor_label"]:
            line += f" Floor: {record['floor_label']}."
        if record.get("memory"):
            line += f" Memory: {record['memory']['summary']}."
        for entry in record.get("references", {}).values():
            if entry["status"] == "ok":
                line += f" Reference, {reference_figure(entry, record)}."
        floor = replay_floor(record)
        if floor:
            text = _replay_floor_text(floor)
            line += f" {text[0].upper()}{text[1:]}."
        rates = bandwidth(record, report)
        if rates:
            line += f" {rates[0].upper()}{rates[1:]}."
        out.append(line)
    return out + [""]


# ================================================================================ the chart
def chart_panels(report):
    """(row, title) for each panel of the chart, and the set of runs the panels come from. A
    title names its row and its ratio to PyTorch and, when the panels come from several runs
    (after --only), the date and commit of its own run."""
    runs = {_run(record, report) for record in report["workloads"].values()}
    panels = []
    for record in report["workloads"].values():
        for row in rows(record):
            if row["replay"]:  # "  replay" alone would not say whose
                title = f"{above}, {REPLAY}"
            else:
                title = above = row["label"]
            if row["ratios"] and row["ratios"].get("gradcore/torch") is not None:
                title += f"  ({number(row['ratios']['gradcore/torch'])}x PyTorch)"
            if len(runs) > 1:
                title += "\n" + _run_label(_run(record, report))
            panels.append((row, title))
    return panels, runs


def _run_label(run):
    started, commit, dirty = run
    commit = f", commit {commit}" + (" (modified)" if dirty else "") if commit else ""
    return _when(started) + commit


def write_chart(path, report):
    """<device>.png: one panel per table row, a bar per implementation. Returns the path, or
    None (and says why) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed (pip install -e '.[bench]'): no chart")
        return None
    panels, runs = chart_panels(report)
    if not panels:
        return None
    columns = min(4, math.ceil(len(panels) ** 0.5))
    lines = -(-len(panels) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(3.4 * columns, 3.0 * lines),
                                squeeze=False)
    colours = {"gradcore": "#1f77b4", "floor": "#7f7f7f", "torch": "#ff7f0e"}
    labels = {"gradcore": "gradcore", "floor": f"floor\n({_library(report)})", "torch": "PyTorch"}
    for ax, (row, title) in zip(axes.flat, panels):
        kinds = [k for k in KINDS if row["values"][k] is not None]
        heights = [row["values"][k] for k in kinds]
        names = {**labels, "gradcore": REPLAY} if row["replay"] else labels
        if row["floor_key"]:
            names = {**names, "floor": row["floor_key"]}
        bars = ax.bar([names[k] for k in kinds], heights, color=[colours[k] for k in kinds])
        ax.bar_label(bars, labels=[number(value) for value in heights], fontsize=8)
        ax.set_title(title, fontsize=9 if len(runs) == 1 else 8)
        ax.set_ylabel(row["unit"], fontsize=8)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.2)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    info = report["machine"]
    where = info["gpu"] if report["device"].startswith("cuda") else info["cpu"]
    when = _run_label(*runs) if len(runs) == 1 else f"{len(runs)} runs (each panel says which)"
    figure.suptitle(f"gradcore benchmarks, {report['device']} ({where}), {when}; lower is better",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
