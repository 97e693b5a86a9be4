"""gradcore.utils.get_dot_graph and plot_dot_graph: the DOT text, rendering, a missing `dot`."""
import re
import shutil

import numpy as np
import pytest

import gradcore
import gradcore.functions as F
from gradcore.utils import get_dot_graph, plot_dot_graph
from gradcore.utils import dot as dot_module

NODE = re.compile(r'^("?[\w.]+"?) \[label="((?:[^"\\]|\\.)*)", (.*)\]$')
EDGE = re.compile(r'^("?[\w.]+"?) -> (\d+)$')


def parse(text):
    """{node id: (label, attributes)} and [(from label, to label)] from get_dot_graph's text."""
    lines = text.splitlines()
    assert lines[0] == "digraph g {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        node, edge = NODE.match(line), EDGE.match(line)
        assert node or edge, f"unexpected line {line!r}"
        if node:
            assert node.group(1) not in nodes, f"node {node.group(1)} written twice"
            nodes[node.group(1)] = (node.group(2), node.group(3))
        else:
            edges.append((edge.group(1), edge.group(2)))
    labelled = sorted((nodes[a][0], nodes[b][0]) for a, b in edges)
    return nodes, labelled


def small_graph():
    x = gradcore.Variable(np.ones((2, 3), dtype=np.float32), name="x")
    w = gradcore.Variable(np.ones(3, dtype=np.float32), name="w")
    y = F.tanh(x * w + 1.0)
    y.name = "y"
    return x, w, y


def test_verbose_labels_shapes_and_edges():
    _, _, y = small_graph()
    nodes, edges = parse(get_dot_graph(y))
    labels = sorted(label for label, _ in nodes.values())
    assert labels == sorted(["x: (2, 3) float32", "w: (3,) float32", "(2, 3) float32",
                             "(2, 3) float32", "y: (2, 3) float32", "Mul", "Add", "Tanh", "1.0"])
    for label, attributes in nodes.values():
        if label in ("Mul", "Add", "Tanh"):
            assert "shape=box" in attributes
        else:
            assert "shape=ellipse" in attributes
    assert edges == sorted([
        ("x: (2, 3) float32", "Mul"), ("w: (3,) float32", "Mul"), ("Mul", "(2, 3) float32"),
        ("(2, 3) float32", "Add"), ("1.0", "Add"), ("Add", "(2, 3) float32"),
        ("(2, 3) float32", "Tanh"), ("Tanh", "y: (2, 3) float32"),
    ])


def test_not_verbose_shows_names_only():
    _, _, y = small_graph()
    nodes, _ = parse(get_dot_graph(y, verbose=False))
    labels = sorted(label for label, _ in nodes.values())
    assert labels == sorted(["x", "w", "", "", "y", "Mul", "Add", "Tanh", "1.0"])


def test_a_shared_input_is_one_node_with_two_edges():
    x = gradcore.Variable(np.ones(2), name="x")
    y = F.sin(x) * F.cos(x)
    nodes, edges = parse(get_dot_graph(y, verbose=False))
    assert [label for label, _ in nodes.values()].count("x") == 1
    assert ("x", "Sin") in edges and ("x", "Cos") in edges


def test_a_leaf_alone_and_quotes_in_names():
    x = gradcore.Variable(np.ones(2), name='say "hi"\\')
    text = get_dot_graph(x, verbose=False)
    assert text == f'digraph g {{\n{id(x)} [label="say \\"hi\\"\\\\", color=orange, ' \
                   'style=filled, shape=ellipse]\n}\n'
    parse(text)


def test_a_deep_graph_needs_no_recursion():
    x = gradcore.Variable(np.array(1.0))
    y = x
    for _ in range(3000):  # deeper than the default recursion limit
        y = y * 1.0
    nodes, edges = parse(get_dot_graph(y))
    assert sum(label == "Mul" for label, _ in nodes.values()) == 3000
    assert len(edges) == 3 * 3000  # variable in, scalar in, out


def test_get_dot_graph_needs_a_variable():
    with pytest.raises(TypeError, match="expected a Variable, got ndarray"):
        get_dot_graph(np.ones(2))


def test_a_name_that_is_not_a_string_is_shown():
    # name=5 raised "unsupported operand type(s) for +=: 'int' and 'str'"; name=0 was dropped
    for name, label in ((5, "5"), (0, "0"), (2.5, "2.5"), (("a", 1), "('a', 1)")):
        x = gradcore.Variable(np.ones(2), name=name)
        nodes, edges = parse(get_dot_graph(F.sin(x)))
        assert sorted(label for label, _ in nodes.values()) == sorted(
            ["(2,) float64", "Sin", f"{label}: (2,) float64"])
        assert edges == [(f"{label}: (2,) float64", "Sin"), ("Sin", "(2,) float64")]
        nodes, _ = parse(get_dot_graph(x, verbose=False))
        assert [label for label, _ in nodes.values()] == [label]


# =============================================================================== plot_dot_graph
def test_plot_without_dot_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(dot_module.shutil, "which", lambda name: None)
    _, _, y = small_graph()
    target = tmp_path / "graph.png"
    message = r"`dot` was not found on PATH.*apt-get install graphviz"
    with pytest.raises(RuntimeError, match=message):
        plot_dot_graph(y, to_file=str(target))
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plot_to_a_dot_file_needs_no_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr(dot_module.shutil, "which", lambda name: None)
    _, _, y = small_graph()
    target = tmp_path / "graph.dot"
    assert plot_dot_graph(y, to_file=str(target)) == str(target)
    assert target.read_text() == get_dot_graph(y)


def test_plot_needs_an_extension(tmp_path):
    _, _, y = small_graph()
    with pytest.raises(ValueError, match="no extension"):
        plot_dot_graph(y, to_file=str(tmp_path / "graph"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_plot_renders_a_png_and_keeps_the_dot_text(tmp_path):
    _, _, y = small_graph()
    target = tmp_path / "graph.png"
    assert plot_dot_graph(y, to_file=str(target)) == str(target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "graph.dot").read_text() == get_dot_graph(y)
    svg = tmp_path / "graph.svg"
    plot_dot_graph(y, verbose=False, to_file=str(svg))
    assert "Tanh" in svg.read_text()
