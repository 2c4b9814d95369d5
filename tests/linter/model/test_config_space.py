"""The configuration space: every source of a knob, read the way users write scripts."""

from __future__ import annotations

import textwrap

import libcst
import pytest

from linter.model import Model
from linter.model.config_space import KnobSource, config_space, k_configuration
from linter.types import Configuration


def build(source: str, path: str | None = None) -> Model:
    source = textwrap.dedent(source)
    return Model(libcst.parse_module(source), source, path=path)


def knob(model: Model, expr: str, scope: str = "main"):
    found = [s for s in model.scopes if s.name == scope] or model.scopes[:1]
    return config_space(model).knob_for(libcst.parse_expression(expr), found[0])


ARGPARSE = """
import argparse

def parse_args():
    parser = argparse.ArgumentParser(description="Finetune a causal LM")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1,
                        help="Number of updates steps to accumulate before a backward pass.")
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("-lr", "--learning-rate", dest="lr", type=float, default="3e-4")
    parser.add_argument("--seed", type=int)
    return parser.parse_args()

def main():
    args = parse_args()
    accum = args.gradient_accumulation_steps
    for step, batch in enumerate(train_dataloader):
        if (step + 1) % accum == 0:
            optimizer.step()
"""


def test_argparse_knobs_have_their_default_choices_type_and_line():
    model = build(ARGPARSE)
    by_name = {k.name: k for k in config_space(model).knobs}
    k = by_name["gradient_accumulation_steps"]
    assert (k.spelling, k.default, k.type, k.source, k.line) == (
        "--gradient_accumulation_steps",
        1,
        "int",
        KnobSource.ARGPARSE,
        6,
    )
    assert by_name["mixed_precision"].choices == ("no", "fp16", "bf16")
    assert by_name["with_tracking"].default is False
    assert by_name["with_tracking"].type == "bool"
    assert (by_name["lr"].spelling, by_name["lr"].default) == ("--learning-rate", 3e-4)
    assert by_name["seed"].default is None and by_name["seed"].default_known


def test_argparse_knob_found_through_the_parse_result_and_an_alias():
    model = build(ARGPARSE)
    assert knob(model, "args.gradient_accumulation_steps").name == "gradient_accumulation_steps"
    assert knob(model, "accum").name == "gradient_accumulation_steps"
    assert knob(model, "int(args.gradient_accumulation_steps)").default == 1
    assert knob(model, 'vars(args)["mixed_precision"]').name == "mixed_precision"
    assert knob(model, 'getattr(args, "with_tracking")').name == "with_tracking"
    assert knob(model, "args.not_an_option") is None


