"""Training loops composed from parts, rendered as runnable scripts with their lines tagged.

A `Loop` names one choice per part (framework, precision, K, gate spelling, loss or gradient
division, clipping, zero_grad and scheduler placement, code structure). `render` writes the script
the way users do and records, for each part that can carry a defect, the line it lands on, so the
ground truth (`ground_truth.py`) can say which code belongs at which line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

RAW = "raw"
EPOCHS = 3  # at least three optimizer steps: fp16 may skip (and back off) on the first ones
FRAMEWORKS = ("accelerate", "engine")

# Division of the loss (or of the gradients) by K. Raw loops: "none" is ACL301 when K > 1, every
# other spelling is correct. Accelerate/engine: the engine divides, so "none" is correct and a
# division by K is the double division of ACL302.
RAW_LOSS_DIVISIONS = ("in_expr", "assign", "inplace", "at_backward", "mul_inverse")
RAW_GRAD_DIVISIONS = ("grad_idiv", "grad_div_", "grad_foreach")
RAW_DIVISIONS = ("none", *RAW_LOSS_DIVISIONS, *RAW_GRAD_DIVISIONS)
# A loss returned by a callable (`loss, items = compute_loss(...)`) is divided after the call.
PARAM_LOSS_DIVISIONS = tuple(d for d in RAW_DIVISIONS if d != "in_expr")
FRAMEWORK_DIVISIONS = ("none", "by_k", "by_k_inverse", "by_engine_attr")
# The enumerate gate's modulo test: `(i + 1) % K == 0` and `i % K == K - 1` step after micro-
# batches K, 2K, ...; `i % K == 0` steps after the first micro-batch, then every K (ACL312).
GATE_FORMS = ("plus_one", "minus_one", "off_by_one")


@dataclass(frozen=True)
class Loop:
    framework: str = RAW  # raw | accelerate | engine
    precision: str = "fp32"  # fp32 | fp16 | bf16
    k: int = 1
    gate: str = "enumerate"  # raw: enumerate | counter | micro; frameworks: accumulate
    last_batch: bool = True  # enumerate gate: `or i + 1 == len(loader)`
    gate_form: str = "plus_one"  # enumerate gate: one of GATE_FORMS
    k_source: str = "constant"  # constant (GRAD_ACCUM = K) | config (`cfg.grad_accum`)
    division: str = "none"
    clip: str = "none"  # none | gated | ungated | gated_scaled (raw fp16) | torch_gated
    zero_grad: str = "after_step"  # after_step | top
    scheduler: str = "none"  # none | gated | ungated (raw)
    structure: str = "inline"  # inline | helper | trainer
    batches: int = 4  # per epoch
    # Where the loss comes from: `F.mse_loss` written in the loop, or (helper structure, raw) a
    # callable handed to `train` that returns the loss and its item count, which the linter
    # cannot see into: `loss, items = compute_loss(pred, y)`.
    loss_fn: str = "inline"  # inline | param
    # What the autocast region covers (fp16/bf16 raw loops): the model's call only, the loss too
    # (its division included), or the backward as well (ACL202).
    cast_scope: str = "forward"  # forward | loss | backward
    # DDP (raw, enumerate or counter gate): the model is wrapped in DistributedDataParallel and
    # each non-final micro-step runs under `model.no_sync()`, entered in the autocast's `with`
    # (`with torch.autocast(...), (nullcontext() if sync else model.no_sync()):`) when the
    # region covers the backward, around it otherwise.
    ddp: bool = False

    @property
    def raw(self) -> bool:
        return self.framework == RAW

    def but(self, **changes) -> Loop:
        return replace(self, **changes)


@dataclass
class Program:
    source: str
    lines: dict[str, list[int]] = field(default_factory=dict)  # tag -> 1-based lines


class _Writer:
    """Lines with indentation and tags; `tag` marks the next line written."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.depth = 0
        self.tags: dict[str, list[int]] = {}

    def __call__(self, text: str, *tags: str) -> None:
        for tag in tags:
            self.tags.setdefault(tag, []).append(len(self.rows) + 1)
        self.rows.append("    " * self.depth + text if text else "")

    def indent(self) -> _Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1


