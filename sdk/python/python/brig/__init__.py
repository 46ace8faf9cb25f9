"""Brig for Python: sandboxes for RL rollouts, native over QUIC.

    import asyncio, brig

    async def main():
        client = await brig.AsyncClient.connect_local()
        sb = await client.create(image="debian-12", labels={"task": "t1"})
        result = await sb.exec("python3 -c 'print(6 * 7)'")
        print(result.exit_code, result.stdout_text)
        await sb.destroy()

    asyncio.run(main())

`AsyncClient` and `AsyncSandbox` are the Rust SDK (brig-sdk) itself, bridged to asyncio;
`Client` is a thin synchronous wrapper. Errors are `brig.errors` exceptions."""

from ._native import (
    AsyncClient,
    AsyncSandbox,
    AuditStream,
    CallResult,
    ExecResult,
    ExecStream,
    Session,
    __version__,
)
from . import _native
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors
from .records import *  # noqa: F401,F403
from .records import __all__ as _records
from .sync import Client

import atexit as _atexit
import collections.abc as _abc

# Every async method returns a `_native.Coroutine`: a coroutine to asyncio (`create_task`,
# `TaskGroup`, `gather`, `wait_for`) as an `async def`'s is.
_abc.Coroutine.register(_native.Coroutine)

# No result may reach Python once it finalizes (see src/bridge.rs).
_atexit.register(_native._shutdown)

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "AuditStream",
    "CallResult",
    "Client",
    "ExecResult",
    "ExecStream",
    "Session",
    "__version__",
    *_errors,
    *_records,
]