def test_parse_known_args_and_a_parameter_holding_the_settings():
    model = build(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--grad-accum", type=int, default=8)
        args, unknown = parser.parse_known_args()

        def train(opt, model, loader):
            for i, batch in enumerate(loader):
                if (i + 1) % opt.grad_accum == 0:
                    optimizer.step()
        """
    )
    assert knob(model, "args.grad_accum", "<module>").default == 8
    assert knob(model, "opt.grad_accum", "train").spelling == "--grad-accum"


def test_set_defaults_changes_the_default():
    model = build(
        """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--accum_steps", type=int, default=1)
        p.set_defaults(accum_steps=4)
        args = p.parse_args()
        """
    )
    assert knob(model, "args.accum_steps", "<module>").default == 4


def test_hf_argument_parser_dataclass_fields():
    model = build(
        """
        from dataclasses import dataclass, field
        from transformers import HfArgumentParser

        @dataclass
        class TrainingConfig:
            gradient_accumulation_steps: int = field(default=2, metadata={"help": "K"})
            mixed_precision: str = field(
                default="bf16", metadata={"choices": ["no", "fp16", "bf16"]}
            )
            output_dir: str = field(metadata={"help": "required"})

        @dataclass
        class ModelArguments:
            model_name_or_path: str = "gpt2"

        def main():
            parser = HfArgumentParser((ModelArguments, TrainingConfig))
            model_args, train_args = parser.parse_args_into_dataclasses()
            k = train_args.gradient_accumulation_steps
        """
    )
    k = knob(model, "k")
    assert (k.spelling, k.default, k.source, k.line) == (
        "--gradient_accumulation_steps",
        2,
        KnobSource.DATACLASS,
        7,
    )
    assert knob(model, "train_args.mixed_precision").choices == ("no", "fp16", "bf16")
    assert not knob(model, "train_args.output_dir").default_known
    assert knob(model, "model_args.model_name_or_path").default == "gpt2"


def test_plain_config_dataclass_instance():
    model = build(
        """
        from dataclasses import dataclass

        @dataclass
        class Config:
            grad_accum_steps: int = 4
            lr: float = 6e-4

        def main():
            cfg = Config()
            for step, (x, y) in enumerate(loader):
                if (step + 1) % cfg.grad_accum_steps == 0:
                    opt.step()
        """
    )
    k = knob(model, "cfg.grad_accum_steps")
    assert (k.spelling, k.default, k.line) == ("Config.grad_accum_steps", 4, 6)


NANOGPT = """
import os
import torch
batch_size = 12
gradient_accumulation_steps = 5 * 8 # used to simulate larger batch sizes
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
config_keys = [k for k,v in globals().items() if not k.startswith('_')]
exec(open('configurator.py').read()) # overrides from command line or config file
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    gradient_accumulation_steps //= 8
"""


def test_nanogpt_globals_a_configurator_may_override():
    model = build(NANOGPT)
    k = knob(model, "gradient_accumulation_steps", "<module>")
    assert (k.spelling, k.default, k.source, k.line) == (
        "--gradient_accumulation_steps",
        40,
        KnobSource.OVERRIDABLE_GLOBAL,
        5,
    )
    assert knob(model, "batch_size", "<module>").default == 12
    assert knob(model, "dtype", "<module>") is None  # computed: not a literal default


def test_module_constant_is_a_knob_only_when_bound_once():
    model = build(
        """
        GRAD_ACCUM = 1
        LR = 1e-3
        STEPS = 10
        STEPS = 20

        def main():
            for i, b in enumerate(dl):
                if (i + 1) % GRAD_ACCUM == 0:
                    opt.step()
        """
    )
    k = knob(model, "GRAD_ACCUM")
    assert (k.spelling, k.default, k.source) == ("GRAD_ACCUM", 1, KnobSource.CONSTANT)
    assert knob(model, "STEPS") is None


def test_a_local_binding_shadows_a_global_knob():
    model = build(
        """
        accum_steps = 4

        def main():
            accum_steps = compute()
            return accum_steps
        """
    )
    assert knob(model, "accum_steps") is None
    assert knob(model, "accum_steps", "<module>").default == 4


def test_dict_and_namespace_configs():
    model = build(
        """
        from types import SimpleNamespace
        config = {"lr": 3e-4, "grad_accum": 4, "dtype": "float16"}
        defaults = dict(seed=0)
        opts = SimpleNamespace(**{"accum_iter": 2}, epochs=3)

        def main():
            k = config["grad_accum"]
        """
    )
    assert (knob(model, "k").spelling, knob(model, "k").default) == ('config["grad_accum"]', 4)
    assert knob(model, 'config.get("dtype", "float32")').default == "float16"
    found = knob(model, "opts.accum_iter")
    assert (found.spelling, found.default, found.source) == (
        "opts.accum_iter",
        2,
        KnobSource.NAMESPACE,
    )
    assert knob(model, "opts.epochs").default == 3


def _project(tmp_path, name: str, text: str, script: str) -> Model:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / name).write_text(textwrap.dedent(text))
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    return build(script, str(path))


def test_yaml_config_file_loaded_from_a_literal_path(tmp_path):
    model = _project(
        tmp_path,
        "train.yaml",
        """
        optim:
          lr: 0.0003
        grad_accum_steps: 4
        mixed_precision: fp16
        """,
        """
        import yaml

        def main():
            with open("configs/train.yaml") as f:
                cfg = yaml.safe_load(f)
            k = cfg["grad_accum_steps"]
            lr = cfg["optim"]["lr"]
        """,
    )
    k = knob(model, "k")
    assert (k.spelling, k.default, k.source, k.line, k.path) == (
        "configs/train.yaml: grad_accum_steps",
        4,
        KnobSource.YAML,
        4,
        "configs/train.yaml",
    )
    assert knob(model, "lr").default == 0.0003
    assert config_space(model).notes == []


def test_yaml_path_from_an_argparse_default(tmp_path):
    model = _project(
        tmp_path,
        "base.yml",
        "accumulate_steps: 2\n",
        """
        import argparse, yaml
        p = argparse.ArgumentParser()
        p.add_argument("--config", default="configs/base.yml")
        args = p.parse_args()
        conf = yaml.safe_load(open(args.config))
        accum = conf["accumulate_steps"]
        """,
    )
    assert knob(model, "accum", "<module>").default == 2


def test_json_and_toml_config_files(tmp_path):
    model = _project(
        tmp_path,
        "ds.json",
        '{"train": {"gradient_accumulation_steps": 16}}',
        """
        import json
        cfg = json.load(open("configs/ds.json"))
        """,
    )
    found = knob(model, 'cfg["train"]["gradient_accumulation_steps"]', "<module>")
    assert (found.default, found.source) == (16, KnobSource.JSON)
    (tmp_path / "configs" / "run.toml").write_text("[train]\naccum = 3\n")
    script = 'import tomllib\nwith open("configs/run.toml", "rb") as f:\n    t = tomllib.load(f)\n'
    model = build(script, str(tmp_path / "train.py"))
    found = knob(model, "t.train.accum", "<module>")
    assert (found.default, found.source, found.line) == (3, KnobSource.TOML, 2)


def test_a_config_file_that_does_not_parse_is_a_note(tmp_path):
    model = _project(
        tmp_path,
        "broken.yaml",
        "grad_accum: [4\nlr: 1\n",
        """
        import yaml
        cfg = yaml.safe_load(open("configs/broken.yaml"))
        k = cfg["grad_accum"]
        """,
    )
    space = config_space(model)
    assert knob(model, "k", "<module>") is None
    assert len(space.notes) == 1
    assert space.notes[0].startswith("configs/broken.yaml: does not parse as YAML (")


def test_a_config_file_the_project_does_not_hold_is_not_read(tmp_path):
    script = 'import yaml\ncfg = yaml.safe_load(open("configs/missing.yaml"))\n'
    model = build(script, str(tmp_path / "train.py"))
    assert config_space(model).knobs == [] and config_space(model).notes == []


@pytest.mark.parametrize(
    ("default", "expected"),
    [
        (
            1,
            Configuration(
                False,
                "with --gradient_accumulation_steps > 1 (default 1)",
                ("gradient_accumulation_steps",),
            ),
        ),  # noqa: E501
        (
            4,
            Configuration(
                True,
                "with --gradient_accumulation_steps > 1 (default 4)",
                ("gradient_accumulation_steps",),
            ),
        ),  # noqa: E501
    ],
)
def test_k_configuration_from_the_knob_default(default, expected):
    model = build(ARGPARSE.replace("default=1,", f"default={default},"))
    main = [s for s in model.scopes if s.name == "main"][0]
    assert k_configuration(model, libcst.parse_expression("accum"), main) == expected


def test_k_configuration_is_none_for_a_literal_or_an_unknown_k():
    model = build(ARGPARSE)
    main = [s for s in model.scopes if s.name == "main"][0]
    assert k_configuration(model, libcst.parse_expression("4"), main) is None
    assert k_configuration(model, libcst.parse_expression("trainer.accum"), main) is None


def test_a_dict_item_the_code_computes_is_no_knob_but_reads_through():
    model = build(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--accum", type=int, default=2)
        args = parser.parse_args()

        def main():
            hparams = {"accum": args.accum, "lr": 1e-3}
            checkpoint = {"epoch": epoch, "model": model.state_dict()}
        """
    )
    assert [k.spelling for k in config_space(model).knobs] == ["--accum", 'hparams["lr"]']
    assert knob(model, 'hparams["accum"]').spelling == "--accum"
    assert knob(model, 'checkpoint["epoch"]') is None


def test_without_pyyaml_a_yaml_file_is_a_note(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)  # `import yaml` fails
    model = _project(
        tmp_path,
        "train.yaml",
        "grad_accum: 4\n",
        'import yaml\ncfg = yaml.safe_load(open("configs/train.yaml"))\n',
    )
    assert config_space(model).knobs == []
    assert config_space(model).notes == ["configs/train.yaml: not read (PyYAML is not installed)"]
