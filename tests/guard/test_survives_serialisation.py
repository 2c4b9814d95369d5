"""The guard never breaks a correct program: whatever it attaches to a user's object (hooks,
wrappers, patched methods) survives `torch.save(obj)`, pickle, `copy.deepcopy` and
`state_dict()` round trips without changing a result, leaves no trace of the guard in what was
saved (the checkpoint loads without the guard), and `guard.uninstall()` leaves nothing on the
objects. Each kind of object the guard touches is checked, in warn and raise modes; DDP models
in `checks_accum/test_ddp_loops.py` (they need a process group)."""

from __future__ import annotations

import copy
import io
import pickle
import pickletools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import guard
from guard import _report


class RNNModel(nn.Module):
    """The shape of PyTorch's word-language-model example: embedding, LSTM, decoder, dropout."""

    def __init__(self, vocab: int = 20, hidden: int = 8) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, 1)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


@pytest.fixture(params=["warn", "raise"])
def mode(request):
    """The guard installed in each mode, every code selected, no findings yet."""
    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode=request.param)
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield request.param
    guard.reset()
    _report._state.settings = saved


def _tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (5, 3), generator=generator), torch.randint(
        0, 20, (5, 3), generator=generator
    )


def _train_epoch(model: RNNModel, optimizer) -> None:
    model.train()
    for seed in range(2):
        tokens, targets = _tokens(seed)
        optimizer.zero_grad()
        F.cross_entropy(model(tokens).reshape(-1, 20), targets.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()


def _evaluate(model: RNNModel) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(_tokens(7)[0])


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loaded(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _guard_globals(obj) -> set[str]:
    """Every module:name the pickle of `obj` needs that belongs to the guard (protocol 2 names
    each global in its GLOBAL opcode)."""
    names = set()
    for op, arg, _pos in pickletools.genops(pickle.dumps(obj, protocol=2)):
        if op.name == "GLOBAL" and str(arg).split()[0].split(".")[0] == "guard":
            names.add(str(arg))
    return names


def _round_trips(obj) -> list:
    """torch.save + torch.load, pickle, deepcopy of `obj`."""
    return [_loaded(_saved(obj)), pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj)]


def test_word_language_model_checkpoints_whole_model_after_evaluation(mode, tmp_path):
    """The example's loop: train, evaluate in eval mode, `torch.save(model, f)` of the best
    model, load it back at the end; under the guard the checkpoint is the same model."""
    torch.manual_seed(0)
    model = RNNModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _epoch in range(2):
        _train_epoch(model, optimizer)
        expected = _evaluate(model)
        with open(tmp_path / "model.pt", "wb") as f:
            torch.save(model, f)
    with open(tmp_path / "model.pt", "rb") as f:
        best = torch.load(f, weights_only=False)
    assert torch.equal(_evaluate(best), expected)
    assert _guard_globals(model) == set()
    assert guard.findings() == []


def test_model_in_eval_with_gradients_on_still_pickles(mode):
    """Evaluation without no_grad is exactly when the guard counts forwards (ACL502)."""
    torch.manual_seed(0)
    model = RNNModel()
    _train_epoch(model, torch.optim.SGD(model.parameters(), lr=0.5))
    model.eval()
    tokens = _tokens(3)[0]
    expected = model(tokens).detach()
    for other in _round_trips(model):
        assert not other._forward_hooks
        assert torch.equal(other(tokens), expected)
    assert _guard_globals(model) == set()


def _scaled_step(model, optimizer, scheduler, scaler) -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    scaler.scale(F.mse_loss(out.float(), y)).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad()


def _training_objects():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for _ in range(2):
        _scaled_step(model, optimizer, scheduler, scaler)
    return model, optimizer, scheduler, scaler


def _by_kind() -> dict:
    kinds = ("model", "optimizer", "scheduler", "scaler")
    return dict(zip(kinds, _training_objects(), strict=True))


def _same_state(a: dict, b: dict) -> bool:
    """Equal state dicts (tensors by value, everything else by ==)."""
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            if not (isinstance(y, dict) and _same_state(x, y)):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("kind", ["optimizer", "scheduler", "scaler"])
def test_optimizer_scheduler_scaler_round_trips(mode, kind):
    """Each round trip keeps the state the guard watched, and the guard is not in it."""
    obj = _by_kind()[kind]
    assert _guard_globals(obj) == set()
    for other in _round_trips(obj):
        assert _same_state(other.state_dict(), obj.state_dict())
    fresh = _by_kind()[kind]
    fresh.load_state_dict(obj.state_dict())
    assert _same_state(fresh.state_dict(), obj.state_dict())


def test_training_goes_on_identically_after_a_checkpoint_round_trip(mode):
    """Resume from a whole-object checkpoint taken under the guard: one more step on the loaded
    objects gives the weights one more step on the originals gives."""
    objects = _training_objects()
    loaded = _loaded(_saved(objects))
    torch.manual_seed(1)
    _scaled_step(*objects)
    torch.manual_seed(1)
    _scaled_step(*loaded)
    for a, b in zip(objects[0].parameters(), loaded[0].parameters(), strict=True):
        assert torch.equal(a, b)


def test_dataloader_round_trips_mid_pass(mode):
    """The guard counts a loader's batches through its iterator; the loader still pickles."""
    data = TensorDataset(torch.arange(12.0).reshape(6, 2))
    loader = DataLoader(data, batch_size=2)
    iterator = iter(loader)
    next(iterator)
    expected = [b[0] for b in loader]
    for other in _round_trips(loader):
        assert all(torch.equal(a, b[0]) for a, b in zip(expected, other, strict=True))
    assert _guard_globals(loader) == set()


def test_engine_prepared_objects_checkpoint_without_the_guard(mode):
    """The engine's autocast forward is saved as the model's own forward: the checkpoint
    loads as the plain model and computes what the prepared model's original forward does."""
    torch.manual_seed(0)
    engine = guard.Engine(mixed_precision="bf16", gradient_accumulation_steps=2)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = DataLoader(TensorDataset(torch.randn(8, 8), torch.randn(8, 1)), batch_size=2)
    model, optimizer, loader, scheduler = engine.prepare(model, optimizer, loader, scheduler)
    for x, y in loader:
        with engine.accumulate(model):
            engine.backward(F.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    x = torch.randn(3, 8)
    expected = model._original_forward(x)
    for other in _round_trips(model):
        assert torch.equal(other(x), expected)
    assert _guard_globals(model) == set()
    assert _same_state(optimizer.state_dict(), optimizer.optimizer.state_dict())
    assert _same_state(scheduler.state_dict(), scheduler.scheduler.state_dict())


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accelerate_prepared_model_round_trips_as_without_the_guard(mode, precision):
    """fp32: Accelerate leaves the forward alone and so does the guard. bf16: the guard's mark
    on Accelerate's autocast forward pickles as Accelerate's forward itself, which loads as
    the model's own forward (what a pickle of Accelerate's prepared model holds anyway)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1)))
    assert ("forward" in model.__dict__) == (precision == "bf16")
    x = torch.randn(2, 8)
    plain = model.__dict__.get("_original_forward", model)
    for other in _round_trips(model):
        assert torch.equal(other(x), plain(x))
    assert _guard_globals(model) == set()
    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert not hasattr(unwrapped.__dict__.get("forward"), "__guard_original__")


def test_uninstall_leaves_nothing_on_the_objects():
    """After `uninstall()` no hook, wrapper or attribute of the guard's is left on a model it
    evaluated, its parameters, or a copy made while the guard was on; `nn.Module` pickles as
    before."""
    guard.install()
    try:
        torch.manual_seed(0)
        model = RNNModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        _train_epoch(model, optimizer)
        model.eval()
        model(_tokens(1)[0])  # grad-enabled evaluation: ACL502 is counting now
        assert model._forward_hooks  # the count's hook, while in eval
        copied = copy.deepcopy(model)
        assert not copied._forward_hooks  # left out of the copy
        guard.uninstall()
        assert "__reduce_ex__" not in nn.Module.__dict__
        for module in (model, copied):
            for sub in module.modules():
                assert not sub._forward_hooks and not sub._forward_pre_hooks
                assert "forward" not in sub.__dict__
            assert not any(p._post_accumulate_grad_hooks for p in module.parameters())
    finally:
        guard.install()


def test_eval_hook_goes_once_the_model_is_back_in_training():
    """The counting hook exists only while a trainable model is in eval mode, and only on it."""
    guard.install()
    model = RNNModel()
    model.eval()
    assert list(model._forward_hooks) and not model.decoder._forward_hooks
    model.train()
    assert not model._forward_hooks


# -- torch.compile -------------------------------------------------------------------------------
# The "aot_eager" backend runs dynamo and AOTAutograd, which trace through everything the guard
# attaches (hooks, forward wrappers), in about a second; inductor's C++ code generation works
# on this machine too but takes over 30 s and changes nothing the guard is part of.


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _sgd_step(model: nn.Module, params, x, y) -> None:
    optimizer = torch.optim.SGD(params, lr=0.1)
    F.mse_loss(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def test_compiled_training_step_and_evaluation_match_eager(mode):
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    eager, compiled = _small(), _small()
    _sgd_step(eager, list(eager.parameters()), x, y)
    fast = torch.compile(compiled, backend="aot_eager")
    _sgd_step(fast, list(compiled.parameters()), x, y)
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    eager.eval()
    compiled.eval()  # the eval-forward hook is on now
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert torch.allclose(fast(x), eager(x), atol=1e-6)
    assert [str(w.message) for w in seen if "hooks" in str(w.message)] == []
    assert guard.findings() == []


def test_compiled_engine_model_matches_its_eager_forward(mode):
    engine = guard.Engine(mixed_precision="bf16")
    model = engine.prepare(_small())
    x = torch.randn(4, 8)
    expected = model(x)
    assert torch.equal(torch.compile(model, backend="aot_eager")(x), expected)
