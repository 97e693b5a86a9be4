"""How fast gradcore's design can run `wide` in pure Python: a measuring stick for its target.

A stripped engine, just enough for wide's graph, that keeps what gradcore's design fixes: a Function
object per op with forward and backward, outputs held through weak references, a walk over a heap
keyed (-generation, -sequence), backward written with the engine's own ops. It drops everything a
library needs on top: backends and devices, dtype and shape checks, hooks, retain_grad, saved
values, error messages, the walk's bookkeeping for several outputs. With `raw`, backward computes
on arrays instead (no Function per backward op: no create_graph possible).

    python -m benchmarks.stripped [--repeat N]

times gradcore, the stripped engine (both ways) and PyTorch on wide, taking turns, with the
garbage collector on as in the suite and off for the run, and prints medians and ratios. `make
bench` shows the stripped engine's figure as a reference under wide. An experiment, not a library:
gradcore never imports it.
"""
import argparse
import gc
import heapq
import itertools
import statistics
import weakref

import numpy

from .common import Unavailable, at_least, load_average, prepare, resolve_device, time_once

_sequence = itertools.count()
_weakref = weakref.ref
_new = object.__new__


class Var:
    __slots__ = ("data", "grad", "creator", "generation", "requires_grad", "__weakref__")

    def __init__(self, data):
        self.data, self.grad, self.creator, self.generation, self.requires_grad = (
            data, None, None, 0, True)

    def __mul__(self, other):
        return Mul()(self, other)

    def __add__(self, other):
        return Add()(self, other)


def _constant(data):
    v = _new(Var)
    v.data, v.grad, v.creator, v.generation, v.requires_grad = data, None, None, 0, False
    return v


class Op:
    __slots__ = ("inputs", "output", "generation", "sequence", "needs", "__weakref__")
    grad_mode = True  # the walk turns it off: backward records nothing

    def __call__(self, x0, x1=None):
        if x1 is None:
            inputs, needs, generation = (x0,), (True,), x0.generation
            y = self.forward(x0.data)
        elif x1.__class__ is int:
            inputs, needs, generation = (x0, x1), (True, False), x0.generation
            y = self.forward(x0.data, x1)
        else:
            inputs, needs = (x0, x1), (x0.requires_grad, x1.requires_grad)
            generation = max(x0.generation, x1.generation)
            y = self.forward(x0.data, x1.data)
        if not (Op.grad_mode and True in needs):
            return _constant(y)
        v = _new(Var)
        v.data, v.grad, v.creator, v.generation, v.requires_grad = (
            y, None, self, generation + 1, True)
        self.inputs, self.needs, self.generation = inputs, needs, generation
        self.sequence = next(_sequence)
        self.output = _weakref(v)
        return v


class Mul(Op):
    __slots__ = ()
    forward = staticmethod(numpy.multiply)

    def backward(self, gy):
        x0, x1 = self.inputs
        if raw:
            return _constant(gy.data * x1), None
        return gy * x1, None


class Add(Op):
    __slots__ = ()
    forward = staticmethod(numpy.add)

    def backward(self, gy):
        return gy, gy


class Sin(Op):
    __slots__ = ()
    forward = staticmethod(numpy.sin)

    def backward(self, gy):
        x, = self.inputs
        if raw:
            return _constant(gy.data * numpy.cos(x.data)),
        return SinGrad()(x, gy),


class SinGrad(Op):
    __slots__ = ()

    def forward(self, x, gy):
        return gy * numpy.cos(x)


class Sum(Op):
    __slots__ = ()
    forward = staticmethod(numpy.sum)

    def backward(self, gy):
        x, = self.inputs
        return _constant(numpy.broadcast_to(gy.data, x.data.shape)),


raw = False  # backward on arrays, not through ops


def backward(y):
    """The walk: a heap keyed (-generation, -sequence), each Op once; leaves get .grad."""
    grads = {y: _constant(numpy.ones_like(y.data))}
    heap = [(-y.creator.generation, -y.creator.sequence, y.creator)]
    pushed = {y.creator}
    leaves = []
    Op.grad_mode = False
    try:
        while heap:
            f = heapq.heappop(heap)[2]
            for x, gx, need in zip(f.inputs, f.backward(grads.pop(f.output())), f.needs):
                if not need:
                    continue
                previous = grads.get(x)
                if previous is not None:
                    grads[x] = _constant(previous.data + gx.data)
                    continue
                grads[x] = gx
                creator = x.creator
                if creator is None:
                    leaves.append(x)
                elif creator not in pushed:
                    pushed.add(creator)
                    heapq.heappush(heap, (-creator.generation, -creator.sequence, creator))
    finally:
        Op.grad_mode = True
    for x in leaves:
        x.grad = grads.pop(x)


def wide_stripped(x0, branches, raw_backward=False):
    """wide's graph in the stripped engine: x's gradient."""
    global raw
    raw = raw_backward
    x = Var(x0)
    y = Sin()(x * 1)
    for i in range(2, branches + 1):
        y = y + Sin()(x * i)
    backward(Sum()(y))
    return x.grad.data


def main(argv=None):
    from . import wide  # here, not above: wide imports this module for its reference row
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stripped", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=at_least(1), default=30, metavar="N",
                        help="timed rounds (default 30)")
    args = parser.parse_args(argv)
    device = resolve_device("cpu")
    x0 = wide._x()
    runs = {"gradcore": wide.make_gradcore(device),
            "stripped": lambda: wide_stripped(x0, wide.BRANCHES),
            "stripped, raw backward": lambda: wide_stripped(x0, wide.BRANCHES, True)}
    try:
        runs["torch"] = prepare("torch", wide.make_torch, device, threads=1).run
    except Unavailable as e:
        print(f"no PyTorch column: {e}")
    for key, run in runs.items():
        wide.verify(key, run())

    def without_gc(run):
        def timed():
            gc.disable()
            try:
                return run()
            finally:
                gc.enable()
        return timed

    print(f"wide on cpu ({wide.BRANCHES:,} branches), {args.repeat} rounds, medians; "
          f"1-minute load average {load_average()}")
    for label, wrap in (("collector on", lambda run: run), ("collector off", without_gc)):
        times = {key: [] for key in runs}
        for _ in range(args.repeat + 3):  # 3 untimed rounds first
            for key, run in runs.items():
                times[key].append(time_once(wrap(run), lambda: None)[0])
        print(f"  {label}:")
        for key, samples in times.items():
            samples = samples[3:]
            per_branch = statistics.median(samples) / wide.BRANCHES * 1e6
            line = f"    {key:24s} {per_branch:7.2f} µs/branch"
            if "torch" in times and key != "torch":
                ratios = [a / b for a, b in zip(samples, times["torch"][3:])]
                line += f"   {statistics.median(ratios):.3f}x PyTorch"
            print(line)


if __name__ == "__main__":
    main()