@dataclass(frozen=True)
class _Names:
    """How the script spells its objects in this structure (module names, locals or self.x)."""

    model: str
    opt: str
    loader: str
    sched: str
    scaler: str
    k: str
    engine: str


def _names(loop: Loop) -> _Names:
    engine = "accelerator" if loop.framework == "accelerate" else "engine"
    if loop.structure == "trainer":
        s = "self."
        return _Names(s + "model", s + "optimizer", s + "loader", s + "scheduler", s + "scaler",
                      s + "grad_accum", s + engine)  # fmt: skip
    k = "accum_steps" if loop.structure == "helper" else _k_value(loop)
    return _Names("model", "optimizer", "loader", "scheduler", "scaler", k, engine)


def _k_value(loop: Loop) -> str:
    """How the module's setup reads K: a constant, or a field of a config object."""
    return "cfg.grad_accum" if loop.k_source == "config" else "GRAD_ACCUM"


def render(loop: Loop) -> Program:
    w = _Writer()
    _imports(w, loop)
    w("")
    if loop.k_source == "config":
        w("")
        w("@dataclass")
        w("class Config:")
        w(f"    grad_accum: int = {loop.k}")
        w("")
        w("")
        w("cfg = Config()")
    else:
        w(f"GRAD_ACCUM = {loop.k}")
    w("MAX_NORM = 0.05")
    w(f"EPOCHS = {EPOCHS}")
    w("")
    if loop.structure == "inline":
        _setup(w, loop, _names(loop))
        w("")
        _training(w, loop, _names(loop))
        _save(w, loop, "model")
    elif loop.structure == "helper":
        _helper(w, loop)
    else:
        _trainer(w, loop)
    return Program("\n".join(w.rows) + "\n", w.tags)


def _imports(w: _Writer, loop: Loop) -> None:
    if loop.ddp:
        w("import contextlib")
    if loop.gate == "micro":
        w("import itertools")
    w("import os")
    if loop.k_source == "config":
        w("from dataclasses import dataclass")
    w("")
    if loop.framework == "engine":
        w("import guard")
    w("import torch")
    if loop.ddp:
        w("import torch.distributed as dist")
    w("import torch.nn.functional as F")
    if loop.framework == "accelerate":
        w("from accelerate import Accelerator")
    w("from torch import nn")
    if loop.ddp:
        w("from torch.nn.parallel import DistributedDataParallel as DDP")
    w("from torch.utils.data import DataLoader, TensorDataset")


def _setup(w: _Writer, loop: Loop, n: _Names) -> None:
    """Data, model, optimizer, scheduler, scaler or engine, with module-level/local names."""
    samples = 4 * loop.batches
    w("torch.manual_seed(0)")
    w(f"features = torch.randn({samples}, 4)")
    w(f"targets = 0.1 * (features @ torch.randn(4, 1)) + 0.01 * torch.randn({samples}, 1)")
    w("loader = DataLoader(TensorDataset(features, targets), batch_size=4)")
    if loop.ddp:  # torchrun's environment (the harness sets it): one gloo rank
        w('dist.init_process_group("gloo")')
        w("model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))")
    else:
        w("model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))")
    w("optimizer = torch.optim.SGD(model.parameters(), lr=0.05)")
    if loop.scheduler != "none":
        w("scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)")
    if loop.raw and loop.precision == "fp16":
        # A scale these gradients cannot overflow: no step is skipped, so what a loop does does
        # not depend on the draw's data (the default 65536 skips some first steps).
        w('scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)')
    if not loop.raw:
        _engine_setup(w, loop)


