"""E2B's debug layout (`E2B_DEBUG=true`): the SDK talks to the API on localhost:3000 and to envd
on localhost:49983 and creates nothing itself; every call goes to its one `debug_sandbox_id`.
Run only by `tests/tests/e2b.rs` against a daemon serving those two ports."""

import os

import pytest
from e2b import AsyncSandbox

pytestmark = pytest.mark.skipif(os.environ.get("E2B_DEBUG") != "true", reason="needs the debug layout")


async def test_the_debug_layout_serves_one_sandbox():
    sb = await AsyncSandbox.create()
    assert sb.sandbox_id == "debug_sandbox_id"
    r = await sb.commands.run("echo debug; whoami")
    assert r.stdout == "debug\nuser\n"
    await sb.files.write("/home/user/debug.txt", "kept")
    again = await AsyncSandbox.connect("debug_sandbox_id")
    assert await again.files.read("/home/user/debug.txt") == "kept"
    info = await sb.get_info()
    assert info.template_id == "base"
