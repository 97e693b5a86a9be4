"""gradcore: define-by-run automatic differentiation on NumPy, CuPy or any array-API library."""
from backends import Device, DeviceUnavailableError, cuda_available, parse_device

# variable first: it binds its operators to gradcore.functions, which needs Function, which
# needs Variable; importing in this order resolves the cycle once.
from .variable import Parameter, Variable, as_array, as_variable  # noqa: I001
from .function import Function
from .engine import grad
from .config import (Config, detect_anomaly, enable_grad, is_anomaly_enabled, is_grad_enabled,
                     no_grad, set_detect_anomaly, test_mode, using_config)
from . import functions, functions_conv
from .random import manual_seed
from . import cuda, utils
from . import layers, models, nn
from .nn import CheckpointError, Layer, Model, Module
from .nn.layers import get_default_dtype, set_default_dtype
from . import optim, optimizers
from . import dataloaders, datasets, transforms
from .compile import compile
from . import func
from .recompute import checkpoint
from .dataloaders import DataLoader, SeqDataLoader
from .datasets import Dataset

__version__ = "0.1.0"


def setup_variable():
    """DeZero's set-up of Variable's operators; gradcore's Variable has them from the start, so
    this does nothing (kept so that DeZero programs that call it run unchanged)."""

__all__ = [
    "Variable", "Parameter", "Function", "as_variable", "as_array", "grad",
    "Config", "using_config", "no_grad", "enable_grad", "test_mode", "is_grad_enabled",
    "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "CheckpointError",
    "Device", "DeviceUnavailableError", "parse_device", "cuda_available", "functions",
    "manual_seed", "set_default_dtype", "get_default_dtype",
    "cuda", "utils",
    "nn", "layers", "models", "Module", "Layer", "Model",
    "optim", "optimizers",
    "datasets", "dataloaders", "transforms", "Dataset", "DataLoader", "SeqDataLoader",
    "setup_variable", "functions_conv", "compile", "func", "checkpoint",
]
