"""A sandbox's own ports through the gateway, as E2B's SDK reaches them: the host
`sandbox.get_host(port)` gives, and the `E2b-Sandbox-Id`/`E2b-Sandbox-Port` header pair;
HTTP/1.1 and HTTP/2 clients, request and response bodies streamed, an upgraded connection
carried both ways, a WebSocket (RFC 6455, the `websockets` package as the client), 502 for a port nothing listens on (never the host's own port), 404 for a
sandbox that is not there."""

import asyncio
import os
import socket
from urllib.parse import urlparse

import httpx

SERVER = r'''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade") == "echo":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                data = self.connection.recv(65536)
                if not data:
                    return
                self.connection.sendall(data.upper())
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                chunk = f"part{i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        body = f"hello {self.headers.get('Host')} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[::-1])
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
'''


async def _serve(sandbox, url, host):
    await sandbox.files.write("/tmp/server.py", SERVER)
    await sandbox.commands.run("python3 /tmp/server.py", background=True)
    async with httpx.AsyncClient() as c:
        for _ in range(100):
            r = await c.get(f"{url}/ready", headers={"Host": host})
            if r.status_code == 200:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the server never answered: {r.status_code} {r.text}")


async def test_a_sandbox_port_is_reached_by_host_and_by_headers(sandbox):
    url = os.environ["E2B_API_URL"]
    host = sandbox.get_host(8000)
    assert host.startswith(f"8000-{sandbox.sandbox_id}.")
    await _serve(sandbox, url, host)
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.get(f"{url}/x?y=1", headers={"Host": host})
        assert (r.status_code, r.text) == (200, f"hello {host} /x?y=1\n")
        by_headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
        r = await c.get(f"{url}/h", headers=by_headers)
        assert r.status_code == 200 and r.text.endswith(" /h\n"), r.text
        big = os.urandom(1 << 20)
        r = await c.post(f"{url}/echo", headers={"Host": host}, content=big)
        assert r.content == big[::-1], "a 1 MiB body both ways"
        async with c.stream("GET", f"{url}/stream", headers={"Host": host}) as s:
            parts = [line async for line in s.aiter_lines()]
        assert parts == [f"part{i}" for i in range(5)]
        r = await c.get(f"{url}/", headers={"Host": sandbox.get_host(8001)})
        assert r.status_code == 502, r.text
        r = await c.get(f"{url}/", headers={"Host": "8000-sb-00000000-0000000000000000.e2b.app"})
        assert r.status_code == 404, r.text
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2:
        r = await h2.get(f"{url}/over-h2", headers={"Host": host})
        assert r.http_version == "HTTP/2" and r.status_code == 200, r
        assert r.text.endswith(" /over-h2\n"), r.text


async def test_an_upgraded_connection_is_carried_both_ways(sandbox):
    url = os.environ["E2B_API_URL"]
    host = sandbox.get_host(8000)
    await _serve(sandbox, url, host)
    target = urlparse(url)
    reader, writer = await asyncio.open_connection(target.hostname, target.port)
    writer.write(
        f"GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 101"), head
    for word in [b"ping", b"more"]:
        writer.write(word)
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(len(word)), 30) == word.upper()
    writer.close()


WS_SERVER = r'''
import base64, hashlib, socket, struct, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    data = b""
    while b"\r\n\r\n" not in data:
        more = c.recv(4096)
        if not more:
            return
        data += more
    head, buf = data.split(b"\r\n\r\n", 1)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    def need(n):
        nonlocal buf
        while len(buf) < n:
            more = c.recv(1 << 16)
            if not more:
                raise EOFError
            buf += more
        out, buf = buf[:n], buf[n:]
        return out
    while True:
        b0, b1 = need(2)
        op, n = b0 & 0x0F, b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", need(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", need(8))[0]
        mask = need(4) if b1 & 0x80 else b"\0\0\0\0"
        body = bytes(x ^ mask[i % 4] for i, x in enumerate(need(n)))
        if op == 8:
            c.sendall(bytes([0x88, len(body)]) + body)
            return
        reply, op = {1: (body.upper(), 1), 2: (body[::-1], 2), 9: (body, 10)}[op]
        size = len(reply)
        if size < 126:
            head = bytes([0x80 | op, size])
        elif size < 65536:
            head = bytes([0x80 | op, 126]) + struct.pack(">H", size)
        else:
            head = bytes([0x80 | op, 127]) + struct.pack(">Q", size)
        c.sendall(head + reply)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8010))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''


async def test_a_websocket_is_carried_by_host_and_by_headers(sandbox):
    """RFC 6455 through the port route, with the `websockets` package from PyPI as the client
    (it checks the handshake's accept key and every frame): text, a 1 MiB binary message,
    ping/pong and a clean close, reached by `get_host(port)` and by the header pair."""
    from websockets.asyncio.client import connect

    url = urlparse(os.environ["E2B_API_URL"])
    await sandbox.files.write("/tmp/ws.py", WS_SERVER)
    await sandbox.commands.run("python3 /tmp/ws.py", background=True)
    await sandbox.commands.run(
        "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8010))' "
        "2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    )
    by_host = connect(
        f"ws://{sandbox.get_host(8010)}/ws", host=url.hostname, port=url.port, max_size=4 << 20
    )
    by_headers = connect(
        f"ws://{url.hostname}:{url.port}/ws",
        additional_headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8010"},
        max_size=4 << 20,
    )
    for opening in [by_host, by_headers]:
        async with asyncio.timeout(60):
            async with opening as ws:
                await ws.send("hello")
                assert await ws.recv() == "HELLO"
                big = os.urandom(1 << 20)
                await ws.send(big)
                assert await ws.recv() == big[::-1]
                await (await ws.ping(b"beat"))
            assert ws.close_code == 1000, ws.close_code


async def test_a_port_of_the_host_is_never_reached(sandbox):
    url = os.environ["E2B_API_URL"]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(f"{url}/", headers={"Host": sandbox.get_host(port)})
        assert r.status_code == 502, (r.status_code, r.text)
    finally:
        listener.close()


async def test_a_private_sandbox_port_takes_its_traffic_token():
    from e2b import AsyncSandbox

    sb = await AsyncSandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        token = sb.traffic_access_token
        assert token, "a private sandbox has a traffic access token"
        url = os.environ["E2B_API_URL"]
        host = sb.get_host(8000)
        await sb.files.write("/tmp/server.py", SERVER)
        await sb.commands.run("python3 /tmp/server.py", background=True)
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(f"{url}/", headers={"Host": host})
            assert r.status_code == 403, r.text
            r = await c.get(f"{url}/", headers={"Host": host, "e2b-traffic-access-token": "x" * 64})
            assert r.status_code == 403, r.text
            for _ in range(100):
                r = await c.get(f"{url}/", headers={"Host": host, "e2b-traffic-access-token": token})
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert r.status_code == 200, r.text
    finally:
        await sb.kill()
