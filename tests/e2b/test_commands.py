"""Commands through E2B's SDK, unchanged, on Brig sandboxes."""

import asyncio
import time

import pytest
from e2b import AsyncSandbox, CommandExitException, TimeoutException


async def test_a_command_returns_its_output_and_status(sandbox):
    r = await sandbox.commands.run("echo hello; echo oops >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("hello\n", "oops\n", 0)


async def test_a_failing_command_raises_with_its_code_and_stderr(sandbox):
    with pytest.raises(CommandExitException) as info:
        await sandbox.commands.run("echo partial; echo 'it broke' >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stderr == "it broke\n"
    assert info.value.stdout == "partial\n"


async def test_output_streams_to_callbacks_as_it_is_produced(sandbox):
    seen = []
    r = await sandbox.commands.run(
        "for i in 1 2 3; do echo line-$i; echo err-$i >&2; sleep 0.3; done",
        on_stdout=lambda line: seen.append(("out", line, time.monotonic())),
        on_stderr=lambda line: seen.append(("err", line, time.monotonic())),
    )
    assert r.stdout == "line-1\nline-2\nline-3\n"
    outs = [s for s in seen if s[0] == "out"]
    assert [o[1] for o in outs] == ["line-1\n", "line-2\n", "line-3\n"]
    assert any(s[0] == "err" for s in seen)
    # Delivered as produced, not all at the end.
    assert outs[-1][2] - outs[0][2] > 0.4


async def test_users_environment_and_working_directory(sandbox):
    r = await sandbox.commands.run("whoami; pwd; echo $FOO")
    assert r.stdout == "user\n/home/user\n\n"
    r = await sandbox.commands.run("whoami; pwd; echo $FOO", user="root", envs={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout == "root\n/tmp\nbar\n"
    # Root adds users and writes /etc, as slime's setup does.
    r = await sandbox.commands.run(
        "useradd -m agent && git config --system user.name brig && cat /etc/gitconfig && id agent",
        user="root",
    )
    assert "name = brig" in r.stdout and "agent" in r.stdout
    r = await sandbox.commands.run("whoami", user="agent")
    assert r.stdout == "agent\n"
    # A user cannot write where it may not.
    with pytest.raises(CommandExitException):
        await sandbox.commands.run("touch /root/nope")


async def test_a_background_command_is_listed_reconnected_and_killed(sandbox):
    handle = await sandbox.commands.run("echo started; sleep 1; echo finished", background=True)
    assert handle.pid > 0
    listed = await sandbox.commands.list()
    assert handle.pid in [p.pid for p in listed]
    again = await sandbox.commands.connect(handle.pid)
    result = await again.wait()
    assert result.stdout == "started\nfinished\n"
    await handle.disconnect()

    # Killed once it runs (a kill in the first instants of a command can miss it: a race in
    # the exec engine, noted for the node's exec work).
    up = asyncio.Event()
    sleeper = await sandbox.commands.run("echo up; sleep 300", background=True, on_stdout=lambda _: up.set())
    await asyncio.wait_for(up.wait(), 30)
    assert await sandbox.commands.kill(sleeper.pid)
    with pytest.raises(CommandExitException) as info:
        await sleeper.wait()
    assert info.value.exit_code != 0
    assert sleeper.pid not in [p.pid for p in await sandbox.commands.list()]
    # Killing what is gone says so.
    assert not await sandbox.commands.kill(sleeper.pid)


async def test_the_base_template_has_e2bs_base_tooling(sandbox):
    """What E2B's base template has and users' scripts call: curl, wget, pip, git, python3, a
    compiler, CA certificates, and sudo for `user` without a password."""
    r = await sandbox.commands.run(
        "curl --version | head -1; wget --version | head -1; pip --version; git --version;"
        " python3 --version; gcc --version | head -1; make --version | head -1;"
        " test -s /etc/ssl/certs/ca-certificates.crt && echo certs; sudo -n id -un"
    )
    lines = r.stdout.splitlines()
    for want, line in zip(["curl", "GNU Wget", "pip", "git", "Python 3", "gcc", "GNU Make"], lines):
        assert line.startswith(want), (want, line)
    assert lines[-2:] == ["certs", "root"], r.stdout
    # A program built in the sandbox runs.
    await sandbox.files.write("/home/user/hi.c", '#include <stdio.h>\nint main(){puts("built");}\n')
    built = await sandbox.commands.run("cd ~ && gcc -o hi hi.c && ./hi")
    assert built.stdout == "built\n"


async def test_a_commands_pid_is_its_pid_in_the_sandbox(sandbox):
    """`handle.pid` is the process's own pid (envd's): `$$` of the shell E2B starts, seen in
    the sandbox's /proc, and `kill <pid>` from another command ends it."""
    first = asyncio.get_running_loop().create_future()
    handle = await sandbox.commands.run(
        "echo $$; exec sleep 300", background=True,
        on_stdout=lambda line: first.done() or first.set_result(line),
    )
    assert (await asyncio.wait_for(first, 30)).strip() == str(handle.pid)
    cmdline = await sandbox.commands.run(f"tr '\\0' ' ' < /proc/{handle.pid}/cmdline")
    assert cmdline.stdout.startswith("sleep 300"), cmdline.stdout
    assert handle.pid in [p.pid for p in await sandbox.commands.list()]
    await sandbox.commands.run(f"kill -9 {handle.pid}", user="root")
    with pytest.raises(CommandExitException):
        await asyncio.wait_for(handle.wait(), 30)
    assert handle.pid not in [p.pid for p in await sandbox.commands.list()]
    assert not await sandbox.commands.kill(handle.pid), "gone: kill says so"


async def test_a_disconnected_command_keeps_running(sandbox):
    handle = await sandbox.commands.run("sleep 1; echo done > /tmp/marker", background=True)
    await handle.disconnect()
    await asyncio.sleep(2)
    assert (await sandbox.files.read("/tmp/marker")) == "done\n"


async def test_stdin_reaches_a_running_command(sandbox):
    handle = await sandbox.commands.run("cat; echo end", background=True, stdin=True)
    await sandbox.commands.send_stdin(handle.pid, "first line\n")
    await sandbox.commands.send_stdin(handle.pid, b"second line\n")
    await sandbox.commands.close_stdin(handle.pid)
    result = await handle.wait()
    assert result.stdout == "first line\nsecond line\nend\n"
    if not hasattr(sandbox.commands, "stream_input"):
        return  # an SDK older than StreamInput (2.45.1)
    # An ordered input stream (StreamInput, client streaming).
    counter = await sandbox.commands.run("wc -c", background=True, stdin=True)
    stream = sandbox.commands.stream_input(counter.pid)
    for _ in range(50):
        await stream.send(b"x" * 1000)
    await stream.close()
    await sandbox.commands.close_stdin(counter.pid)
    assert (await counter.wait()).stdout.strip() == "50000"


async def test_a_deadline_ends_the_command_with_a_timeout(sandbox):
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        await sandbox.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    # The command was stopped with its deadline.
    await asyncio.sleep(0.5)
    assert "sleep 30" not in (await sandbox.commands.run("ps -eo args")).stdout


async def test_a_long_command_streams_past_a_minute_without_being_cut():
    sb = await AsyncSandbox.create(timeout=600)
    try:
        ticks = []
        r = await sb.commands.run(
            "for i in $(seq 1 70); do echo tick-$i; sleep 1; done",
            timeout=0,
            on_stdout=lambda line: ticks.append(line),
        )
        assert len(ticks) == 70 and r.exit_code == 0
    finally:
        await sb.kill()


async def test_many_sandboxes_run_at_once():
    sandboxes = await asyncio.gather(*[AsyncSandbox.create(timeout=300) for _ in range(8)])
    try:
        results = await asyncio.gather(*[s.commands.run(f"echo {i}") for i, s in enumerate(sandboxes)])
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
        assert len({s.sandbox_id for s in sandboxes}) == 8
    finally:
        await asyncio.gather(*[s.kill() for s in sandboxes])


async def test_a_terminal_takes_input_resizes_and_is_killed(sandbox):
    from e2b.sandbox.commands.command_handle import PtySize

    screen = bytearray()
    handle = await sandbox.pty.create(PtySize(rows=24, cols=80), on_data=screen.extend, timeout=120)

    async def shows(text: bytes) -> None:
        for _ in range(100):
            if text in screen:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared on the terminal: {bytes(screen)!r}")

    await sandbox.pty.send_stdin(handle.pid, b"test -t 0 && test -t 1 && echo on-a-tty; stty size; echo mark-$((6*7))\n")
    await shows(b"mark-42")
    assert b"on-a-tty" in screen and b"24 80" in screen
    await sandbox.pty.resize(handle.pid, PtySize(rows=40, cols=120))
    await sandbox.pty.send_stdin(handle.pid, b"stty size\n")
    await shows(b"40 120")
    # ^C reaches the foreground job through the terminal; the shell lives on.
    await sandbox.pty.send_stdin(handle.pid, b"sleep 100\n")
    await asyncio.sleep(0.5)
    await sandbox.pty.send_stdin(handle.pid, b"\x03echo after-interrupt\n")
    await shows(b"after-interrupt")
    assert await sandbox.pty.kill(handle.pid)
    with pytest.raises(CommandExitException):
        await handle.wait()


async def test_killing_the_sandbox_ends_a_foreground_command_in_the_sdks_error_path():
    from e2b import AsyncSandbox
    from e2b import exceptions

    # Releases before 2.6x raise their timeout exception for a sandbox that went away.
    gone = getattr(exceptions, "SandboxNotRunningException", exceptions.TimeoutException)

    sb = await AsyncSandbox.create(timeout=120)
    started = asyncio.get_running_loop().time()
    running = asyncio.create_task(sb.commands.run("sleep 60", timeout=90))
    await asyncio.sleep(1.0)
    assert await sb.kill()
    # As on E2B: the command's stream ends with the sandbox, raised as the SDK's exception
    # (never a result, never a hang).
    with pytest.raises(gone) as ended:
        await asyncio.wait_for(running, timeout=20)
    assert "was not found" in str(ended.value)
    assert asyncio.get_running_loop().time() - started < 20
