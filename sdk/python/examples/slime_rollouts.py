"""A slime-style rollout loop on Brig: each rollout gets a sandbox and an
`exec(cmd) -> (code, stdout, stderr)` function; 64 rollouts run at once from one event loop.

    BRIG_STATE_DIR=... python slime_rollouts.py [N]
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

import brig

Exec = Callable[[str], Awaitable[tuple[int, str, str]]]


def executor(sb: brig.AsyncSandbox) -> Exec:
    async def run(cmd: str) -> tuple[int, str, str]:
        r = await sb.exec(cmd, timeout=60)
        return (r.exit_code if r.exit_code is not None else -1), r.stdout_text, r.stderr_text

    return run


async def rollout(i: int, run: Exec) -> float:
    """A toy agent: three steps of tool use, then a check."""
    await run(f"mkdir -p /work && echo {i} > /work/seed")
    code, out, _ = await run("cat /work/seed | awk '{print $1 * 2}'")
    await run(f"echo {out.strip()} > /work/answer")
    code, out, _ = await run("cat /work/answer")
    return 1.0 if code == 0 and out.strip() == str(i * 2) else 0.0


async def main(n: int) -> None:
    client = await brig.AsyncClient.connect_local()
    started = time.perf_counter()
    sandboxes = await client.create_many(n, image="busybox", labels={"job": "slime-demo"}, concurrency=16)
    try:
        rewards = await asyncio.gather(*[rollout(i, executor(sb)) for i, sb in enumerate(sandboxes)])
    finally:
        await client.destroy({"job": "slime-demo"})
    print(f"{n} rollouts, mean reward {sum(rewards) / n:.2f}, {time.perf_counter() - started:.2f} s")
    assert sum(rewards) == n


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 64))