def _engine_setup(w: _Writer, loop: Loop) -> None:
    precision = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}[loop.precision]
    if loop.framework == "accelerate":
        w(
            f'accelerator = Accelerator(cpu=True, mixed_precision="{precision}", '
            f"gradient_accumulation_steps={_k_value(loop)})"
        )
    else:
        w(
            f'engine = guard.Engine(mixed_precision="{precision}", '
            f"gradient_accumulation_steps={_k_value(loop)})"
        )
    engine = "accelerator" if loop.framework == "accelerate" else "engine"
    objects = "model, optimizer, loader" + (", scheduler" if loop.scheduler != "none" else "")
    w(f"{objects} = {engine}.prepare({objects})")


def _save(w: _Writer, loop: Loop, model: str) -> None:
    if not loop.raw:
        engine = "accelerator" if loop.framework == "accelerate" else "engine"
        model = f"{engine}.unwrap_model({model})"
    w("")
    w('if os.environ.get("ACCEL_FIXTURE_OUT"):')
    w(f'    torch.save({model}.state_dict(), os.environ["ACCEL_FIXTURE_OUT"])')
    if loop.ddp:
        w("dist.destroy_process_group()")


def _helper(w: _Writer, loop: Loop) -> None:
    n = _names(loop)
    params = ["model", "optimizer", "loader"]
    if loop.loss_fn == "param":
        params.append("compute_loss")
        w("")
        w("def mse_with_count(pred, target):")
        w("    return F.mse_loss(pred, target), target.shape[0]")
        w("")
    if loop.scheduler != "none":
        params.append("scheduler")
    if loop.raw and loop.precision == "fp16":
        params.append("scaler")
    if not loop.raw:
        params.append(n.engine)
    params.append("accum_steps")
    w("")
    w(f"def train({', '.join(params)}):")
    w.indent()
    _training(w, loop, n)
    w.dedent()
    w("")
    w("")
    w("def main():")
    w.indent()
    _setup(w, loop, n)
    w("")
    handed = ["mse_with_count" if p == "compute_loss" else p for p in params[:-1]]
    args = ", ".join(handed + [_k_value(loop)])
    w(f"train({args})")
    _save(w, loop, "model")
    w.dedent()
    _main_guard(w)


def _trainer(w: _Writer, loop: Loop) -> None:
    n = _names(loop)
    attrs = ["model", "optimizer", "loader"]
    if loop.scheduler != "none":
        attrs.append("scheduler")
    if loop.raw and loop.precision == "fp16":
        attrs.append("scaler")
    if not loop.raw:
        attrs.append(n.engine.removeprefix("self."))
    w("")
    w("class Trainer:")
    w.indent()
    w(f"def __init__(self, {', '.join(attrs)}, grad_accum):")
    w.indent()
    for attr in attrs:
        w(f"self.{attr} = {attr}")
    w("self.grad_accum = grad_accum")
    w.dedent()
    w("")
    w("def fit(self):")
    w.indent()
    _training(w, loop, n)
    w.dedent()
    w.dedent()
    w("")
    w("")
    w("def main():")
    w.indent()
    _setup(w, loop, _names(loop.but(structure="inline")))
    w("")
    w(f"Trainer({', '.join(attrs)}, {_k_value(loop)}).fit()")
    _save(w, loop, "model")
    w.dedent()
    _main_guard(w)


def _main_guard(w: _Writer) -> None:
    w("")
    w("")
    w('if __name__ == "__main__":')
    w("    main()")


# --- the training loop itself ---------------------------------------------------------------


def _training(w: _Writer, loop: Loop, n: _Names) -> None:
    if not loop.raw:
        _framework_loop(w, loop, n)
    elif loop.gate == "micro":
        _micro_loop(w, loop, n)
    else:
        _raw_loop(w, loop, n)


