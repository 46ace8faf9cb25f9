"""The E2B SDK against a real brigd: `tests/tests/e2b.rs` starts the daemon and runs this suite
with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at it (the SDK's own variables)."""

import os

import pytest

from clean_exit import exit_now

_status = {"exit": 0}


def pytest_sessionfinish(session, exitstatus):
    _status["exit"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # After the summary: see clean_exit.py for why the interpreter is not finalized.
    exit_now(_status["exit"])


def pytest_configure(config):
    wanted = ("E2B_API_KEY",) if os.environ.get("E2B_DEBUG") == "true" else ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
    for var in wanted:
        if not os.environ.get(var):
            raise pytest.UsageError(f"{var} is not set: run through `cargo nextest run -p brig-tests -E 'test(e2b)'`")


@pytest.fixture
async def sandbox():
    from e2b import AsyncSandbox

    sb = await AsyncSandbox.create(timeout=600, metadata={"suite": "e2b-python"})
    try:
        yield sb
    finally:
        await sb.kill()
