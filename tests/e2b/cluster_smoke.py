"""E2B's SDK, with a project-scoped token, against the E2B API of a control-plane replica (run by tests/tests/e2b.rs): the
replica places each create on a node; commands and files then reach the sandbox there. Prints
the sandbox ids, one per line, last."""

import asyncio
import os

import httpx
from e2b import AsyncSandbox


async def main() -> None:
    sandboxes = await asyncio.gather(*[AsyncSandbox.create(timeout=120) for _ in range(8)])
    try:
        for i, sb in enumerate(sandboxes):
            r = await sb.commands.run(f"echo sandbox-{i}")
            assert r.stdout == f"sandbox-{i}\n", r
            await sb.files.write("/home/user/n.txt", str(i))
            assert await sb.files.read("/home/user/n.txt") == str(i)
        listed = await AsyncSandbox.list().next_items()
        assert sorted(s.sandbox_id for s in listed) == sorted(s.sandbox_id for s in sandboxes), listed
        # A sandbox's port through the replica; another project's key does not reach it.
        await sandboxes[1].commands.run(
            "mkdir -p /tmp/www && echo port > /tmp/www/p && cd /tmp/www && python3 -m http.server 8000",
            background=True,
        )
        url, host = os.environ["E2B_API_URL"], {"Host": sandboxes[1].get_host(8000)}
        async with httpx.AsyncClient(timeout=30) as c:
            for _ in range(100):
                r = await c.get(f"{url}/p", headers=host)
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert r.text == "port\n", r.text
            own = await c.get(f"{url}/p", headers={**host, "X-API-Key": os.environ["E2B_API_KEY"]})
            assert own.status_code == 200, own.text
            other = {**host, "X-API-Key": os.environ["OTHER_PROJECT_KEY"]}
            r = await c.get(f"{url}/p", headers=other)
            assert r.status_code == 404, (r.status_code, r.text)
        await sandboxes[0].pause()
        again = await AsyncSandbox.connect(sandboxes[0].sandbox_id)
        assert await again.files.read("/home/user/n.txt") == "0"
        print("\n".join(sb.sandbox_id for sb in sandboxes))
    finally:
        await asyncio.gather(*[sb.kill() for sb in sandboxes])


if __name__ == "__main__":
    from clean_exit import exit_now  # beside this script

    asyncio.run(main())
    exit_now(0)
