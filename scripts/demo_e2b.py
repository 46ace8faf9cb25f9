"""The demo's E2B part: E2B's own Python SDK, unchanged, against the daemon the demo started
(E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY are set by scripts/demo.sh)."""

import asyncio
import time

from e2b import AsyncSandbox


async def main() -> None:
    started = time.perf_counter()
    sbx = await AsyncSandbox.create(timeout=120, metadata={"demo": "e2b"})
    r = await sbx.commands.run("python3 -c 'import platform; print(platform.platform())'")
    took = (time.perf_counter() - started) * 1000
    await sbx.files.write("/home/user/hello.py", "print('hello from a file')\n")
    out = await sbx.commands.run("python3 hello.py")
    print(f"[demo] e2b SDK: sandbox {sbx.sandbox_id} ran {r.stdout.strip()!r} ({took:.0f} ms create→output)")
    print(f"[demo] e2b SDK: files and commands: {out.stdout.strip()!r}")
    await sbx.kill()


asyncio.run(main())
