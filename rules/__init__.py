"""The catalogue: one module per code (`rules/acl101_raw_backward.py` ...).

`ALL_RULES` maps a code to its `Rule`. Importing this package never imports libcst or torch; a
rule's static check lives in `linter/checks/` under the same module name. A record's module is
imported when its `Rule` is first looked up: a lint run needs the codes only (its selection), not
the docs of 38 rules.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from rules._base import Rule

__all__ = ["ALL_RULES", "Rule", "rule_module", "module_name", "get_rule"]


# Listed rather than found with pkgutil, which costs a directory scan on every start-up;
# tests/rules/test_catalogue.py checks that this list matches the `acl*.py` files on disk.
MODULE_NAMES = (
    "acl101_raw_backward",
    "acl102_scaler_step_bypass",
    "acl103_scaler_update_missing",
    "acl104_clip_scaled_grads",
    "acl105_scaler_with_bf16",
    "acl106_fp16_without_scaler",
    "acl107_fp16_params_with_scaler",
    "acl108_unprepared_object_used",
    "acl201_double_autocast",
    "acl202_backward_in_autocast",
    "acl203_deprecated_amp_api",
    "acl204_autocast_dtype_conflict",
    "acl301_missing_loss_division",
    "acl302_double_loss_division",
    "acl303_per_microstep_clipping",
    "acl304_zero_grad_in_window",
    "acl305_ungated_scheduler_step",
    "acl306_accumulate_context_missing",
    "acl307_dropped_tail_window",
    "acl308_token_mean_under_accumulation",
    "acl309_accumulate_misuse",
    "acl310_schedule_length_mismatch",
    "acl311_weight_decay_scaled_by_accumulation",
    "acl312_off_by_one_step_gate",
    "acl313_accumulation_configured_not_applied",
    "acl401_ddp_missing_no_sync",
    "acl402_world_size_loss_division",
    "acl403_metrics_without_gather",
    "acl404_sampler_set_epoch_missing",
    "acl405_ddp_sync_bypassed",
    "acl501_device_move_before_prepare",
    "acl502_eval_without_no_grad",
    "acl503_scaler_not_checkpointed",
    "acl504_logged_scaled_loss",
    "acl505_clip_exhausted_iterator",
    "acl601_non_finite_loss_or_grad",
    "acl602_precision_silently_ignored",
    "acl603_overflow_streak",
)


# "ACL101" -> "acl101_raw_backward"; `rule_module` checks that the record agrees.
_NAMES = {f"ACL{name[3:6]}": name for name in MODULE_NAMES}
_MODULES: dict[str, ModuleType] = {}


class _Catalogue(Mapping):
    """code -> `Rule`, in catalogue order; each record's module is imported on first look-up."""

    def __getitem__(self, code: str) -> Rule:
        return rule_module(code).RULE

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def __contains__(self, code: object) -> bool:
        return code in _NAMES

    def __repr__(self) -> str:
        return f"ALL_RULES({', '.join(_NAMES)})"


ALL_RULES: Mapping[str, Rule] = _Catalogue()


def rule_module(code: str) -> ModuleType:
    """The module that holds `code`'s metadata and (if any) its static `check`."""
    module = _MODULES.get(code)
    if module is None:
        if not isinstance(code, str) or code not in _NAMES:
            raise KeyError(code)
        module = importlib.import_module(f"{__name__}.{_NAMES[code]}")
        if module.RULE.code != code:
            raise ImportError(f"{module.__name__} holds {module.RULE.code}, not {code}")
        _MODULES[code] = module
    return module


def module_name(code: str) -> str:
    """`acl101_raw_backward` for `ACL101`: the shared name of the record and its check."""
    return _NAMES[code]


def get_rule(code: str) -> Rule:
    return ALL_RULES[code]
