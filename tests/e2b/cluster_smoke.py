"""E2B's SDK, with a project-scoped token, against the E2B API of a control-plane replica (run by tests/tests/e2b.rs): the
replica places each create on a node; commands and files then reach the sandbox there. Prints
the sandbox ids, one per line, last."""

import asyncio

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
