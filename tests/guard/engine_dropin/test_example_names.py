"""Every `accelerator.<name>` Accelerate's example scripts use exists on guard.Engine, or raises
the documented NotImplementedError (DeepSpeed, Megatron-LM, FP8, TPU, N-D parallelism).

The names were read from the 38 scripts of Accelerate's `examples/` (accelerate 1.15); scripts
without any `accelerator.<name>` (inference, pippy, TPU launchers) are left out. Two names that
`grep accelerator\\.` also finds are `torch.accelerator.current_accelerator`, not Accelerator's.
"""

from __future__ import annotations

import pytest

import guard

USES = {
    "alst_ulysses_sequence_parallelism/sp-alst.py": (
        "backward end_training init_trackers log prepare print torch_device_mesh unwrap_model"
    ),
    "by_feature/automatic_gradient_accumulation.py": (
        "accumulate backward device end_training free_memory gather_for_metrics "
        "gradient_accumulation_steps main_process_first mixed_precision prepare print"
    ),
    "by_feature/checkpointing.py": (
        "backward device distributed_type end_training gather_for_metrics load_state "
        "main_process_first mixed_precision prepare print save_state skip_first_batches"
    ),
    "by_feature/cross_validation.py": (
        "backward device distributed_type end_training free_memory gather_for_metrics "
        "main_process_first mixed_precision prepare print"
    ),
    "by_feature/ddp_comm_hook.py": (
        "accumulate backward device distributed_type end_training gather_for_metrics "
        "main_process_first mixed_precision prepare print"
    ),
    "by_feature/deepspeed_with_config_support.py": (
        "accumulate backward distributed_type end_training gather_for_metrics get_state_dict "
        "gradient_accumulation_steps init_trackers is_local_main_process is_main_process "
        "load_state log main_process_first num_processes prepare print reduce save save_state "
        "skip_first_batches state sync_gradients unwrap_model wait_for_everyone"
    ),
    "by_feature/early_stopping.py": (
        "backward check_trigger device distributed_type end_training gather_for_metrics "
        "main_process_first mixed_precision prepare print set_trigger"
    ),
    "by_feature/fsdp_with_peak_mem_tracking.py": (
        "backward device distributed_type end_training gather_for_metrics init_trackers "
        "load_state log main_process_first mixed_precision prepare print save_state"
    ),
    "by_feature/gradient_accumulation.py": (
        "accumulate backward device distributed_type end_training gather_for_metrics "
        "main_process_first mixed_precision prepare print"
    ),
    "by_feature/gradient_accumulation_for_autoregressive_models.py": (
        "backward clip_grad_norm_ device distributed_type end_training gather gather_for_metrics "
        "init_trackers local_main_process_first log main_process_first mixed_precision "
        "num_processes prepare print"
    ),
    "by_feature/local_sgd.py": (
        "accumulate backward device distributed_type end_training gather_for_metrics "
        "main_process_first mixed_precision prepare print"
    ),
    "by_feature/megatron_lm_gpt_pretraining.py": (
        "accumulate backward distributed_type end_training gather_for_metrics init_trackers "
        "is_local_main_process is_main_process load_state log main_process_first num_processes "
        "prepare print save save_state state sync_gradients unwrap_model wait_for_everyone"
    ),
    "by_feature/memory.py": (
        "backward device distributed_type end_training free_memory gather_for_metrics "
        "main_process_first mixed_precision prepare print"
    ),
    "by_feature/multi_process_metrics.py": (
        "backward device distributed_type end_training gather gather_for_metrics "
        "main_process_first mixed_precision prepare print use_distributed"
    ),
    "by_feature/profiler.py": (
        "accumulate backward device distributed_type end_training gather_for_metrics "
        "main_process_first mixed_precision prepare print profile"
    ),
    "by_feature/schedule_free.py": (
        "backward device distributed_type end_training gather_for_metrics main_process_first "
        "mixed_precision prepare print"
    ),
    "by_feature/tracking.py": (
        "backward device distributed_type end_training gather_for_metrics init_trackers log "
        "main_process_first mixed_precision prepare print"
    ),
    "complete_cv_example.py": (
        "backward device end_training gather_for_metrics init_trackers load_state log prepare "
        "print save_state skip_first_batches"
    ),
    "complete_nlp_example.py": (
        "backward device distributed_type end_training gather_for_metrics init_trackers "
        "load_state log main_process_first mixed_precision prepare print save_state "
        "skip_first_batches"
    ),
    "config_yaml_templates/run_me.py": "end_training fp8_recipe_handler print state",
    "cv_example.py": "backward device end_training gather_for_metrics prepare print",
    "nlp_example.py": (
        "backward device distributed_type end_training gather_for_metrics main_process_first "
        "mixed_precision prepare print"
    ),
    "torch_native_parallelism/fsdp2_fp8.py": (
        "backward end_training init_trackers log prepare print wait_for_everyone"
    ),
    "torch_native_parallelism/nd_parallel.py": (
        "backward end_training init_trackers log maybe_context_parallel parallelism_config "
        "prepare print save_state torch_device_mesh"
    ),
    "torch_native_parallelism/utils.py": "main_process_first",
}
# `accelerator.state.<name>` reads in the same scripts.
STATE_USES = ("deepspeed_plugin", "megatron_lm_plugin")
# Accelerator(...) keywords the scripts pass, with values that select nothing unsupported.
CONSTRUCTOR = {
    "cpu": True,
    "mixed_precision": None,
    "gradient_accumulation_steps": 2,
    "log_with": "all",
    "project_dir": "unused-project-dir",
    "dataloader_config": None,
    "kwargs_handlers": [],
}
# Scripts built on a feature the engine leaves out on purpose (their message says so).
UNSUPPORTED_SCRIPTS = {"torch_native_parallelism/nd_parallel.py"}
ALTERNATIVE = ("keep Accelerator", "use ", "guard.Engine")


