"""Graph drawing: the graph behind a Variable as Graphviz DOT text, and rendered by `dot`."""
import os
import shutil
import subprocess

import backends

from ..variable import Variable

_SCALARS = (int, float, bool, complex)


def _quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _variable_label(v, verbose):
    # str(): a name is whatever was assigned (name=5 too), and 0 is a name, not a missing one
    label = "" if v.name is None else str(v.name)
    if verbose and v.data is not None:
        if label:
            label += ": "
        label += f"{tuple(v.shape)} {v.dtype}"
        device = v.device
        if device != backends.CPU:
            label += f" {device}"
    return label


def _variable_node(v, verbose):
    return (f"{id(v)} [label={_quote(_variable_label(v, verbose))}, "
            "color=orange, style=filled, shape=ellipse]")


def get_dot_graph(output, verbose=True):
    """The graph that computed `output` (a Variable, or a list of them) as Graphviz DOT text.

    Variables are orange ellipses labelled with their name and, if `verbose`, shape and dtype
    (and device when not the CPU); Functions are light-blue boxes labelled with their class
    name; Python-scalar operands are grey ellipses showing their value. Edges run from inputs to
    Function to outputs. The walk is iterative, so any depth works.
    """
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    for y in outputs:
        if not isinstance(y, Variable):
            raise TypeError(f"get_dot_graph: expected a Variable, got {type(y).__qualname__}")
    lines = []
    seen = set()      # ids of Variables and Functions already written
    stack = []        # Functions still to write

    def visit(v):
        if id(v) not in seen:
            seen.add(id(v))
            lines.append(_variable_node(v, verbose))
            f = v.creator
            if f is not None and id(f) not in seen:
                seen.add(id(f))
                stack.append(f)

    for y in outputs:
        visit(y)
    while stack:
        f = stack.pop()
        lines.append(f"{id(f)} [label={_quote(type(f).__name__)}, "
                     "color=lightblue, style=filled, shape=box]")
        for i, x in enumerate(f.inputs):
            if isinstance(x, Variable):
                visit(x)
                lines.append(f"{id(x)} -> {id(f)}")
            elif isinstance(x, _SCALARS):
                node = f"{id(f)}.{i}"
                lines.append(f"{_quote(node)} [label={_quote(repr(x))}, "
                             "color=lightgray, style=filled, shape=ellipse]")
                lines.append(f"{_quote(node)} -> {id(f)}")
        for ref in f.outputs:
            y = ref()
            if y is not None:  # an output nobody holds any more is gone from the graph
                visit(y)
                lines.append(f"{id(f)} -> {id(y)}")
    return "digraph g {\n" + "".join(line + "\n" for line in lines) + "}\n"


def plot_dot_graph(output, verbose=True, to_file="graph.png"):
    """Draw the graph behind `output` into `to_file` with Graphviz's `dot` program.

    The format follows the extension (png, svg, pdf, ...); the DOT text is written beside it
    (graph.png -> graph.dot); a `.dot` to_file gets the text alone. Raises RuntimeError saying
    how to install Graphviz when `dot` is not on PATH, before writing anything. Returns to_file.
    """
    root, extension = os.path.splitext(to_file)
    fmt = extension[1:].lower()
    if not fmt:
        raise ValueError(f"plot_dot_graph: to_file {to_file!r} has no extension to choose the "
                         "format from; use e.g. 'graph.png' or 'graph.svg'")
    text = get_dot_graph(output, verbose)
    if fmt == "dot":  # the text is what was asked for: no rendering
        with open(to_file, "w") as f:
            f.write(text)
        return to_file
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            "plot_dot_graph: the Graphviz program `dot` was not found on PATH. Install Graphviz "
            "(apt-get install graphviz, brew install graphviz, conda install graphviz, or "
            "https://graphviz.org/download/), or use get_dot_graph(output) for the DOT text")
    dot_file = root + ".dot"
    with open(dot_file, "w") as f:
        f.write(text)
    result = subprocess.run([dot, dot_file, "-T", fmt, "-o", to_file],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"plot_dot_graph: `dot -T {fmt}` failed (exit {result.returncode}): "
                           f"{result.stderr.strip()}")
    return to_file
