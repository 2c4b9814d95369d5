"""ACL203 deprecated-amp-api: `torch.cuda.amp` / `torch.cpu.amp` references -> `torch.amp`."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source


def _dedent(source: str) -> str:
    return textwrap.dedent(source)


# --- full attribute chains ----------------------------------------------------------------------


def test_positional_autocast_arguments_become_keywords(acl203, at):
    source = """
    import torch

    for x, y in loader:
        with torch.cuda.amp.autocast(use_amp, torch.bfloat16, False):
            loss = crit(model(x), y)
        loss.backward()
    """
    assert acl203.findings(source) == [("ACL203", *at(source, "torch.cuda.amp.autocast"))]
    assert acl203.fixed(source) == _dedent(source).replace(
        "torch.cuda.amp.autocast(use_amp, torch.bfloat16, False)",
        'torch.amp.autocast("cuda", enabled=use_amp, dtype=torch.bfloat16, cache_enabled=False)',
    )


def test_grad_scaler_gets_the_device_first_and_keeps_its_arguments(acl203, at):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler(2.0**14, enabled=args.fp16)
    plain = torch.cuda.amp.GradScaler()
    """
    assert acl203.findings(source) == [
        ("ACL203", *at(source, "torch.cuda.amp.GradScaler(2")),
        ("ACL203", *at(source, "torch.cuda.amp.GradScaler()")),
    ]
    assert acl203.fixed(source) == _dedent(source).replace(
        "torch.cuda.amp.GradScaler(2.0**14", 'torch.amp.GradScaler("cuda", 2.0**14'
    ).replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")')


def test_cpu_autocast_and_scaler_get_the_cpu_device(acl203):
    source = """
    import torch

    scaler = torch.cpu.amp.GradScaler(enabled=False)
    with torch.cpu.amp.autocast(dtype=torch.bfloat16):
        out = model(x)
    """
    assert [f[1] for f in acl203.findings(source)] == [4, 5]
    fixed = acl203.fixed(source)
    assert 'scaler = torch.amp.GradScaler("cpu", enabled=False)' in fixed
    assert 'with torch.amp.autocast("cpu", dtype=torch.bfloat16):' in fixed


def test_torch_alias_is_kept_as_the_prefix(acl203, at):
    source = """
    import torch as th

    def train_one_epoch(model, loader, optimizer, scaler):
        for x, y in loader:
            with th.cuda.amp.autocast():
                loss = model(x, y)
            scaler.scale(loss).backward()
    """
    assert acl203.findings(source) == [("ACL203", *at(source, "th.cuda"))]
    assert 'with th.amp.autocast("cuda"):' in acl203.fixed(source)


def test_custom_fwd_and_custom_bwd_gain_the_device_type(acl203):
    source = """
    import torch

    class Scale(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    class Cast(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            return x
    """
    assert [f[1] for f in acl203.findings(source)] == [6, 11, 17]
    fixed = acl203.fixed(source)
    assert fixed.count('@torch.amp.custom_fwd(device_type="cuda")') == 1
    assert '@torch.amp.custom_bwd(device_type="cuda")' in fixed
    assert '@torch.amp.custom_fwd(cast_inputs=torch.float32, device_type="cuda")' in fixed


def test_arguments_written_one_per_line_stay_so(acl203):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler(
        init_scale=2.0**16,  # the default
        growth_interval=100,
    )
    """
    assert acl203.fixed(source) == _dedent(source).replace(
        "torch.cuda.amp.GradScaler(\n", 'torch.amp.GradScaler(\n    "cuda",\n'
    )


def test_annotation_is_rewritten(acl203):
    source = """
    import torch

    def step(scaler: torch.cuda.amp.GradScaler, optimizer):
        scaler.step(optimizer)
        scaler.update()
    """
    assert len(acl203.findings(source)) == 1
    assert "def step(scaler: torch.amp.GradScaler, optimizer):" in acl203.fixed(source)


def test_chain_used_as_a_value_is_reported_without_a_fix(acl203, at):
    source = """
    import torch

    amp_autocast = torch.cuda.amp.autocast
    if isinstance(scaler, torch.cuda.amp.GradScaler):
        pass
    with torch.cuda.amp.autocast(*flags):
        pass
    """
    diagnostics = acl203.diagnostics(source)
    assert [(d.start.line, d.start.column) for d in diagnostics] == [
        at(source, "torch.cuda.amp.autocast"),
        at(source, "torch.cuda.amp.GradScaler"),
        at(source, "torch.cuda.amp.autocast(*"),
    ]
    assert all(d.fix is None for d in diagnostics)
    assert "used as a value, not called" in diagnostics[0].message
    assert "unpacks `*args`" in diagnostics[2].message
    assert acl203.fixed(source) == _dedent(source)


# --- names bound by an import -----------------------------------------------------------------


CATALOGUE = """
from torch.cuda.amp import GradScaler, autocast