def _lookup(engine, name: str) -> str:
    """ "ok" when the name exists, "unsupported" for the documented NotImplementedError."""
    try:
        getattr(engine, name)
    except NotImplementedError as error:
        assert "not supported" in str(error) and any(a in str(error) for a in ALTERNATIVE)
        return "unsupported"
    return "ok"


@pytest.mark.parametrize("script", sorted(USES))
def test_every_name_a_script_uses_exists_or_is_documented_as_unsupported(script):
    engine = guard.Engine(cpu=True)
    outcomes = {name: _lookup(engine, name) for name in USES[script].split()}
    unsupported = sorted(name for name, outcome in outcomes.items() if outcome != "ok")
    expected = ["maybe_context_parallel"] if script in UNSUPPORTED_SCRIPTS else []
    assert unsupported == expected


def test_state_answers_what_the_scripts_ask_it():
    state = guard.Engine(cpu=True).state
    assert [getattr(state, name) for name in STATE_USES] == [None, None]
    assert (state.num_processes, state.process_index, state.device.type) == (1, 0, "cpu")


def test_the_constructor_takes_the_scripts_keywords():
    engine = guard.Engine(**CONSTRUCTOR)
    assert (engine.mixed_precision, engine.device.type) == ("no", "cpu")
    assert engine.gradient_accumulation_steps == 2
    assert engine.project_dir == engine.logging_dir == "unused-project-dir"


@pytest.mark.parametrize(
    "kwargs, feature",
    [
        ({"mixed_precision": "fp8"}, "FP8"),
        ({"deepspeed_plugin": object()}, "DeepSpeed"),
        ({"megatron_lm_plugin": object()}, "Megatron-LM"),
        ({"parallelism_config": object()}, "N-D parallelism"),
        ({"device": "xla"}, "TPU"),
    ],
)
def test_unsupported_features_say_so_and_what_to_use(kwargs, feature):
    with pytest.raises(NotImplementedError, match=feature) as raised:
        guard.Engine(**kwargs)
    assert any(a in str(raised.value) for a in ALTERNATIVE)


def test_unknown_names_are_still_attribute_errors():
    engine = guard.Engine(cpu=True)
    assert not hasattr(engine, "no_such_accelerator_method")
    with pytest.raises(TypeError, match="unexpected keyword"):
        guard.Engine(no_such_option=1)
