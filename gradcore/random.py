"""manual_seed: one call seeds the global generator of every backend in use."""
import sys

import backends


def manual_seed(seed):
    """Seed the global random generator of every backend in use: NumPy's (np.random.seed, which
    array-API backends draw from too) and, when CuPy is already imported and sees a GPU, CuPy's
    on every GPU. Dropout masks then repeat from run to run. Never imports CuPy."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"manual_seed: the seed must be an int in [0, 2**32), got {seed!r}")
    if sys.modules.get("cupy") is not None:
        backends.cuda_available()  # registers the CuPy backend when a GPU is there
    for backend in backends.registered():
        backend.manual_seed(seed)