def _raw_loop(w: _Writer, loop: Loop, n: _Names) -> None:
    if loop.gate == "counter":
        w("step = 0")
    w("for epoch in range(EPOCHS):")
    w.indent()
    if loop.gate == "enumerate":
        w(f"for i, (x, y) in enumerate({n.loader}):")
    else:
        w(f"for x, y in {n.loader}:")
    w.indent()
    if loop.gate == "counter":
        test = f"step % {n.k} == 0"
    else:
        clause = f" or i + 1 == len({n.loader})" if loop.last_batch else ""
        test = {
            "plus_one": f"(i + 1) % {n.k} == 0",
            "minus_one": f"i % {n.k} == {n.k} - 1",
            "off_by_one": f"i % {n.k} == 0",
        }[loop.gate_form] + clause
    if loop.ddp:  # the step's test comes first: the micro-step needs it for no_sync
        if loop.gate == "counter":
            w("step += 1")
        w(f"sync = {test}", "gate")
        _micro_step(w, loop, n)
        w("if sync:")
    else:
        _micro_step(w, loop, n)
        if loop.gate == "counter":
            w("step += 1")
        w(f"if {test}:", "gate")
    w.indent()
    _optimizer_step(w, loop, n)
    w.dedent()
    w.dedent()
    w.dedent()


def _micro_loop(w: _Writer, loop: Loop, n: _Names) -> None:
    """nanoGPT's spelling: K micro-batches drawn in an inner loop, one step after it."""
    w(f"batches = itertools.cycle({n.loader})")
    w(f"for step in range(EPOCHS * {loop.batches}):")
    w.indent()
    w(f"for micro_step in range({n.k}):")
    w.indent()
    w("x, y = next(batches)")
    _micro_step(w, loop, n)
    w.dedent()
    _optimizer_step(w, loop, n)
    w.dedent()


def _micro_step(w: _Writer, loop: Loop, n: _Names) -> None:
    """zero_grad at the top (if so placed), forward, loss, backward, and ungated parts."""
    if loop.zero_grad == "top":
        w(f"{n.opt}.zero_grad()", "zero_grad")
    cast = "" if loop.precision == "fp32" else _autocast(loop)
    no_sync = f"(contextlib.nullcontext() if sync else {n.model}.no_sync())" if loop.ddp else ""
    outer = ""  # the `with` around the whole micro-step, backward included
    if cast and loop.cast_scope == "backward":
        outer, cast = ", ".join(filter(None, (cast, no_sync))), ""
    elif no_sync:
        outer = no_sync[1:-1]
    if outer:
        w(f"with {outer}:")
        w.indent()
    inner = bool(cast) and loop.cast_scope == "loss"  # forward, loss and division only
    if inner:
        w(f"with {cast}:")
        w.indent()
    _forward(w, loop, n, cast if not inner else "")
    d = loop.division
    if d == "assign":
        w(f"loss = loss / {n.k}")
    elif d == "inplace":
        w(f"loss /= {n.k}")
    elif d == "mul_inverse":
        w(f"loss = loss * (1 / {n.k})")
    if inner:
        w.dedent()
    target = f"loss / {n.k}" if d == "at_backward" else "loss"
    if loop.precision == "fp16":
        w(f"{n.scaler}.scale({target}).backward()", "backward")
    elif d == "at_backward":
        w(f"({target}).backward()", "backward")
    else:
        w("loss.backward()", "backward")
    if outer:
        w.dedent()
    if loop.clip == "ungated":
        _clip(w, loop, n)
    if loop.scheduler == "ungated":
        w(f"{n.sched}.step()", "scheduler")


def _autocast(loop: Loop) -> str:
    dtype = "float16" if loop.precision == "fp16" else "bfloat16"
    return f'torch.autocast("cpu", dtype=torch.{dtype})'


def _forward(w: _Writer, loop: Loop, n: _Names, cast: str) -> None:
    """The loss line; `cast`: an autocast region to open around the model's call alone."""
    suffix = f" / {n.k}" if loop.division == "in_expr" else ""
    pred = f"{n.model}(x)"
    if cast:
        w(f"with {cast}:")
        w(f"    pred = {pred}")
    elif loop.precision != "fp32":
        w(f"pred = {pred}")  # inside the region the caller opened
    if loop.precision != "fp32":
        pred = "pred.float()"
    if loop.loss_fn == "param":
        w(f"loss, items = compute_loss({pred}, y){suffix}")
    else:
        w(f"loss = F.mse_loss({pred}, y){suffix}")


