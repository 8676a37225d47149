"""Test-session policy shared by every test module.

In CI (environment variable CI set) a skipped test fails the run: a check that skips for want of
data, a tool or a package has silently stopped checking anything, and the setup is what must
provide them. Locally, skips stay skips (no network, a package not installed yet, ...).
"""

from __future__ import annotations

import os

import pytest


def _skipped_in_ci(config: pytest.Config) -> int:
    if not os.environ.get("CI"):
        return 0
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return len(reporter.stats.get("skipped", [])) if reporter is not None else 0


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.OK and _skipped_in_ci(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    skipped = _skipped_in_ci(config)
    if skipped:
        terminalreporter.write_sep("=", f"CI: {skipped} skipped test(s) fail the run: in CI every test must run",
                                   red=True)