scaler = GradScaler(2.0**14)
for x in loader:
    with autocast(use_amp):
        out = model(x)
"""


def test_catalogue_example_two_names_on_one_import_line(acl203, at):
    """One finding per imported name, at the import; one fix rewrites both names and replaces
    the import line with `import torch`, which the module lacked."""
    assert acl203.findings(CATALOGUE) == [
        ("ACL203", *at(CATALOGUE, "GradScaler")),
        ("ACL203", *at(CATALOGUE, "autocast")),
    ]
    first, second = acl203.diagnostics(CATALOGUE)
    assert first.fix == second.fix
    assert first.fix.applicability == "safe"
    assert "(used on line 4)" in first.message
    assert acl203.fixed(CATALOGUE) == _dedent(
        """
        import torch

        scaler = torch.amp.GradScaler("cuda", 2.0**14)
        for x in loader:
            with torch.amp.autocast("cuda", enabled=use_amp):
                out = model(x)
        """
    )


def test_import_is_removed_when_torch_is_already_imported(acl203):
    source = """
    import torch
    from torch.cuda.amp import autocast as ac  # mixed precision

    class Trainer:
        def __init__(self, model, optimizer):
            self.model, self.optimizer = model, optimizer
            self.scaler = torch.amp.GradScaler("cuda")

        def fit(self, loader):
            for x in loader:
                with ac():
                    loss = self.model(x)
                self.scaler.scale(loss).backward()
    """
    fixed = acl203.fixed(source)
    assert "from torch.cuda.amp" not in fixed
    assert fixed.startswith("\nimport torch\n# mixed precision\n\nclass Trainer:")
    assert 'with torch.amp.autocast("cuda"):' in fixed


def test_other_names_of_the_import_line_are_kept(acl203):
    source = """
    import torch
    from torch.cuda.amp import GradScaler, autocast

    scaler = GradScaler()
    """
    assert acl203.fixed(source) == _dedent(
        """
        import torch

        scaler = torch.amp.GradScaler("cuda")
        """
    )
    partly = _dedent(source) + "ctx = autocast\n"
    assert "from torch.cuda.amp import autocast\n" in acl203.fixed(partly)


def test_parenthesized_import_keeps_its_comments(acl203):
    source = """
    import torch
    from torch.cuda.amp import (
        GradScaler,  # fp16 only
        autocast,
    )

    scaler = GradScaler()
    with autocast():
        pass
    """
    fixed = acl203.fixed(source)
    assert fixed.startswith("\nimport torch\n# fp16 only\n\nscaler = ")


def test_import_inside_a_function_brings_torch_there(acl203):
    source = """
    def main():
        from torch.cuda.amp import autocast
        i = 0
        while i < steps:
            with autocast(enabled=True):
                loss = model(next(batches))
            i += 1
    """
    assert acl203.fixed(source) == _dedent(
        """
        def main():
            import torch
            i = 0
            while i < steps:
                with torch.amp.autocast("cuda", enabled=True):
                    loss = model(next(batches))
                i += 1
        """
    )


def test_deprecated_module_aliases(acl203, at):
    source = """
    import torch
    import torch.cuda.amp as amp
    from torch.cpu import amp as cpu_amp

    scaler = amp.GradScaler()
    with amp.autocast(True):
        pass
    with cpu_amp.autocast(dtype=torch.bfloat16):
        pass
    """
    assert acl203.findings(source) == [
        ("ACL203", *at(source, "torch.cuda.amp as amp")),
        ("ACL203", *at(source, "amp as cpu_amp")),
    ]
    assert acl203.fixed(source) == _dedent(
        """
        import torch
        import torch.amp as amp
        from torch import amp as cpu_amp

        scaler = amp.GradScaler("cuda")
        with amp.autocast("cuda", enabled=True):
            pass
        with cpu_amp.autocast("cpu", dtype=torch.bfloat16):
            pass
        """
    )


def test_from_torch_cuda_import_amp_yolov5_style(acl203):
    source = """
    import torch
    from torch.cuda import amp, nvtx

    def train(model, loader, optimizer, cuda):
        scaler = amp.GradScaler(enabled=cuda)
        for x in loader:
            with amp.autocast(enabled=cuda):
                loss = model(x)
            scaler.scale(loss).backward()
    """
    fixed = acl203.fixed(source)
    assert "from torch import amp\nfrom torch.cuda import nvtx\n" in fixed
    assert 'scaler = amp.GradScaler("cuda", enabled=cuda)' in fixed
    assert 'with amp.autocast("cuda", enabled=cuda):' in fixed


def test_module_alias_with_another_attribute_is_not_fixed(acl203):
    source = """
    from torch.cuda import amp

    scaler = amp.GradScaler()
    ok = amp.common.amp_definitely_not_available()
    """
    (diagnostic,) = acl203.diagnostics(source)
    assert diagnostic.fix is None
    assert "`amp.common.amp_definitely_not_available` on line 5 has no `torch.amp` twin" in (
        diagnostic.message
    )


def test_escaping_names_are_reported_without_a_fix(acl203):
    source = """
    from torch.cuda.amp import GradScaler, autocast, custom_fwd

    __all__ = ["GradScaler"]
    amp_context = autocast
    scaler = GradScaler()

    @custom_fwd
    def forward(ctx, x):
        return x
    """
    scaler, context, decorator = acl203.diagnostics(source)
    assert scaler.fix is None and "re-exported" in scaler.message
    assert context.fix is None and "`autocast` on line 5 is used as a value" in context.message
    assert decorator.fix is not None  # independent of the two that escape
    fixed = acl203.fixed(source)
    assert "from torch.cuda.amp import GradScaler, autocast\n" in fixed
    assert '@torch.amp.custom_fwd(device_type="cuda")' in fixed


def test_explicit_reexport_and_package_init_are_not_fixed(acl203):
    source = "from torch.cuda.amp import autocast as autocast\nwith autocast():\n    pass\n"
    (diagnostic,) = acl203.diagnostics(source)
    assert diagnostic.fix is None
    plain = "from torch.cuda.amp import autocast\nwith autocast():\n    pass\n"
    (in_init,) = analyze_source(plain, "pkg/__init__.py", ["ACL203"])
    assert in_init.fix is None and "re-exported" in in_init.message


def test_a_name_bound_twice_is_not_rewritten(acl203):
    source = """
    try:
        from torch.cuda.amp import autocast
    except ImportError:
        autocast = None
    with autocast():
        pass
    """
    (diagnostic,) = acl203.diagnostics(source)
    assert diagnostic.fix is None
    assert "also bound to something else" in diagnostic.message


# --- must not flag ----------------------------------------------------------------------------


def test_torch_amp_and_torch_autocast_are_fine(acl203):
    source = """
    import torch
    from torch.amp import GradScaler, autocast

    scaler = torch.amp.GradScaler("cuda")
    other = GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), autocast("cuda"):
        pass

    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x
    """
    assert acl203.findings(source) == []


def test_fallback_in_an_import_error_handler(acl203):
    source = """
    try:
        from torch.amp import GradScaler
    except ImportError:
        from torch.cuda.amp import GradScaler
    scaler = GradScaler()
    """
    assert acl203.findings(source) == []


def test_fallback_in_an_attribute_error_handler(acl203):
    source = """
    import torch

    class NativeScaler:
        def __init__(self, device="cuda"):
            try:
                self._scaler = torch.amp.GradScaler(device=device)
            except (AttributeError, TypeError):
                self._scaler = torch.cuda.amp.GradScaler()
    """
    assert acl203.findings(source) == []


def test_version_and_feature_branches(acl203):
    source = """
    import torch

    if is_torch_version(">=", "2.4.0"):
        from torch.amp import GradScaler
    else:
        from torch.cuda.amp import GradScaler

    def make_scaler(**kwargs):
        if hasattr(torch.amp, "GradScaler"):
            return torch.amp.GradScaler("cuda", **kwargs)
        return_value = None
        if torch.__version__ < "2.3":
            return_value = torch.cuda.amp.GradScaler(**kwargs)
        return return_value

    scaler = torch.amp.GradScaler("cuda") if TORCH_GE_2_4 else torch.cuda.amp.GradScaler()
    """
    assert acl203.findings(source) == []


def test_mentions_in_strings_and_comments(acl203):
    source = '''
    import torch

    def make(use_amp):
        """Build a torch.cuda.amp.GradScaler (see torch.cuda.amp.autocast)."""
        # was: torch.cuda.amp.GradScaler()
        name = "torch.cuda.amp.autocast"
        return torch.amp.GradScaler("cuda", enabled=use_amp), name
    '''
    assert acl203.findings(source) == []


def test_assigning_to_the_deprecated_attribute_is_not_a_use(acl203):
    source = """
    import torch

    torch.cuda.amp.GradScaler = PatchedScaler
    """
    assert acl203.findings(source) == []


def test_fallback_after_an_early_return_on_a_feature_test(acl203):
    source = """
    import torch

    def make_scaler(enabled):
        if hasattr(torch.amp, "GradScaler"):
            return torch.amp.GradScaler("cuda", enabled=enabled)
        return torch.cuda.amp.GradScaler(enabled=enabled)
    """
    assert acl203.findings(source) == []
    plain = source.replace('hasattr(torch.amp, "GradScaler")', "enabled")
    assert len(acl203.findings(plain)) == 1


def test_broad_except_after_a_torch_amp_attempt_is_a_fallback(acl203):
    source = """
    import torch

    try:
        scaler = torch.amp.GradScaler("cuda")
    except Exception:
        scaler = torch.cuda.amp.GradScaler()
    try:
        other = build()
    except Exception:
        other = torch.cuda.amp.GradScaler()
    """
    assert [f[1] for f in acl203.findings(source)] == [11]


def test_optional_torch_import_still_resolves_the_chain(acl203):
    source = """
    try:
        import torch
    except ImportError:
        torch = None

    scaler = torch.cuda.amp.GradScaler()
    """
    assert len(acl203.findings(source)) == 1
    assert 'scaler = torch.amp.GradScaler("cuda")' in acl203.fixed(source)


def test_the_same_import_in_two_functions(acl203):
    source = """
    import torch

    def check_fp16(model, x):
        from torch.cuda.amp import autocast

        with autocast():
            return model(x)

    def check_bf16(model, x):
        from torch.cuda.amp import autocast

        with autocast(dtype=torch.bfloat16):
            return model(x)
    """
    first, second = acl203.diagnostics(source)
    assert "(used on line 7)" in first.message and "(used on line 13)" in second.message
    fixed = acl203.fixed(source)
    assert "torch.cuda.amp" not in fixed
    assert 'with torch.amp.autocast("cuda", dtype=torch.bfloat16):' in fixed


def test_partial_binds_the_device_first(acl203):
    source = """
    from functools import partial

    import torch

    autocast_ctx = partial(torch.cuda.amp.autocast, enabled=True, dtype=torch.bfloat16)
    make_scaler = partial(torch.cuda.amp.GradScaler, init_scale=1024)
    positional = partial(torch.cuda.amp.autocast, True)
    """
    diagnostics = acl203.diagnostics(source)
    assert [d.fix is not None for d in diagnostics] == [True, True, False]
    fixed = acl203.fixed(source)
    assert 'partial(torch.amp.autocast, "cuda", enabled=True, dtype=torch.bfloat16)' in fixed
    assert 'partial(torch.amp.GradScaler, "cuda", init_scale=1024)' in fixed
    assert "partial(torch.cuda.amp.autocast, True)" in fixed
