"""The root of a gradcore checkout: imported as `gradcore`, it runs the real package in its place.

Python started beside a clone named gradcore (`python -c`, `python -m`, a script in that folder)
finds the clone first on sys.path; without this file it would import the clone as an empty
namespace package, even with gradcore installed. Not part of the distribution. Imported under
another name (pytest imports it under the checkout folder's name) it does nothing.
"""


def _run_package(module, folder):
    """Make `module` the package in `folder` and run its __init__.py in it: what importing it
    would do with the checkout on sys.path (so tracebacks, .pyc files and reload are as usual)."""
    import importlib.util
    import os

    path = os.path.join(folder, "__init__.py")
    if not os.path.isfile(path):
        raise ImportError(f"{os.path.dirname(folder)} was imported as a gradcore checkout, but it "
                          f"has no {os.path.basename(folder)}/__init__.py", name=module.__name__)
    spec = importlib.util.spec_from_file_location(module.__name__, path,
                                                  submodule_search_locations=[folder])
    module.__spec__, module.__loader__, module.__package__ = spec, spec.loader, spec.parent
    module.__path__ = spec.submodule_search_locations
    module.__file__, module.__cached__ = spec.origin, spec.cached
    spec.loader.exec_module(module)


def _become_gradcore():
    """Run gradcore/__init__.py in this module, after importing backends/ beside it."""
    import os
    import sys
    import types

    module, run = sys.modules[__name__], _run_package
    del module._run_package, module._become_gradcore  # leave the real package's names alone
    root = os.path.dirname(os.path.abspath(module.__file__))
    # gradcore and backends ship together: take both from this checkout, as running inside it
    # would (so a clone that is not installed works too)
    if "backends" not in sys.modules:
        backends = sys.modules["backends"] = types.ModuleType("backends")
        try:
            run(backends, os.path.join(root, "backends"))
        except BaseException:
            del sys.modules["backends"]
            raise
    run(module, os.path.join(root, "gradcore"))


if __name__ == "gradcore":
    _become_gradcore()
