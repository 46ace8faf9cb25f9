"""The E2B half of `brig-bench e2b`: E2B's own Python SDK (unchanged) against brigd's
E2B-compatible API. Prints one JSON line: create→first command latencies (ms) and commands/s
with N concurrent sandboxes. Usage: e2b_measure.py SAMPLES CONCURRENCY SECONDS."""

import asyncio
import json
import sys
import time

from e2b import AsyncSandbox


async def main(samples: int, concurrency: int, seconds: float) -> None:
    for _ in range(3):  # warm up: layer mounts, the gateway's connection, page cache
        sb = await AsyncSandbox.create(timeout=300)
        await sb.commands.run("true")
        await sb.kill()
    latencies = []
    for _ in range(samples):
        started = time.perf_counter()
        sb = await AsyncSandbox.create(timeout=300)
        await sb.commands.run("true")
        latencies.append((time.perf_counter() - started) * 1000)
        await sb.kill()
    sandboxes = await asyncio.gather(*[AsyncSandbox.create(timeout=600) for _ in range(concurrency)])
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(sb):
        nonlocal done
        while time.perf_counter() < deadline:
            await sb.commands.run("true")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*[worker(s) for s in sandboxes])
    elapsed = time.perf_counter() - started
    await asyncio.gather(*[s.kill() for s in sandboxes])
    print(json.dumps({"latencies_ms": latencies, "commands": done, "elapsed_s": elapsed}))


if __name__ == "__main__":
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../tests/e2b"))
    from clean_exit import exit_now

    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
    exit_now(0)
