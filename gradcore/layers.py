"""DeZero's `dezero.layers` names, from gradcore.nn (`from gradcore.layers import Linear`)."""
from .nn import (LSTM, RNN, BatchNorm, Conv2d, Deconv2d, Dropout, EmbedID, Embedding, Layer,
                 Linear, Parameter)

__all__ = ["Layer", "Parameter", "Linear", "Conv2d", "Deconv2d", "BatchNorm", "Dropout",
           "EmbedID", "Embedding", "RNN", "LSTM"]
