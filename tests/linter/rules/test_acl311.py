"""ACL311 weight-decay-scaled-by-accumulation: `weight_decay` multiplied or divided by K."""

from __future__ import annotations

import textwrap


def test_constructor_argument_multiplied_by_k(acl311, at):
    source = """
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1 * args.grad_accum)
    """
    assert acl311.findings(source) == [("ACL311", *at(source, "0.1 * args"))]
    (diagnostic,) = acl311.diagnostics(source)
    assert "`args.grad_accum`" in diagnostic.message
    assert acl311.fixed(source) == textwrap.dedent(source)  # no autofix


def test_parameter_group_divided_by_k(acl311, at):
    source = """
    import torch

    groups = [
        {"params": decay, "weight_decay": cfg["weight_decay"] / cfg["grad_accum"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    opt = torch.optim.SGD(groups, lr=0.1)
    """
    assert acl311.findings(source) == [("ACL311", *at(source, 'cfg["weight_decay"] /'))]


def test_decay_bound_to_a_name_in_a_trainer_method(acl311, at):
    source = """
    import torch

    GRAD_ACCUM = 8

    class Trainer:
        def build(self):
            wd = self.wd * GRAD_ACCUM
            return torch.optim.AdamW(self.params, lr=self.lr, weight_decay=wd)

        def build_again(self):
            return torch.optim.Adam(self.params, weight_decay=self.wd / self.accum)
    """
    assert acl311.findings(source) == [
        ("ACL311", *at(source, "wd)")),
        ("ACL311", *at(source, "self.wd / self.accum")),
    ]


# --- must not flag ------------------------------------------------------------------------


def test_learning_rate_scaled_with_k_or_the_effective_batch(acl311):
    source = """
    import torch

    lr = args.lr * args.grad_accum * args.batch_size / 256
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.weight_decay)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * args.grad_accum, weight_decay=1e-4)
    """
    assert acl311.findings(source) == []


def test_weight_decay_converted_with_the_learning_rate(acl311):
    source = """
    import torch

    lr = args.lr * args.grad_accum
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.l2 / lr)
    wd = args.l2 / (args.lr * args.grad_accum)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    """
    assert acl311.findings(source) == []


def test_hand_written_l2_term_divided_with_the_loss(acl311):
    source = """
    for i, (x, y) in enumerate(dl):
        l2 = sum((p ** 2).sum() for p in model.parameters())
        loss = (crit(model(x), y) + weight_decay * l2) / args.grad_accum
        loss.backward()
    """
    assert acl311.findings(source) == []
