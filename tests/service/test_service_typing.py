"""The calls made from the record builders (`service.calls.command`) keep their typed
signatures: for mypy, whose `reveal_type` of each call must show the builder's parameters
with the call's return type (a `Result`, or a coroutine of one for the `_async` twin), and
at run time, where `inspect.signature` and the docstring are the call's own, on the class
(with `self`) and on an instance of either facade.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from nereus.adapters.kafka.library import KafkaNereus
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.records import Appendable
from nereus.service.arguments import cancel_record, reschedule_record, schedule_record
from nereus.service.calls import TimerCalls

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """\
from nereus import KafkaNereus, Nereus

def main(n: Nereus, k: KafkaNereus) -> None:
    reveal_type(n.schedule)
    reveal_type(n.schedule_async)
    reveal_type(n.reschedule)
    reveal_type(n.cancel_async)
    reveal_type(k.cancel)
"""

# What each line must reveal (the parameters as written in service/arguments.py).
SCHEDULE_PARAMETERS = (
    "queue: str, timer_key: str, payload: bytes | bytearray"
    " | memoryview, *, delay_ms: int | datetime.timedelta | None =,"
    " deliver_at_ms: int | datetime.datetime | None =, expire_at_ms: int |"
    " datetime.datetime | None =, lifetime_ms: int | datetime.timedelta | None =,"
    " txn: str | None =, partition: str | None =, headers:"
    " typing.Sequence[tuple[str, str]] | typing.Mapping[str,"
    " str] =, expected_version: int | None =, tenant: str =,"
    " producer_sub: str | None =, encrypted: bool ="
)
RESULT = "nereus.service.results.Result"
CANCEL_PARAMETERS = (
    "queue: str, timer_key: str, *, txn: str | None =,"
    " expected_version: int | None =, tenant: str ="
)


def _revealed(tmp_path: Path) -> list[str]:
    name = f"reveal_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PROGRAM)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            str(tmp_path / f"{name}.py"),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    notes = re.findall(r'note: Revealed type is "(.*)"', done.stdout)
    assert len(notes) == 5, done.stdout + done.stderr
    # Spelled alike by mypy versions that qualify builtins and parametrize memoryview or not.
    return [
        note.replace("builtins.", "").replace("memoryview[int]", "memoryview") for note in notes
    ]


def test_mypy_sees_the_builders_parameters_and_the_calls_return_types(tmp_path: Path) -> None:
    schedule, schedule_async, reschedule, cancel_async, kafka_cancel = _revealed(tmp_path)
    assert schedule == f"def ({SCHEDULE_PARAMETERS}) -> {RESULT}"
    assert schedule_async == (
        f"def ({SCHEDULE_PARAMETERS}) -> typing.Coroutine[Any, Any, {RESULT}]"
    )
    assert reschedule.startswith("def (queue: str, timer_key: str, *, ")
    assert reschedule.endswith(f"tenant: str =) -> {RESULT}")
    assert "payload" not in reschedule
    assert cancel_async == f"def ({CANCEL_PARAMETERS}) -> typing.Coroutine[Any, Any, {RESULT}]"
    assert kafka_cancel == f"def ({CANCEL_PARAMETERS}) -> {RESULT}"


def test_the_calls_carry_their_builders_signatures_and_their_own_docstrings() -> None:
    builders: dict[str, Callable[..., Appendable]] = {
        "schedule": schedule_record,
        "reschedule": reschedule_record,
        "cancel": cancel_record,
    }
    for name, build in builders.items():
        parameters = list(inspect.signature(build).parameters)
        for call in (name, f"{name}_async"):
            on_class = inspect.signature(getattr(TimerCalls, call))
            assert list(on_class.parameters) == ["self", *parameters], call
            assert on_class.return_annotation == "Result"
            for facade in (Nereus, KafkaNereus):
                assert getattr(facade, call).__doc__ == getattr(TimerCalls, call).__doc__
        sync_doc = getattr(TimerCalls, name).__doc__
        assert sync_doc and sync_doc != build.__doc__
        assert getattr(TimerCalls, f"{name}_async").__doc__.startswith(f"`{name}`, awaited")
        assert inspect.iscoroutinefunction(getattr(TimerCalls, f"{name}_async"))
        assert not inspect.iscoroutinefunction(getattr(TimerCalls, name))


def test_a_bound_call_has_the_builders_parameters_without_self(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path)) as n:
        bound = inspect.signature(n.schedule)
        assert list(bound.parameters) == list(inspect.signature(schedule_record).parameters)
        assert n.schedule.__name__ == "schedule"
        assert n.cancel_async.__qualname__ == "TimerCalls.cancel_async"


def test_a_wrong_call_fails_naming_the_call_not_its_builder(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path)) as n:
        with pytest.raises(TypeError, match=r"^TimerCalls\.schedule\(\) got an unexpected "):
            n.schedule("q", "k", b"x", delay=5)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^TimerCalls\.cancel_async\(\) takes 3 positional"):
            n.cancel_async("q", "k", "txn")  # type: ignore[call-arg, unused-coroutine]
        with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'payload'"):
            n.schedule("q", "k")  # type: ignore[call-arg]
