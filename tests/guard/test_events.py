"""The event contract (guard/events.py) holds: every emit passes its payload's fields, every event
has a subscriber, and `subscribe` refuses names and parameters the contract does not have."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch  # noqa: F401  (before guard's modules: importing torch installs the guard)

from guard import events
from guard._tracker import Tracker
from guard.events import Event

GUARD = Path(events.__file__).parent


def _calls(method: str) -> list[tuple[str, ast.Call]]:
    found = []
    for path in sorted(GUARD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == method
                and node.args
            ):
                found.append((f"{path.relative_to(GUARD.parent)}:{node.lineno}", node))
    return found


def _event_of(node: ast.expr) -> Event | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return Event(node.value)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "Event":
            return Event[node.attr]
    return None


def test_every_emit_passes_exactly_its_payload_fields():
    emits = [(where, call, _event_of(call.args[0])) for where, call in _calls("emit")]
    assert emits and all(event is not None for _, _, event in emits)
    for where, call, event in emits:
        passed = {k.arg for k in call.keywords}
        assert passed == set(events.fields(event)), where


def test_every_event_has_a_subscriber_and_an_emitter():
    emitted = {_event_of(call.args[0]) for _, call in _calls("emit")}
    subscribed = {_event_of(call.args[0]) for _, call in _calls("subscribe")}
    assert set(Event) <= emitted
    assert set(Event) <= subscribed
    assert set(events.PAYLOADS) == set(Event)


def test_an_unknown_event_is_refused():
    with pytest.raises(ValueError, match="unknown event 'optimiser_step'"):
        Tracker().subscribe("optimiser_step", lambda **_: None)


def test_a_subscriber_asking_for_a_field_its_event_lacks_is_refused():
    def before_step(optimizer, scaler, **_) -> None:  # the scaler is the scaler events' field
        pass

    with pytest.raises(TypeError, match="asks for scaler"):
        Tracker().subscribe("optimizer_step_pre", before_step)


def test_a_member_and_its_name_are_the_same_subscription():
    tracker, calls = Tracker(), []
    tracker.subscribe(Event.FINISH, lambda: calls.append("member"))
    tracker.subscribe("finish", lambda: calls.append("name"))
    tracker.emit("finish")
    tracker.emit(Event.FINISH)
    assert calls == ["member", "name", "member", "name"]
