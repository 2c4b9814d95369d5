"""One definition of a prepare call (`setup.is_prepare`), asked with the kind each reader wants."""

from __future__ import annotations

import libcst as cst
import pytest

from linter.model.setup import is_prepare, is_prepare_call


@pytest.mark.parametrize(
    ("method", "kinds", "expected"),
    [
        ("prepare", (), True),  # takes any object
        ("prepare_data_loader", ("data_loader",), True),
        ("prepare_data_loader", ("scheduler",), False),
        ("prepare_scheduler", ("scheduler",), True),
        ("prepare_model", (), False),
        ("prepare_optimizer", ("model", "data_loader", "optimizer", "scheduler"), True),
        ("prepare_dataset", ("data_loader",), False),
        (None, ("data_loader",), False),
    ],
)
def test_is_prepare(method, kinds, expected):
    assert is_prepare(method, *kinds) is expected


def test_a_prepare_call_is_a_method_call_and_defaults_to_the_model_form():
    call = cst.parse_expression
    assert is_prepare_call(call("accelerator.prepare(model, optimizer)"))
    assert is_prepare_call(call("accelerator.prepare_model(model)"))
    assert not is_prepare_call(call("accelerator.prepare_data_loader(loader)"))
    assert is_prepare_call(call("accelerator.prepare_data_loader(loader)"), ("data_loader",))
    assert not is_prepare_call(call("prepare(model)"))  # a function of the user's own
