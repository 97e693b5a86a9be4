"""The checkout's root __init__.py: Python started in the folder that holds a clone named
gradcore imports the real package, not the clone's folder as an empty namespace package."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# prints where gradcore and backends came from (after a reload, which must keep the module), and
# a gradient computed with them
PROBE = """
import importlib
import numpy as np
import gradcore, backends
assert importlib.reload(gradcore) is gradcore
x = gradcore.Variable(np.array(3.0))
(x * x).backward()
print(gradcore.__file__, backends.__file__, gradcore.Variable.__module__, x.grad.item(), sep="\\n")
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """What a clone of this checkout named gradcore holds (tracked files and new ones that git
    does not ignore), in a folder of its own."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"not a git checkout: {listing.stderr.strip()}")
    clone = tmp_path_factory.mktemp("parent") / "gradcore"
    for name in filter(None, listing.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet staged is still listed
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, clone / name)
    return clone


def probe(cwd, *options, env=None):
    run = subprocess.run([sys.executable, *options, "-c", PROBE], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    gradcore_file, backends_file, module, grad = run.stdout.split("\n")[:4]
    return pathlib.Path(gradcore_file), pathlib.Path(backends_file), module, float(grad)


@pytest.mark.parametrize("where", ["parent", "inside"])
def test_import_gradcore_from_beside_or_inside_a_clone(clone, where):
    # this interpreter has gradcore installed (editable, as `make` does): the folder gradcore in
    # the current directory comes first on sys.path all the same
    cwd = clone.parent if where == "parent" else clone
    gradcore_file, backends_file, module, grad = probe(cwd)
    assert gradcore_file == clone / "gradcore" / "__init__.py"
    assert backends_file == clone / "backends" / "__init__.py"
    assert module == "gradcore.variable" and grad == 6.0


def test_import_gradcore_from_beside_a_clone_that_is_not_installed(clone):
    # -S: no site-packages processing, so no editable install; NumPy alone through PYTHONPATH
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(np.__file__).parent.parent))
    gradcore_file, backends_file, module, grad = probe(clone.parent, "-S", env=env)
    assert gradcore_file == clone / "gradcore" / "__init__.py"
    assert backends_file == clone / "backends" / "__init__.py"
    assert module == "gradcore.variable" and grad == 6.0


# Every name DeZero's package exports at its top level (dezero/__init__.py)
DEZERO_TOP_LEVEL = (
    "Variable", "Parameter", "Function", "using_config", "no_grad", "test_mode", "as_array",
    "as_variable", "setup_variable", "Config", "Layer", "Model", "datasets", "dataloaders",
    "optimizers", "functions", "functions_conv", "layers", "utils", "cuda", "transforms",
    "DataLoader", "SeqDataLoader",
)


def test_every_top_level_name_of_dezero_imports_from_gradcore():
    import gradcore

    missing = [name for name in DEZERO_TOP_LEVEL if not hasattr(gradcore, name)]
    assert missing == []
    assert gradcore.setup_variable() is None
    from gradcore.functions_conv import conv2d, im2col, pooling  # noqa: F401
    from gradcore.dataloaders import SeqDataLoader
    assert gradcore.SeqDataLoader is SeqDataLoader
