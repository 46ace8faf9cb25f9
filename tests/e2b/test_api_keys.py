"""API keys in E2B's format: brigd's tokens are `e2b_` and hex, the format E2B's SDKs check
on the client (2.45.1 refuses any other key before a request; `E2B_VALIDATE_API_KEY`). The
same secret without the prefix is the same key to brigd; a key of the right format that brigd
did not issue is refused (401). Runs with the newest pinned SDK and the oldest supported one."""

import importlib.metadata
import os
import re

import httpx
import pytest
from e2b import AsyncSandbox


def _validates_keys():
    """Whether this release checks keys on the client (2.45.1 does; 2.63.0 does not)."""
    from e2b.connection_config import ConnectionConfig

    return hasattr(ConnectionConfig, "_validate_api_key")


async def test_brigds_key_is_in_e2b_format_and_opens_a_sandbox():
    key = os.environ["E2B_API_KEY"]
    assert re.fullmatch(r"e2b_[0-9a-f]{64}", key), "brigd's token is an E2B API key"
    sb = await AsyncSandbox.create(timeout=60)
    try:
        assert (await sb.commands.run("echo keyed")).stdout == "keyed\n"
    finally:
        await sb.kill()


async def test_the_bare_secret_is_the_same_key_and_a_stranger_is_refused():
    url, key = os.environ["E2B_API_URL"], os.environ["E2B_API_KEY"]
    async with httpx.AsyncClient(timeout=30) as c:
        for accepted in [key, key.removeprefix("e2b_")]:
            r = await c.get(f"{url}/v2/sandboxes", headers={"X-API-Key": accepted})
            assert r.status_code == 200, (r.status_code, r.text)
        r = await c.get(f"{url}/v2/sandboxes", headers={"X-API-Key": "e2b_" + "0" * 64})
        assert r.status_code == 401, (r.status_code, r.text)


async def test_an_sdk_that_validates_keys_takes_brigds_and_refuses_another_format():
    version = importlib.metadata.version("e2b")
    if not _validates_keys():
        pytest.skip(f"e2b {version} does not check keys on the client")
    key = os.environ["E2B_API_KEY"]
    from e2b import AuthenticationException

    with pytest.raises(AuthenticationException) as refused:
        await AsyncSandbox.list(api_key=key.removeprefix("e2b_")).next_items()
    assert "Invalid API key format" in str(refused.value), refused.value
    listed = await AsyncSandbox.list(api_key=key).next_items()
    assert isinstance(listed, list)
