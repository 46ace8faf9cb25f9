"""E2B's lifecycle events API and webhooks, as E2B's docs describe them: events of a sandbox and
of the team (newest first, `orderAsc`, `limit`, `offset`, `types`), webhooks registered with a
secret and delivered with E2B's signature (sha256 of secret + body, base64url without padding),
and receivers that are down or slow do not slow a create."""

import asyncio
import base64
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from e2b import AsyncSandbox

SECRET = "a-webhook-secret-of-some-length-0123456789"


class Receiver:
    """A real HTTP server in the test: records each delivery (headers and body)."""

    def __init__(self, delay=0.0):
        self.deliveries = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if delay:
                    time.sleep(delay)
                receiver.deliveries.append((dict(self.headers.items()), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def events_of(self, sandbox_id):
        return [json.loads(b) for _, b in self.deliveries if json.loads(b)["sandboxId"] == sandbox_id]


def api():
    return httpx.AsyncClient(base_url=os.environ["E2B_API_URL"], headers={"X-API-Key": os.environ["E2B_API_KEY"]})


async def register(http, url, events):
    r = await http.post("/events/webhooks", json={"name": "test", "url": url, "events": events, "signatureSecret": SECRET})
    assert r.status_code == 201, r.text
    return r.json()


async def wait_for(check, seconds=15):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.1)
    return check()


LIFECYCLE = ["sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed", "sandbox.lifecycle.killed"]


async def test_lifecycle_events_are_listed_and_delivered_signed():
    receiver = Receiver()
    async with api() as http:
        hook = await register(http, receiver.url, LIFECYCLE)
        try:
            assert hook["enabled"] is True and hook["events"] == LIFECYCLE and "signatureSecret" not in hook
            sbx = await AsyncSandbox.create(timeout=300, metadata={"run": "events"})
            await sbx.pause()
            await sbx.connect()
            await sbx.kill()
            sid = sbx.sandbox_id

            # The events API: oldest first with orderAsc, newest first by default.
            r = await http.get(f"/events/sandboxes/{sid}", params={"orderAsc": "true"})
            assert r.status_code == 200, r.text
            events = r.json()
            assert [e["type"] for e in events] == LIFECYCLE, events
            first = events[0]
            assert first["sandboxId"] == sid and first["version"] == "v2" and first["eventCategory"] == "lifecycle"
            assert first["eventData"]["sandbox_metadata"] == {"run": "events"}
            killed = events[-1]
            assert killed["eventData"]["execution"]["execution_time"] >= 0
            newest = (await http.get(f"/events/sandboxes/{sid}", params={"limit": 1})).json()
            assert [e["type"] for e in newest] == ["sandbox.lifecycle.killed"]
            second = (await http.get(f"/events/sandboxes/{sid}", params={"limit": 1, "offset": 1, "orderAsc": "true"})).json()
            assert [e["type"] for e in second] == ["sandbox.lifecycle.paused"]
            paused = (await http.get(f"/events/sandboxes/{sid}", params=[("types", "sandbox.lifecycle.paused"), ("types", "sandbox.lifecycle.resumed")])).json()
            assert sorted(e["type"] for e in paused) == ["sandbox.lifecycle.paused", "sandbox.lifecycle.resumed"]
            team = (await http.get("/events/sandboxes", params={"limit": 100})).json()
            assert {e["id"] for e in events} <= {e["id"] for e in team}
            assert (await http.get("/events/sandboxes", params={"limit": 0})).status_code == 400

            # The same four, delivered to the webhook, each signed as E2B's docs say.
            assert await wait_for(lambda: len(receiver.events_of(sid)) == 4), receiver.deliveries
            assert [e["type"] for e in receiver.events_of(sid)] == LIFECYCLE
            for headers, body in receiver.deliveries:
                headers = {k.lower(): v for k, v in headers.items()}
                digest = hashlib.sha256(SECRET.encode() + body).digest()
                expected = base64.b64encode(digest).decode().replace("+", "-").replace("/", "_").rstrip("=")
                assert headers["e2b-signature"] == expected
                assert headers["e2b-signature-version"] == "v1"
                assert headers["e2b-webhook-id"] == hook["id"]
                assert headers["e2b-delivery-id"]
        finally:
            assert (await http.delete(f"/events/webhooks/{hook['id']}")).status_code == 200
            receiver.close()


async def test_webhooks_are_listed_changed_and_deleted():
    async with api() as http:
        hook = await register(http, "http://127.0.0.1:9/hook", ["sandbox.lifecycle.created"])
        listed = (await http.get("/events/webhooks")).json()
        assert hook["id"] in {w["id"] for w in listed}
        changed = await http.patch(f"/events/webhooks/{hook['id']}", json={"enabled": False, "name": "renamed"})
        assert changed.status_code == 200 and changed.json()["enabled"] is False and changed.json()["name"] == "renamed"
        assert (await http.get(f"/events/webhooks/{hook['id']}")).json()["name"] == "renamed"
        bad = await http.post("/events/webhooks", json={"name": "x", "url": "ftp://x", "events": ["sandbox.lifecycle.created"], "signatureSecret": "s"})
        assert bad.status_code == 400
        bad = await http.post("/events/webhooks", json={"name": "x", "url": "http://x", "events": ["nope"], "signatureSecret": "s"})
        assert bad.status_code == 400
        assert (await http.delete(f"/events/webhooks/{hook['id']}")).status_code == 200
        assert (await http.get(f"/events/webhooks/{hook['id']}")).status_code == 404
        assert (await http.delete(f"/events/webhooks/{hook['id']}")).status_code == 404


async def test_a_receiver_that_is_down_or_slow_does_not_slow_a_create():
    slow = Receiver(delay=5.0)
    async with api() as http:
        down = await register(http, "http://127.0.0.1:9/down", ["sandbox.lifecycle.created"])
        late = await register(http, slow.url, ["sandbox.lifecycle.created"])
        try:
            # A baseline and then creates with both receivers failing or stalling.
            started = time.monotonic()
            sandboxes = [await AsyncSandbox.create(timeout=120) for _ in range(5)]
            took = time.monotonic() - started
            assert took < 5.0, f"5 creates took {took:.1f} s"
            for sbx in sandboxes:
                await sbx.kill()
            # The slow receiver still gets its deliveries, later.
            ids = {s.sandbox_id for s in sandboxes}
            assert await wait_for(lambda: ids <= {json.loads(b)["sandboxId"] for _, b in slow.deliveries}, 30)
        finally:
            await http.delete(f"/events/webhooks/{down['id']}")
            await http.delete(f"/events/webhooks/{late['id']}")
            slow.close()
