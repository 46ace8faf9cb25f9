"""The Python half of `brig-bench python`: the `brig` package (release build) against brigd at
$BRIG_STATE_DIR. Prints one JSON line: one-shot `jq` calls/s from N asyncio tasks on one event
loop, and create→first exec latencies (ms). Usage: python_measure.py TASKS SECONDS WARMUP SAMPLES."""

import asyncio
import json
import sys
import time

import brig

INPUT = '{"query":"$.items[?@.ok == true].id","json":{"items":[{"id":1,"ok":true},{"id":2,"ok":false},{"id":3,"ok":true}]}}'
EXPECTED = '{"results":[1,3]}'


async def main(tasks: int, seconds: float, warmup: float, samples: int) -> None:
    client = await brig.AsyncClient.connect_local()
    state = {"measuring": False, "stop": False, "calls": 0, "errors": 0}

    async def worker() -> None:
        while not state["stop"]:
            r = await client.call("jq", INPUT)
            if state["measuring"]:
                if r.output == EXPECTED:
                    state["calls"] += 1
                else:
                    state["errors"] += 1

    workers = [asyncio.ensure_future(worker()) for _ in range(tasks)]
    await asyncio.sleep(warmup)
    state["measuring"] = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    state["measuring"] = False
    elapsed = time.perf_counter() - started
    state["stop"] = True
    await asyncio.gather(*workers)

    for _ in range(3):
        sb = await client.create(image="busybox")
        await sb.exec(["true"])
        await sb.destroy()
    latencies = []
    for _ in range(samples):
        t = time.perf_counter()
        sb = await client.create(image="busybox")
        r = await sb.exec(["true"])
        latencies.append((time.perf_counter() - t) * 1000)
        assert r.ok
        await sb.destroy()
    print(json.dumps({"calls": state["calls"], "errors": state["errors"], "elapsed_s": elapsed, "create_to_exec_ms": latencies}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))
