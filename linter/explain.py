"""`--explain CODE` and `--list-rules`: the catalogue's own words, so docs and CLI agree."""

from __future__ import annotations

from rules import ALL_RULES, Rule

FIX_SAFETY = {
    "safe": "Fix is safe: applied by `--fix`.",
    "unsafe": "Fix is unsafe: applied only with `--fix --unsafe-fixes`.",
    "safe-when-trailing": "Fix is safe when the code is at the end of its block, otherwise unsafe.",
    "none": "No autofix: this rule only reports.",
}


class UnknownCode(LookupError):
    pass


def rule_for(code: str) -> Rule:
    rule = ALL_RULES.get(code.strip().upper())
    if rule is None:
        raise UnknownCode(f"unknown rule code: `{code}` (see `accel-lint --list-rules`)")
    return rule


def explain_markdown(code: str) -> str:
    """The `--explain` text as markdown: name, summary, fix safety, coverage, then the docs."""
    rule = rule_for(code)
    static = "static check and runtime guard" if rule.static else "runtime guard only"
    return (
        f"# {rule.code} ({rule.name})\n\n"
        f"{rule.summary}\n\n"
        f"- Severity: {rule.severity}\n"
        f"- {FIX_SAFETY[rule.fix]}\n"
        f"- Detected by: {static} (runtime coverage: {rule.runtime})\n"
        f"{_guard_line(rule)}{_hint_line(rule)}\n"
        f"{rule.docs.strip()}\n\n"
        f"{CONFIGURATION_POLICY}"
    )


# Every rule's --explain ends with it: the policy is the same for all of them.
CONFIGURATION_POLICY = """## Findings that depend on the configuration

A finding whose verdict depends on the script's configuration (a command-line flag, a config
dataclass field, a module setting a configurator may override, a YAML/JSON/TOML file) says
whether the default configuration is affected, and otherwise which setting makes it real
(`with --gradient_accumulation_steps > 1 (default 1)`). A finding harmless in the default run is
still reported, one level lower than the same finding in the default run: an error becomes a
warning. A warning is the lowest level shown by default, so a latent warning stays a warning and
says it is latent; hints stay off by default and never hold latent findings.
"""


def _hint_line(rule: Rule) -> str:
    if not rule.hint:
        return ""
    return (
        f"- Hint (info level, off by default: shown with `--hints` or `hints = true` in the "
        f"config, never fails a run): {rule.hint}\n"
    )


GUARD_LEVEL_TEXT = {
    ("error",): "raises `guard.GuardError` (ACCEL_GUARD=raise, the default) or warns (warn mode)",
    ("warning",): "warns, never raises in any mode",
    ("error", "warning"): "raises where the damage is certain, warns where it may be intended "
    "(see the runtime signal)",
}


def _guard_line(rule: Rule) -> str:
    levels = rule.runtime_levels
    if not levels:
        return "- Runtime guard: not detectable at runtime\n"
    return f"- Runtime guard: {GUARD_LEVEL_TEXT[levels]}\n"


COLUMNS = ("code", "name", "fix", "static", "runtime", "summary")


def rule_rows() -> list[tuple[str, ...]]:
    return [
        (r.code, r.name, r.fix, "yes" if r.static else "no", r.runtime, r.summary)
        for r in ALL_RULES.values()
    ]


def rules_table_plain() -> str:
    """Aligned columns (the summary last and unpadded), for pipes and files."""
    rows = [COLUMNS, *rule_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def rules_table_rich():
    from rich.table import Table

    table = Table(*COLUMNS, title="accel-lint rules")
    for row in rule_rows():
        table.add_row(*row)
    return table
