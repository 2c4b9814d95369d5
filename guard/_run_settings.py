"""The run's settings as the guard can see them without help from the script.

The linter knows a finding may be latent (harmless at the default, real with
`--gradient_accumulation_steps 4`); the guard sees the one configuration that runs. It records
what the command line set: every `argparse` parse (`parse_args`, `parse_known_args`,
HfArgumentParser's dataclasses, all through `ArgumentParser.parse_known_args`, wrapped through
the patch registry so `uninstall()` restores it) with each option's value and the parser's own
default, and nanoGPT's configurator overrides (`--key=value` on the command line for a global of
`__main__`, its default read from the script's source). A finding whose cause is the
accumulation count or the precision then says which non-default setting of this run makes it
bite; the run report lists them all.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from guard import _patch

# The catalogue's accumulation-count names; the precision's.
_K_NAME = re.compile(r"grad(ient)?_?acc(um(ulation)?)?(_steps)?|accum(ulation)?_steps", re.I)
_PRECISION_NAME = re.compile(r"precision|dtype|(^|_)(fp16|bf16|half|amp|autocast)($|_)", re.I)
K_CODES = frozenset(
    ["ACL101", "ACL401", "ACL402"] + [f"ACL3{n:02d}" for n in range(1, 14)]
)  # fmt: skip
PRECISION_CODES = frozenset(("ACL101", "ACL105", "ACL106", "ACL107", "ACL204", "ACL602"))
_MAX_SETTINGS = 512


@dataclass(frozen=True)
class Setting:
    name: str  # the parser's dest, or the global's name
    option: str  # how the command line spells it: `--gradient_accumulation_steps`
    value: Any
    default: Any
    source: str  # "argparse" | "configurator"

    @property
    def changed(self) -> bool:
        return not _same(self.value, self.default)

    def given(self) -> str:
        """`--gradient_accumulation_steps 4`, `--fp16`, `--dtype=float16` (the configurator's)."""
        if isinstance(self.value, bool) and isinstance(self.default, bool):
            return self.option if self.value else f"no {self.option}"
        joiner = "=" if self.source == "configurator" else " "
        return f"{self.option}{joiner}{_text(self.value)}"

    def default_text(self) -> str:
        if isinstance(self.value, bool) and isinstance(self.default, bool):
            return f"default {'on' if self.default else 'off'}"
        return f"default {_text(self.default)}"

    def row(self) -> dict:
        row = asdict(self)
        row["value"], row["default"] = _jsonable(self.value), _jsonable(self.default)
        row["changed"] = self.changed
        return row


_lock = threading.Lock()
_settings: dict[tuple[str, str], Setting] = {}
_configurator_read = False


def install() -> None:
    """Observe every argparse parse from now on (idempotent per install)."""
    current = argparse.ArgumentParser.parse_known_args
    if getattr(current, "__guard_original__", None) is not None:
        return
    _patch.patch(argparse.ArgumentParser, "parse_known_args", _observing(current))


def _observing(original):
    @_patch.wraps_original(original)
    def parse_known_args(self, args=None, namespace=None):
        result = original(self, args, namespace)
        try:
            _record_parse(self, result[0])
        except Exception:  # noqa: BLE001 - observing must never break the user's parse
            pass
        return result

    return parse_known_args


def _record_parse(parser: argparse.ArgumentParser, namespace: Any) -> None:
    values = vars(namespace) if hasattr(namespace, "__dict__") else {}
    for action in getattr(parser, "_actions", ()):
        dest = getattr(action, "dest", None)
        if not dest or dest == argparse.SUPPRESS or dest not in values:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        options = [o for o in action.option_strings if o.startswith("--")]
        option = options[0] if options else (action.option_strings or [dest])[0]
        _add(Setting(dest, option, values[dest], _parsed_default(parser, action), "argparse"))


def _parsed_default(parser: argparse.ArgumentParser, action: argparse.Action) -> Any:
    """The value the option takes when it is not given: argparse converts a string default
    through the option's `type`, as it does at parse time."""
    default = parser.get_default(action.dest)
    if isinstance(default, str) and getattr(action, "type", None) in (int, float):
        try:  # only the builtin numbers: another `type=` (argparse.FileType) may act
            return action.type(default)
        except ValueError:  # a default the type rejects stays as written
            return default
    return default


def _add(setting: Setting) -> None:
    with _lock:
        if len(_settings) < _MAX_SETTINGS or (setting.source, setting.name) in _settings:
            _settings[(setting.source, setting.name)] = setting


def settings() -> list[Setting]:
    """Every setting seen so far (argparse parses, then nanoGPT configurator overrides)."""
    _read_configurator()
    with _lock:
        return list(_settings.values())


def rows() -> list[dict]:
    """The run report's `settings`: each with its value, its default and whether it changed."""
    return [s.row() for s in settings()]


def reset() -> None:
    global _configurator_read
    with _lock:
        _settings.clear()
        _causes.clear()
        _configurator_read = False


# nanoGPT's configurator ---------------------------------------------------------------------
def _read_configurator() -> None:
    """`--key=value` on the command line for a global `key` of `__main__` that its source
    assigns a literal at module level: nanoGPT's `exec(open('configurator.py').read())` set it
    (the global now holds the override; the source holds the default)."""
    global _configurator_read
    if _configurator_read:
        return
    _configurator_read = True
    main = sys.modules.get("__main__")
    overrides = [a[2:].partition("=") for a in sys.argv[1:] if a.startswith("--") and "=" in a]
    if main is None or not overrides:
        return
    defaults = _module_literals(getattr(main, "__file__", None))
    for key, _, text in overrides:
        if key in defaults and hasattr(main, key) and ("argparse", key) not in _settings:
            _add(Setting(key, f"--{key}", _configured(text), defaults[key], "configurator"))


def _configured(text: str) -> Any:
    """The value as nanoGPT's configurator reads it (`literal_eval`, else the string): the
    command line's, not the global's now (`gradient_accumulation_steps //= world_size`)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _module_literals(path: str | None) -> dict[str, Any]:
    """The first literal each module-level name of a script is assigned."""
    if not path or not path.endswith(".py"):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id not in found:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
    return found


# what a finding says -----------------------------------------------------------------------
_causes: dict[str, tuple[tuple, list]] = {}  # code -> (what was seen, causes)


def causes(code: str) -> list[Setting]:
    """The non-default settings of this run under which a finding of `code` bites (cached
    until the next parse or engine)."""
    if code not in K_CODES and code not in PRECISION_CODES:
        return []
    _read_configurator()
    engine = _engine_settings()
    seen = (len(_settings), engine.get("k"), engine.get("precision"))
    cached = _causes.get(code)
    if cached is None or cached[0] != seen:
        cached = _causes[code] = (seen, _find_causes(code, engine))
    return cached[1]


def _find_causes(code: str, engine: dict) -> list[Setting]:
    """The non-default settings of this run under which a finding of `code` bites: the
    accumulation count for the accumulation rules, the precision for the precision rules
    (the value an Accelerator was built with, where there is one and it disagrees, is not)."""
    found = []
    for s in settings():
        if not s.changed:
            continue
        if code in K_CODES and _K_NAME.search(s.name) and _is_k(s.value):
            if engine.get("k") in (None, s.value):
                found.append(s)
        elif code in PRECISION_CODES and _PRECISION_NAME.search(s.name):
            precision = engine.get("precision")
            if precision is None or _text(s.value) == precision or isinstance(s.value, bool):
                found.append(s)
    return found


def with_cause(code: str, message: str) -> str:
    """The message, saying which of this run's settings makes the finding real (before the
    fix, which the `help:` line shows)."""
    found = causes(code)
    if not found:
        return message
    from guard import _voice

    problem, fix = _voice.split_fix(code, message)
    sets = " and ".join(f"`{s.given()}` ({s.default_text()})" for s in found)
    which = "the setting" if len(found) == 1 else "the settings"
    note = f"; this run sets {sets}, {which} under which it bites"
    return problem + note + (f"; {fix}" if fix else "")


def _engine_settings() -> dict:
    """The accumulation count and precision of the latest Accelerator or guard engine."""
    tracker = sys.modules.get("guard._tracker")
    owner = None
    if tracker is not None:
        try:
            owner = tracker.TRACKER.accelerator()
        except Exception:  # noqa: BLE001 - no engine known: nothing to compare with
            owner = None
    if owner is None:
        return {}
    k = getattr(owner, "gradient_accumulation_steps", None)
    precision = getattr(owner, "mixed_precision", None)
    precision = getattr(precision, "value", precision)
    return {"k": k if isinstance(k, int) else None, "precision": precision and str(precision)}


def _is_k(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


def _same(a: Any, b: Any) -> bool:
    """Equal values (`--lr 1` is the default 1.0), but a flag is no number."""
    try:
        return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)
    except Exception:  # noqa: BLE001 - an exotic value (a tensor): the same object only
        return a is b


def _text(value: Any) -> str:
    return str(value)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)
