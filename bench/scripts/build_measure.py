"""The E2B half of `brig-bench build`: `run_code` latency of `x + 1` in a warm context through
the real `e2b-code-interpreter` package, and small HTTP requests/s to a server in a sandbox
through the gateway's port route against the same server reached from the node directly (the
sandbox's own address). Prints one JSON line. Usage: build_measure.py RUNS SECONDS CONCURRENCY."""

import asyncio
import json
import sys
import time

import httpx
from e2b import AsyncSandbox as PlainSandbox
from e2b_code_interpreter import AsyncSandbox

SERVER = r'''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        # One write for the whole answer (separate writes meet Nagle and delayed ACKs).
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
'''

ADDRESS = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('10.255.255.1', 1)); print(s.getsockname()[0])"


async def run_code(runs):
    started = time.perf_counter()
    sb = await AsyncSandbox.create(timeout=900, request_timeout=900)
    first_create_s = time.perf_counter() - started
    try:
        await sb.run_code("x = 1")
        for _ in range(10):
            await sb.run_code("x + 1")
        latencies = []
        for _ in range(runs):
            t = time.perf_counter()
            result = await sb.run_code("x + 1")
            latencies.append((time.perf_counter() - t) * 1000)
            assert result.text == "2", result
        return latencies, first_create_s
    finally:
        await sb.kill()


async def rate(url, headers, seconds, concurrency):
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker():
        nonlocal done
        async with httpx.AsyncClient(timeout=30) as c:
            while time.perf_counter() < deadline:
                r = await c.get(url, headers=headers)
                assert r.status_code == 200, r.text
                done += 1

    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return done / (time.perf_counter() - started)


async def ports(api_url, seconds, concurrency):
    sb = await PlainSandbox.create(timeout=600)
    try:
        await sb.files.write("/tmp/server.py", SERVER)
        await sb.commands.run("python3 /tmp/server.py", background=True)
        address = (await sb.commands.run(f'python3 -c "{ADDRESS}"')).stdout.strip()
        host = {"Host": sb.get_host(8000)}
        for _ in range(100):
            async with httpx.AsyncClient() as c:
                if (await c.get(api_url, headers=host)).status_code == 200:
                    break
            await asyncio.sleep(0.1)
        proxied = await rate(api_url + "/", host, seconds, concurrency)
        try:
            direct = await rate(f"http://{address}:8000/", {}, seconds, concurrency)
        except Exception as e:  # the node cannot reach the sandbox's address
            print(f"direct: {e}", file=sys.stderr)
            direct = None
        return proxied, direct
    finally:
        await sb.kill()


async def main(runs, seconds, concurrency):
    import os

    latencies, first_create_s = await run_code(runs)
    proxied, direct = await ports(os.environ["E2B_API_URL"], seconds, concurrency)
    print(json.dumps({
        "run_code_ms": latencies,
        "first_create_s": first_create_s,
        "port_proxy_rps": proxied,
        "direct_rps": direct,
    }))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
