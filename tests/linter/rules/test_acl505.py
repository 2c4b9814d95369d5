"""ACL505 clip-exhausted-iterator: a clip handed an iterator something already consumed."""

from __future__ import annotations

import textwrap

FILTER = """
import torch

params = filter(lambda p: p.requires_grad, model.parameters())  # trainable only
opt = torch.optim.AdamW(params, lr=1e-4)
for x, y in loader:
    crit(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
"""


def test_filter_consumed_by_the_optimizer_is_wrapped_in_list(acl505, at):
    assert acl505.findings(FILTER) == [("ACL505", *at(FILTER, "torch.nn.utils.clip_grad_norm_"))]
    assert acl505.fixed(FILTER) == textwrap.dedent(FILTER).replace(
        "params = filter(lambda p: p.requires_grad, model.parameters())",
        "params = list(filter(lambda p: p.requires_grad, model.parameters()))",
    )


def test_generator_expression_becomes_a_list_comprehension(acl505, at):
    source = """
    import torch

    trainable = (p for p in net.parameters() if p.requires_grad)
    opt = torch.optim.SGD(trainable, lr=0.1)
    for x in loader:
        net(x).sum().backward()
        torch.nn.utils.clip_grad_value_(trainable, 0.5)
        opt.step()
    """
    assert acl505.findings(source) == [("ACL505", *at(source, "torch.nn.utils.clip_grad_value_"))]
    assert "trainable = [p for p in net.parameters() if p.requires_grad]\n" in acl505.fixed(source)


def test_map_and_an_aliased_clip_with_a_keyword_argument(acl505, at):
    source = """
    import torch
    from torch.nn.utils import clip_grad_norm_ as clip

    params = map(lambda kv: kv[1], model.named_parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    for x in loader:
        model(x).sum().backward()
        clip(parameters=params, max_norm=1.0)
        opt.step()
    """
    assert acl505.findings(source) == [("ACL505", *at(source, "clip(parameters"))]
    assert "params = list(map(lambda kv: kv[1], model.named_parameters()))\n" in acl505.fixed(
        source
    )


def test_parameters_call_bound_to_a_name_and_accelerate_clip(acl505, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    params = model.parameters()
    opt = torch.optim.AdamW(params)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
    """
    assert acl505.findings(source) == [("ACL505", *at(source, "accelerator.clip_grad_norm_"))]
    assert "params = list(model.parameters())\n" in acl505.fixed(source)


def test_trainer_class_attribute(acl505, at):
    source = """
    import torch

    class Trainer:
        def __init__(self, model):
            self.model = model
            self.params = filter(lambda p: p.requires_grad, model.parameters())
            self.opt = torch.optim.AdamW(self.params)

        def train_step(self, x):
            self.model(x).sum().backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
    """
    assert acl505.findings(source) == [("ACL505", *at(source, "torch.nn.utils.clip_grad_norm_"))]
    assert "self.params = list(filter(" in acl505.fixed(source)


def test_clip_in_a_loop_consumes_it_on_the_first_pass(acl505, at):
    source = """
    import torch

    params = filter(lambda p: p.requires_grad, model.parameters())
    for x in loader:
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    """
    assert acl505.findings(source) == [("ACL505", *at(source, "torch.nn.utils.clip_grad_norm_"))]


def test_list_tuple_and_list_comprehension_bindings_are_clean(acl505):
    source = """
    import torch

    a = list(filter(lambda p: p.requires_grad, model.parameters()))
    b = tuple(model.parameters())
    c = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD([*a, *b, *c], lr=0.1)
    for x in loader:
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(a, 1.0)
        torch.nn.utils.clip_grad_norm_(b, 1.0)
        torch.nn.utils.clip_grad_norm_(c, 1.0)
        opt.step()
    """
    assert acl505.findings(source) == []


def test_fresh_parameters_call_at_the_clip_site_is_clean(acl505):
    source = """
    import torch

    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.1)
    for x in loader:
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl505.findings(source) == []


def test_iterator_rebuilt_right_before_each_clip_is_clean(acl505):
    source = """
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        model(x).sum().backward()
        params = filter(lambda p: p.grad is not None, model.parameters())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    """
    assert acl505.findings(source) == []


def test_parameter_of_unknown_origin_is_clean(acl505):
    source = """
    import torch

    def step(params, opt):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    """
    assert acl505.findings(source) == []


def test_consumer_in_an_exclusive_branch_is_clean(acl505):
    source = """
    import torch

    def clip_gradients(model, kind, threshold):
        params = model.parameters()
        if kind == "adaptive":
            adaptive_clip(params, threshold)
        elif kind == "norm":
            torch.nn.utils.clip_grad_norm_(params, threshold)
    """
    assert acl505.findings(source) == []