def _clip(w: _Writer, loop: Loop, n: _Names) -> None:
    if loop.precision == "fp16" and loop.clip != "gated_scaled":
        w(f"{n.scaler}.unscale_({n.opt})", "unscale")
    w(f"torch.nn.utils.clip_grad_norm_({n.model}.parameters(), MAX_NORM)", "clip")


def _divide_grads(w: _Writer, loop: Loop, n: _Names) -> None:
    grads = f"[p.grad for p in {n.model}.parameters() if p.grad is not None]"
    if loop.division == "grad_foreach":
        w(f"torch._foreach_div_({grads}, {n.k})")
        return
    w(f"for p in {n.model}.parameters():")
    w("    if p.grad is not None:")
    if loop.division == "grad_idiv":
        w(f"        p.grad /= {n.k}")
    else:
        w(f"        p.grad.div_({n.k})")


def _optimizer_step(w: _Writer, loop: Loop, n: _Names) -> None:
    """The body of the step branch: unscale, divide gradients, clip, step, schedule, zero."""
    fp16 = loop.precision == "fp16"
    if fp16 and loop.clip == "gated":
        w(f"{n.scaler}.unscale_({n.opt})")
    if loop.division in RAW_GRAD_DIVISIONS:
        _divide_grads(w, loop, n)
    if loop.clip in ("gated", "gated_scaled"):
        w(f"torch.nn.utils.clip_grad_norm_({n.model}.parameters(), MAX_NORM)", "clip")
    if fp16:
        if loop.scheduler == "gated":
            w(f"scale = {n.scaler}.get_scale()")
        w(f"{n.scaler}.step({n.opt})")
        w(f"{n.scaler}.update()")
    else:
        w(f"{n.opt}.step()")
    if loop.scheduler == "gated":
        if fp16:  # a skipped step (scale backed off) must not advance the schedule
            w(f"if {n.scaler}.get_scale() >= scale:")
            w(f"    {n.sched}.step()")
        else:
            w(f"{n.sched}.step()")
    if loop.zero_grad == "after_step":
        w(f"{n.opt}.zero_grad()")


def _framework_loop(w: _Writer, loop: Loop, n: _Names) -> None:
    w("for epoch in range(EPOCHS):")
    w.indent()
    w(f"for x, y in {n.loader}:")
    w.indent()
    w(f"with {n.engine}.accumulate({n.model}):")
    w.indent()
    if loop.zero_grad == "top":
        w(f"{n.opt}.zero_grad()", "zero_grad")
    divisor = {
        "by_k": f" / {n.k}",
        "by_k_inverse": f" * (1 / {n.k})",
        "by_engine_attr": f" / {n.engine}.gradient_accumulation_steps",
    }
    w(f"loss = F.mse_loss({n.model}(x), y){divisor.get(loop.division, '')}")
    w(f"{n.engine}.backward(loss)", "backward")
    torch_clip = loop.clip == "torch_gated"
    clip_fn = "torch.nn.utils.clip_grad_norm_" if torch_clip else f"{n.engine}.clip_grad_norm_"
    clip = f"{clip_fn}({n.model}.parameters(), MAX_NORM)"
    if loop.clip == "ungated":
        w(clip, "clip")
    elif loop.clip in ("gated", "torch_gated"):
        w(f"if {n.engine}.sync_gradients:")
        w(f"    {clip}", "clip")
    w(f"{n.opt}.step()")
    if loop.scheduler != "none":
        w(f"{n.sched}.step()")
    if loop.zero_grad == "after_step":
        w(f"{n.opt}.zero_grad()")
    w.dedent()
    w.dedent()
    w.dedent()
