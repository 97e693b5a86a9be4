"""Data-parallel training on several processes (MPI, through mpi4py) and GPUs (NCCL, through
CuPy): every rank holds the whole model, trains on its share of the data, and the gradients are
averaged over the ranks before each step (the buffers, BatchNorm's running statistics, too:
see DistributedOptimizer's `buffers`).

    import gradcore.distributed as dist

    comm = dist.init()                          # dist.init("nccl") on GPUs
    model = nn.MLP((100, 3))
    dist.broadcast_parameters(model, comm)      # every rank starts from rank 0's weights
    opt = dist.DistributedOptimizer(optim.SGD(model, lr=0.1), comm)  # the model: buffers too
    train = dist.scatter_dataset(Spiral(train=True), comm)
    for x, t in DataLoader(train, batch_size=15):
        loss = F.softmax_cross_entropy(model(x), t)
        opt.zero_grad(); loss.backward(); opt.step()

Launch with `mpiexec -n 2 python train.py` (pip install 'gradcore[mpi]' installs mpi4py and
MPICH, whose mpiexec is then on the virtual environment's PATH).
"""
from .communicator import Communicator, DistributedError, init, local_device
from .data import scatter_dataset
from .optimizer import DEFAULT_BUCKET_SIZE, DistributedOptimizer, LocalGradientWarning
from .parameters import broadcast_parameters, save_on_root

__all__ = ["init", "Communicator", "DistributedError", "local_device", "broadcast_parameters",
           "save_on_root", "scatter_dataset", "DistributedOptimizer", "DEFAULT_BUCKET_SIZE",
           "LocalGradientWarning"]
