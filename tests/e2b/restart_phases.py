"""E2B's SDK across a brigd crash (run by tests/tests/e2b.rs in two phases around a `kill -9`
and restart of brigd on the same addresses).

`start`: creates a sandbox, starts `cat` in the background with stdin, sends it a line and
prints `<sandbox id> <pid>`. `resume <sandbox id> <pid>`: connects again, sends another line
to the same process (SendInput reaches a process started before the restart), closes its stdin
and waits for it: its output is both lines, and it ends with status 0."""

import asyncio
import sys

from e2b import AsyncSandbox


async def start() -> None:
    sb = await AsyncSandbox.create(timeout=600, metadata={"suite": "e2b-restart"})
    handle = await sb.commands.run("cat", background=True, stdin=True)
    await sb.commands.send_stdin(handle.pid, "before the crash\n")
    got = ""
    for _ in range(100):
        got = handle.stdout
        if got:
            break
        await asyncio.sleep(0.05)
    assert got == "before the crash\n", got
    await handle.disconnect()
    print(sb.sandbox_id, handle.pid)


async def resume(sandbox_id: str, pid: int) -> None:
    sb = await AsyncSandbox.connect(sandbox_id)
    running = [p.pid for p in await sb.commands.list()]
    assert pid in running, f"{pid} not in {running}"
    await sb.commands.send_stdin(pid, "after the crash\n")
    await sb.commands.close_stdin(pid)
    handle = await sb.commands.connect(pid)
    result = await asyncio.wait_for(handle.wait(), 30)
    assert result.stdout == "before the crash\nafter the crash\n", result
    assert result.exit_code == 0, result
    await sb.kill()
    print("ok")


if __name__ == "__main__":
    from clean_exit import exit_now  # beside this script

    if sys.argv[1] == "start":
        asyncio.run(start())
    else:
        asyncio.run(resume(sys.argv[2], int(sys.argv[3])))
    exit_now(0)
