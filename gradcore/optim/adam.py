"""Adam and AdamW."""
import math

from .hyperparameters import checked_value
from .optimizer import Optimizer, nonzero_eps
from .params import set_data, update_arrays


class Adam(Optimizer):
    """Adam, in DeZero's form:
    m <- m + (1 - beta1) * (grad - m);  v <- v + (1 - beta2) * (grad**2 - v)
    param <- param - lr * m / (sqrt(v) + eps),  lr = alpha * sqrt(1 - beta2**t) / (1 - beta1**t)

    `Adam(alpha=0.001, beta1=0.9, beta2=0.999, eps=1e-8)`, optionally after the parameters (see
    Optimizer). PyTorch's keywords work too: `lr=` sets alpha, `betas=(beta1, beta2)`.

    The count t in the bias correction is each parameter's own, as in PyTorch: how many updates
    that parameter took (`optimizer.param_counts(param)["step"]`, saved with the state), so a
    parameter whose first gradient comes late starts with a first step, and a step where no
    parameter had a gradient changes nothing. `optimizer.t` (DeZero's name) counts the updates
    that changed at least one parameter: the count of a parameter updated at every step. As in
    DeZero it is counted before the hooks run, so they see this step's t and lr (and it is taken
    back if they drop every gradient, if a hook raises, or if a Dask step fails when worked
    out and is put back).

    eps is added to sqrt(v) before the bias correction, as in DeZero; PyTorch adds it after:
    m_hat / (sqrt(v_hat) + eps). A step here is PyTorch's with eps replaced by k * eps,
    k = 1 / sqrt(1 - beta2**t) (beta2=0.999: 31.6 at t=1, 10 at t=10, 3.2 at t=100, 1.26 at
    t=1000), so it is shorter by the fraction (k - 1) * eps / (sqrt(v_hat) + k * eps), where
    sqrt(v_hat) is the gradient's size |g| at t=1 and about it later. At t=1: 0.3% where
    eps = 1e-4 |g|, 3% where eps = 1e-3 |g| (eps=1e-3, |g| = 1), 23% where eps = 1e-2 |g|,
    74% where eps = 0.1 |g| (the default eps=1e-8, |g| = 1e-7).

    A float16 parameter's state is kept in float32 and its update computed in float32, rounded
    to float16 once, as it is written (mixed precision: in float16, v of a gradient under 5e-3
    would be 0, and the step m / eps hundreds of times alpha). An eps the update's dtype cannot
    hold (0) is taken as its smallest positive number, so that an element whose gradient is 0
    stays as it is instead of becoming 0 / 0 = NaN.

    State per parameter: "m", "v" (arrays) and the count "step".
    """

    defaults = {"alpha": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    aliases = {"lr": "alpha"}
    keywords = ("betas",)
    pytorch_order = ("lr", "betas", "eps", "weight_decay", "amsgrad")
    state_names = ("m", "v")
    state_counters = ("step",)
    counters = ("t",)
    counter_fallback = {"step": "t"}  # an older state_dict: every parameter took t steps

    def __init__(self, *args, betas=None, **kwargs):
        if betas is not None:
            if "beta1" in kwargs or "beta2" in kwargs:
                raise TypeError(f"{type(self).__name__}: pass either betas=(beta1, beta2) or "
                                "beta1=/beta2=, not both")
            kwargs["beta1"], kwargs["beta2"] = _pair(type(self).__name__, betas)
        super().__init__(*args, **kwargs)

    @property
    def betas(self):
        """(beta1, beta2), PyTorch's name for the pair. Setting it sets both, each checked as
        the constructor checks it (neither changes if either is refused)."""
        return (self.beta1, self.beta2)

    @betas.setter
    def betas(self, betas):
        where = type(self).__name__
        beta1, beta2 = (checked_value(where, name, value, self.defaults[name])
                        for name, value in zip(("beta1", "beta2"), _pair(where, betas)))
        self.beta1, self.beta2 = beta1, beta2

    @property
    def lr(self):
        """The bias-corrected step size alpha * sqrt(1 - beta2**t) / (1 - beta1**t) at the
        optimizer's count t: that of the last update of a parameter updated at every step
        (before the first update: of the first). A parameter that skipped steps uses its own
        count instead (see the class)."""
        return self._step_size(max(self.t, 1))

    def _step_size(self, t):
        """The bias-corrected step size of a parameter's update number t."""
        beta1, beta2 = float(self.beta1), float(self.beta2)
        return float(self.alpha) * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)

    @lr.setter
    def lr(self, value):
        raise AttributeError(f"{type(self).__name__}.lr is the bias-corrected step size, computed "
                             "from alpha and t; set alpha instead (lr= in the constructor sets "
                             "alpha)")

    def update(self):
        params = self._ready()  # checked before t moves
        counted = bool(params)  # a step where nothing has a gradient is not counted
        if counted:  # counted first, as DeZero's: the hooks see this step's t and lr
            self.t += 1
        try:
            params, before = self._run_hooks(params)
        except BaseException:
            if counted:  # no parameter changed
                self.t -= 1
            raise
        if counted and not params:  # the hooks dropped every gradient: nothing is updated
            self.t -= 1
            return
        try:
            self._update_params(params, before)
        except BaseException:
            # a lazy (Dask) step that fails when worked out puts its parameters, state and counts
            # back, and t goes back with them; an eager one that raised partway (NumPy under
            # errstate(all="raise")) has changed the parameters before the failing one: counted
            if counted and all(p.backend.lazy for p in params):
                self.t -= 1
            raise

    def update_one(self, param):
        self._adam_step(param, *update_arrays(param))

    def _adam_step(self, param, p, g):
        xp = param.xp
        beta1, beta2 = float(self.beta1), float(self.beta2)
        state = self.param_state(param)
        counts = self.param_counts(param)
        counts["step"] += 1
        m, v = state["m"], state["v"]
        m += (1 - beta1) * (g - m)
        v += (1 - beta2) * (g * g - v)
        state["m"], state["v"] = m, v
        eps = nonzero_eps(xp, p.dtype, float(self.eps))  # eps=0: 0 / 0 would be NaN
        p -= self._step_size(counts["step"]) * m / (xp.sqrt(v) + eps)
        set_data(param, p)


def _pair(where, betas):
    """(beta1, beta2) from `betas`, TypeError unless it is a pair."""
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise TypeError(f"{where}: betas must be a pair (beta1, beta2), got {betas!r}") from None
    return beta1, beta2


class AdamW(Adam):
    """Adam with decoupled weight decay: param <- param * (1 - alpha * weight_decay) before the
    Adam step (Loshchilov & Hutter; PyTorch's AdamW, default weight_decay=0.01; its positional
    order after the parameters, lr, betas, eps, weight_decay, agrees here at lr only).

    `AdamW(alpha=0.001, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)`, optionally after
    the parameters; `lr=` and `betas=` as for Adam.
    """

    defaults = {**Adam.defaults, "weight_decay": 0.01}

    def update_one(self, param):
        p, g = update_arrays(param)
        p *= 1 - float(self.alpha) * float(self.weight_decay)
        self._adam_step(param, p, g)
