"""guard.Engine(fsdp_plugin=accelerate.FullyShardedDataParallelPlugin(fsdp_version=2, ...)): the
fields FSDP2Plugin supports are mapped, the others refused by name. One process: the mapping is
checked on the engine's plugin, and the resulting units by `fully_shard` on a 1-rank gloo group."""

from __future__ import annotations

import functools

import pytest
import torch
from accelerate import FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

import guard
from guard import _fsdp2


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ff = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.ff(x))


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]  # what a transformers model declares

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(8, 2, bias=False)  # 16 parameters; a Block holds 72

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def plugin(**fields) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(fsdp_version=2, **fields)


def mapped(precision: str = "no", **fields) -> _fsdp2.FSDP2Plugin:
    return guard.Engine(precision, fsdp_plugin=plugin(**fields)).fsdp_plugin


def units(plugin: _fsdp2.FSDP2Plugin, precision: str = "no") -> list[str]:
    model = _fsdp2.shard(Net(), plugin, precision)
    return [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def test_transformer_based_wrap_shards_the_named_layers(one_rank_group):
    got = mapped(
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        reshard_after_forward=False,
    )
    assert got == _fsdp2.FSDP2Plugin(_fsdp2.LayerClassNames(("Block",)), False)
    assert units(got) == ["", "layers.0", "layers.1"]  # the root, then each Block
    model = _fsdp2.shard(Net(), got, "no")
    model(torch.randn(3, 8))  # reshard_after_forward=False: the Blocks stay gathered after it
    assert {type(p).__name__ for p in model.layers.parameters()} == {"Parameter"}
    model = _fsdp2.shard(Net(), mapped(auto_wrap_policy="transformer_based_wrap"), "no")
    model(torch.randn(3, 8))  # Accelerate's default, True: resharded into DTensors
    assert {type(p).__name__ for p in model.layers.parameters()} == {"DTensor"}


def test_transformer_layers_default_to_no_split_modules_and_must_exist(one_rank_group):
    got = mapped(auto_wrap_policy="transformer_based_wrap")
    assert got.auto_wrap_policy == _fsdp2.LayerClassNames(None)
    assert units(got) == ["", "layers.0", "layers.1"]
    missing = mapped(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["X"])
    with pytest.raises(ValueError, match="transformer_cls_names_to_wrap: no X module"):
        units(missing)


def test_a_partial_transformer_policy_keeps_its_classes():
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    assert mapped(auto_wrap_policy=policy).auto_wrap_policy == (Block,)


def test_size_based_wrap_shards_modules_over_min_num_params(one_rank_group):
    got = mapped(auto_wrap_policy="size_based_wrap", min_num_params=50)
    assert got.auto_wrap_policy == _fsdp2.MinParams(50)
    # Every module over the threshold, as Accelerate's policy: a Block and its Linear hold 72
    # parameters each, the head 16; the ModuleList (144) is no unit (it has no forward)
    assert units(got) == ["", "layers.0", "layers.0.ff", "layers.1", "layers.1.ff"]
    assert mapped(auto_wrap_policy="size_based_wrap", min_num_params=0).auto_wrap_policy is (
        _fsdp2.root_only
    )


def test_no_wrap_shards_only_the_root_and_reshards_as_accelerate_does(one_rank_group):
    got = mapped()  # Accelerate's defaults: no_wrap, reshard_after_forward=True
    assert got == _fsdp2.FSDP2Plugin(_fsdp2.root_only, True)
    assert units(got) == [""]


def test_mixed_precision_policy_is_used_when_it_matches_the_engine(one_rank_group):
    given = plugin(mixed_precision_policy="bf16")  # Accelerate builds the policy from the name
    got = guard.Engine("bf16", fsdp_plugin=given).fsdp_plugin
    assert got.mixed_precision_policy == given.mixed_precision_policy  # Accelerate's own policy
    assert got.mixed_precision_policy.param_dtype == torch.bfloat16
    assert got.mixed_precision_policy.reduce_dtype == torch.bfloat16
    model = _fsdp2.shard(Net(), got, "bf16")
    assert model(torch.randn(3, 8)).dtype == torch.bfloat16  # computed in the policy's dtype
    assert _fsdp2.mixed_precision_policy(mapped("bf16"), "bf16") == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,  # none given: the engine's
    )
    with pytest.raises(ValueError, match="disagrees with the engine's mixed_precision='fp16'"):
        _fsdp2.mixed_precision_policy(got, "fp16")


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(cpu_offload=True), "cpu_offload"),
        (dict(activation_checkpointing=True), "activation_checkpointing"),
        (dict(cpu_ram_efficient_loading=True), "cpu_ram_efficient_loading"),
        (dict(state_dict_type="FULL_STATE_DICT"), "state_dict_type"),
        (dict(sharding_strategy="SHARD_GRAD_OP", reshard_after_forward=False), "sharding_strategy"),
        (dict(ignored_modules=[torch.nn.Linear(1, 1)]), "ignored_modules"),
        (dict(auto_wrap_policy=lambda module, recurse, nonwrapped_numel: True), "auto_wrap_policy"),
    ],
)
def test_unsupported_fields_are_refused_by_name(monkeypatch, fields, named):
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "False")  # restored: Accelerate sets it
    with pytest.raises(NotImplementedError, match=rf"FullyShardedDataParallelPlugin\({named}="):
        guard.Engine(fsdp_plugin=plugin(**fields))


def test_fsdp1_is_refused_with_the_way_out():
    with pytest.raises(NotImplementedError, match="fsdp_version=2, ...\\) or a guard.FSDP2Plugin"):
        guard.Engine(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
