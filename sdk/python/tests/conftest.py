"""The Python SDK against a real brigd: `tests/tests/python_sdk.rs` starts the daemon and runs
this suite with BRIG_STATE_DIR pointing at its state directory."""

import os

import pytest

import brig


def pytest_configure(config):
    if not os.environ.get("BRIG_STATE_DIR"):
        raise pytest.UsageError("BRIG_STATE_DIR is not set: run through `cargo nextest run -p brig-tests --test python_sdk`")


@pytest.fixture
async def client():
    c = await brig.AsyncClient.connect_local()
    yield c
    await c.close()


@pytest.fixture
async def box(client):
    """A busybox container, destroyed after the test."""
    sb = await client.create(image="busybox", labels={"suite": "python-sdk"})
    try:
        yield sb
    finally:
        try:
            await sb.destroy()
        except brig.SandboxNotFound:
            pass
