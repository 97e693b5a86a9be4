"""Modules and layers (`import gradcore.nn as nn`): Module (DeZero's Layer and Model) and the
layers DeZero has, under its names, plus Sequential, the containers ModuleList, ModuleDict,
ParameterList and ParameterDict, and activation modules."""
from ..variable import Parameter
from .checkpoint import FORMAT_KEY, FORMAT_VERSION, CheckpointError, read_checkpoint
from .layers import (MLP, BatchNorm, Conv2d, Deconv2d, Dropout, EmbedID, Embedding, Linear,
                     ModuleDict, ModuleList, ParameterDict, ParameterList, ReLU, Sequential,
                     Sigmoid, Tanh)
from .module import IncompatibleKeys, Module, RemovableHandle
from .rnn import LSTM, RNN
from . import init, utils

Layer = Module  # DeZero's names: one class
Model = Module

__all__ = [
    "Module", "Layer", "Model", "Parameter", "RemovableHandle", "IncompatibleKeys",
    "read_checkpoint", "CheckpointError", "FORMAT_KEY", "FORMAT_VERSION",
    "Linear", "Conv2d", "Deconv2d", "BatchNorm", "Dropout", "EmbedID", "Embedding",
    "RNN", "LSTM", "ReLU", "Sigmoid", "Tanh", "Sequential", "ModuleList", "ModuleDict",
    "ParameterList", "ParameterDict", "MLP", "init",
    "utils",
]
