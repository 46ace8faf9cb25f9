"""The native bridge where its runtime cannot start (no threads left to the process): a call
raises RuntimeError naming why, and the process goes on; never a Rust panic."""

import os
import subprocess
import sys
import textwrap

import pytest

import brig

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, resource
    # RLIMIT_NPROC binds a user that is not root: as nobody, no new thread can start.
    os.setgid(65534)
    os.setuid(65534)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    import brig

    async def main():
        for _ in range(2):
            try:
                await brig.AsyncClient.connect("127.0.0.1:1", "00" * 32, "token")
            except RuntimeError as e:
                print("RuntimeError:", e)

    asyncio.run(main())
    print("the process goes on")
    """
)


# The system's interpreter, which any user may run (the suite's may live in root's home), with
# this package on its path.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="needs root to become another user, and the system's python3",
)
def test_a_runtime_that_cannot_start_is_a_runtime_error_not_a_panic():
    package_root = os.path.dirname(os.path.dirname(brig.__file__))
    env = {"PYTHONPATH": package_root, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd="/", env=env
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert out.count("RuntimeError: cannot start the tokio runtime") == 2, out + done.stderr
    assert "the process goes on" in out
    assert "panicked" not in done.stderr, done.stderr
