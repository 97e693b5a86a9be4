"""Every op class gradcore.functions exports says, in a docstring of its own, what it computes."""
import gradcore.functions as F
from gradcore.function import Function


def test_every_exported_function_class_has_its_own_docstring():
    classes = [getattr(F, name) for name in F.__all__]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, Function)]
    assert classes, "gradcore.functions exports no Function subclass"
    # in the class's own __dict__: help() would otherwise show the base Function's docstring
    missing = sorted(c.__name__ for c in classes if not (c.__dict__.get("__doc__") or "").strip())
    assert not missing, f"Function classes without a docstring of their own: {', '.join(missing)}"
