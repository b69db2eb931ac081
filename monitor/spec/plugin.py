"""The pytest plugin (entry point `pytest11: flopwatch`): recordings tested with plain pytest.

* every `*.flopwatch.yaml` file is collected as one test item, run as `flopwatch test`
  runs it (a failure shows the same diff);
* the `flopwatch_replay` fixture replays a recording or a scenario and returns a
  `Replay` with the alerts and helpers to assert on them.

It loads nothing heavy at start-up: the replay machinery is imported when a spec or
the fixture first runs, so installing flopwatch costs other test suites nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from monitor.spec.runner import Incident, Replayed
    from monitor.wire import Alert

SUFFIX = ".flopwatch.yaml"


class SpecFailed(AssertionError):
    """A spec whose expectations were not met; the message is the report."""


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """`*.flopwatch.yaml` files are spec files."""
    if file_path.name.endswith(SUFFIX):
        spec_file: SpecFile = SpecFile.from_parent(parent, path=file_path)
        return spec_file
    return None


class SpecFile(pytest.File):
    """A spec file: one item, since every expectation judges the same replay."""

    def collect(self) -> list[pytest.Item]:
        """The spec as one test item."""
        return [SpecItem.from_parent(self, name=self.path.name.removesuffix(SUFFIX))]


class SpecItem(pytest.Item):
    """Replays the spec's input and checks every expectation."""

    def runtest(self) -> None:
        """Run as `flopwatch test` would; fail with its report."""
        from monitor.config import load_settings  # noqa: PLC0415 - lazy, see module doc
        from monitor.errors import UsageError  # noqa: PLC0415
        from monitor.spec.runner import prepare, report, run_spec  # noqa: PLC0415

        try:
            result = run_spec(prepare(self.path, load_settings()))
        except UsageError as exc:
            raise SpecFailed(str(exc)) from None
        if not result.ok:
            raise SpecFailed(report(result))

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        """The report, not a traceback into flopwatch."""
        if isinstance(excinfo.value, SpecFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        """Where the item comes from, for the test summary."""
        return self.path, 0, f"flopwatch spec {self.name}"


@dataclass
class Replay:
    """The alerts a replay produced, with helpers that judge them as a spec would."""

    replayed: Replayed
    _claimed: set[str] = field(default_factory=set)

    @property
    def alerts(self) -> list[Alert]:
        """Every alert record, in the order the sinks got them."""
        return self.replayed.alerts

    @property
    def incidents(self) -> list[Incident]:
        """Alert records grouped by incident id."""
        from monitor.spec.runner import incidents  # noqa: PLC0415

        return incidents(self.replayed.alerts)

    def assert_pages(self, **fields: Any) -> Incident:
        """The incident matching `fields` (a spec's `alerts:` entry as keywords); fails
        with the spec diff. Each incident is claimed by at most one call."""
        from monitor.spec.runner import expect  # noqa: PLC0415
        from monitor.spec.schema import ExpectAlert  # noqa: PLC0415

        exp = _convert(fields, ExpectAlert)
        before = set(self._claimed)
        outcome = expect(exp, 0, self.replayed, self.incidents, self._claimed)
        if not outcome.ok:
            raise AssertionError(f"{outcome.name}: {outcome.detail}")
        (claimed,) = self._claimed - before
        return next(inc for inc in self.incidents if inc.id == claimed)

    def assert_quiet(self, **fields: Any) -> None:
        """No incident detected in the interval (`from_`, `to`, `pool`, `severity`, as a
        spec's `quiet:` entry)."""
        from monitor.spec.runner import quiet  # noqa: PLC0415
        from monitor.spec.schema import Quiet  # noqa: PLC0415

        if "from_" in fields:
            fields["from"] = fields.pop("from_")
        outcome = quiet(_convert(fields, Quiet), 0, self.replayed)
        if not outcome.ok:
            raise AssertionError(f"{outcome.name}: {outcome.detail}")


def _convert(fields: dict[str, Any], kind: Any) -> Any:
    """Keywords checked like a spec's YAML: a misspelt one is a TypeError naming it."""
    from monitor.spec.schema import spec_reason  # noqa: PLC0415

    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise TypeError(spec_reason(exc)) from None


@pytest.fixture
def flopwatch_replay(request: pytest.FixtureRequest) -> Callable[..., Replay]:
    """`flopwatch_replay(recording=None, *, scenario=None, seed=0, devices=None,
    duration=None, window="10s", batch_size=None, config=None) -> Replay`: replay a
    recording (a path relative to the test file) or a simulated scenario, as
    `flopwatch replay` would, with `config` merged onto the settings."""

    def run(recording: str | Path | None = None, *, config: dict[str, Any] | None = None,
            **inp: Any) -> Replay:  # fmt: skip
        import asyncio  # noqa: PLC0415

        from monitor.config import load_settings  # noqa: PLC0415
        from monitor.spec.runner import prepare_spec, replay_prepared  # noqa: PLC0415
        from monitor.spec.schema import Spec, check_spec  # noqa: PLC0415

        if recording is not None:
            inp["recording"] = str(recording)
        spec = _convert({"input": inp, "config": config or {}}, Spec)
        where = Path(request.path)
        check_spec(spec, str(where))
        prepared = prepare_spec(spec, where, load_settings())
        return Replay(asyncio.run(replay_prepared(prepared)))

    return run
