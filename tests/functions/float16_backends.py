"""`@float16_backends`: the `xp` fixture narrowed to the backends that have float16, NumPy and CuPy
(with a GPU). array-api-strict has none: the array API names no float16."""
import pytest

float16_backends = pytest.mark.parametrize(
    "xp", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)], indirect=True)
