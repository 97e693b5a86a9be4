"""Every `xp.<name>` the optimizers and hooks read on NumPy exists in CuPy (no GPU needed)."""
import numpy as np
import pytest

import gradcore
from gradcore.optim import (SGD, AdaDelta, AdaGrad, Adam, AdamW, ClipGrad, MomentumSGD,
                            WeightDecay)
from test_xp_names import missing_in, recording_numpy_xp


def test_optimizer_xp_names_exist_in_cupy():
    cupy = pytest.importorskip("cupy")
    W = gradcore.Parameter(np.array([1.0, -2.0], np.float32))
    with recording_numpy_xp() as (log, label):
        for cls in (SGD, MomentumSGD, AdaGrad, AdaDelta, Adam, AdamW):
            label[0] = cls.__name__
            optimizer = cls([W])
            optimizer.add_hook(WeightDecay(0.1))
            optimizer.add_hook(ClipGrad(0.5))
            for _ in range(2):
                W.grad = gradcore.Variable(np.array([3.0, 4.0], np.float32))
                W.grad.data = np.array([3.0, 4.0])  # float64: the optimizers cast it
                optimizer.step()
            saved = optimizer.state_dict()
            cls([W]).load_state_dict(saved)
    assert {"sqrt", "sum", "asarray", "astype"} <= set(log)
    assert missing_in(cupy, log) == {}
