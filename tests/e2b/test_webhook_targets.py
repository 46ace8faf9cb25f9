"""Where webhooks may be delivered (`[e2b] webhook_targets`): by default (`public`) a webhook
whose URL names the node itself (loopback, `localhost`), its link (a cloud's metadata service)
or a private network is refused when registered or changed, with a message naming the setting;
a public address is taken. The suite's own daemon allows `any` (its receivers are on loopback)."""

import os

import httpx

POLICY = os.environ.get("BRIG_WEBHOOK_TARGETS", "public")
HOOK = {"name": "t", "events": ["sandbox.lifecycle.created"], "signatureSecret": "s3cret"}


def _http():
    return httpx.AsyncClient(base_url=os.environ["E2B_API_URL"], headers={"X-API-Key": os.environ["E2B_API_KEY"]})


async def test_webhooks_into_the_node_are_refused_unless_allowed():
    async with _http() as http:
        made = []
        try:
            for url in [
                "http://127.0.0.1:9/hook",
                "http://localhost:9/hook",
                "http://169.254.169.254/latest/meta-data",
                "http://[::1]:9/hook",
                "http://10.0.0.7/hook",
            ]:
                r = await http.post("/events/webhooks", json={**HOOK, "url": url})
                if POLICY == "any":
                    assert r.status_code == 201, (url, r.text)
                    made.append(r.json()["id"])
                else:
                    assert r.status_code == 400, (url, r.text)
                    assert "webhook_targets" in r.text, r.text
            public = await http.post("/events/webhooks", json={**HOOK, "url": "https://93.184.216.34/hook"})
            assert public.status_code == 201, public.text
            made.append(public.json()["id"])
            # Changing a webhook's URL is checked the same way.
            moved = await http.patch(f"/events/webhooks/{made[-1]}", json={"url": "http://127.0.0.1:9/x"})
            assert moved.status_code == (200 if POLICY == "any" else 400), moved.text
        finally:
            for hook in made:
                await http.delete(f"/events/webhooks/{hook}")
