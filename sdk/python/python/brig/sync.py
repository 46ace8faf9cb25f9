"""`brig.Client`: the async client, synchronously. A private event loop runs on a daemon
thread; every call is sent to it and waited for. Sandboxes and streams come back wrapped the
same way, so ``Client.connect_local().create(image="debian-12").exec("ls")`` just works."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ._native import AsyncClient


class _Loop:
    """One event loop on one daemon thread, shared by every synchronous object."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="brig-sync", daemon=True).start()
                cls._loop = loop
            return cls._loop


def _run(make: Any) -> Any:
    async def call() -> Any:
        value = make()
        if asyncio.isfuture(value) or asyncio.iscoroutine(value):
            value = await value
        return value

    return _wrap(asyncio.run_coroutine_threadsafe(call(), _Loop.get()).result())


def _wrap(value: Any) -> Any:
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if type(value).__module__ == "brig" and type(value).__name__ in ("AsyncSandbox", "Session", "ExecStream", "AuditStream"):
        return _Sync(value)
    return value


class _Sync:
    """A native object whose awaitable methods are called and waited for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return _run(lambda: attr(*args, **kwargs))

        return call

    def __iter__(self) -> Any:
        aiter = self._inner.__aiter__()
        while True:
            try:
                yield _run(aiter.__anext__)
            except StopAsyncIteration:
                return

    def __repr__(self) -> str:
        return f"sync {self._inner!r}"


class Client(_Sync):
    """Synchronous Brig client: the methods of `AsyncClient`, returning their results."""

    @classmethod
    def connect(cls, addr: str, cert_sha256: str, token: str, replicas: list[tuple[str, str]] | None = None) -> "Client":
        return cls(_run(lambda: AsyncClient.connect(addr, cert_sha256, token, replicas)))

    @classmethod
    def connect_local(cls, state_dir: str | None = None) -> "Client":
        return cls(_run(lambda: AsyncClient.connect_local(state_dir)))

    def __init__(self, inner: Any) -> None:
        super().__init__(inner._inner if isinstance(inner, _Sync) else inner)
