"""Commands: results, stdin, streams, re-attach, kill, cancellation, sessions."""

import asyncio

import pytest

import brig


async def test_exec_returns_output_and_exit_code(box):
    r = await box.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, b"out\n", b"err\n", False)
    r = await box.exec(["sh", "-c", 'echo "$GREETING from $(pwd)"'], env={"GREETING": "hi"}, cwd="/tmp")
    assert r.stdout_text == "hi from /tmp\n"
    assert (await box.exec(["cat"], stdin=b"fed\x00bytes")).stdout == b"fed\x00bytes"
    assert (await box.exec("id -u", user="1000")).stdout_text == "1000\n"


async def test_timeouts_and_output_caps_are_reported(box):
    r = await box.exec("sleep 30", timeout=0.5)
    assert r.timed_out and r.exit_code is None and r.signal == 9
    r = await box.exec("yes | head -c 100000", output_limit=1000)
    assert r.truncated and len(r.stdout) == 1000


async def test_streams_take_stdin_and_reattach(box):
    s = await box.exec_stream(["sh", "-c", "while read l; do echo got-$l; done; echo done"], stdin=True)
    await s.write_stdin(b"a\nb\n")
    await s.close_stdin()
    chunks = [(stream, data) async for stream, data in s]
    assert b"".join(d for st, d in chunks if st == "stdout") == b"got-a\ngot-b\ndone\n"
    again = await box.attach(s.exec_id)
    r = await again.wait()
    assert r.exit_code == 0 and r.stdout == b"got-a\ngot-b\ndone\n"
    assert any(e.exec_id == s.exec_id for e in await box.execs())


async def test_stdin_is_written_and_closed_by_exec_id(box):
    # Any client can feed a streamed command by its id (as after a brigd restart).
    s = await box.exec_stream(["sh", "-c", "while read l; do echo got-$l; done; echo done"], stdin=True)
    await s.write_stdin(b"a\n")
    # The stream's line first (two channels keep no order between them).
    async for _, data in s:
        if b"got-a" in data:
            break
    await box.write_stdin(s.exec_id, b"b\n")
    await box.close_stdin(s.exec_id)
    r = await (await box.attach(s.exec_id)).wait()
    assert r.exit_code == 0 and r.stdout == b"got-a\ngot-b\ndone\n", r.stdout
    with pytest.raises(Exception, match="stdin is not open"):
        await box.write_stdin(s.exec_id, b"c\n")


async def test_a_cancelled_task_leaves_the_command_reattachable(box):
    s = await box.exec_stream("for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.3; done")

    async def read_all():
        return [d async for _, d in s]

    task = asyncio.create_task(read_all())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await (await box.attach(s.exec_id)).wait()
    assert r.exit_code == 0 and r.stdout.count(b"tick-") == 6, r.stdout

    # A plain exec cancelled midway: the command runs on and can be found and killed.
    # Methods return asyncio futures: ensure_future (not create_task) schedules one.
    slow = asyncio.ensure_future(box.exec("sleep 60"))
    await asyncio.sleep(0.5)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    running = [e for e in await box.execs() if e.argv[-1] == "sleep 60" and e.result is None]
    assert running, await box.execs()
    await box.kill(running[0].exec_id)
    r = await (await box.attach(running[0].exec_id)).wait()
    assert r.killed
    # The client still works after all that.
    assert (await box.exec("echo ok")).stdout == b"ok\n"


async def test_kill_ends_a_command_tree(box):
    s = await box.exec_stream("sleep 300 & sleep 300; echo never")
    await box.kill(s.exec_id)
    r = await s.wait()
    assert r.killed and b"never" not in r.stdout


async def test_sessions_keep_state_and_can_be_interrupted(box):
    session = await box.open_session()
    await session.run("cd /tmp && export X=42")
    out = await session.run("echo $X $(pwd)")
    assert out.stdout == "42 /tmp\n" and out.exit_code == 0 and out.cwd == "/tmp"
    out = await session.run("sleep 30", timeout=0.5)
    assert out.exit_code is None
    await session.interrupt()
    out = await session.wait(timeout=10)
    assert out.exit_code is not None
    assert (await session.run("echo still-here")).stdout == "still-here\n"
    assert box.session(session.id).id == session.id
    await session.close()


async def test_one_thousand_concurrent_commands_from_one_loop(client):
    sandboxes = await client.create_many(8, image="busybox", labels={"suite": "python-sdk", "batch": "thousand"}, concurrency=4)
    try:
        results = await asyncio.gather(*[sandboxes[i % 8].exec(["echo", str(i)]) for i in range(1000)])
        assert [r.stdout_text for r in results] == [f"{i}\n" for i in range(1000)]
    finally:
        destroyed = await client.destroy({"batch": "thousand"})
        assert sorted(destroyed) == sorted(sb.id for sb in sandboxes)


async def test_every_call_is_a_coroutine_for_tasks_groups_gather_and_wait_for(client, box):
    # create_task and TaskGroup take only coroutines: every call is one.
    task = asyncio.create_task(box.exec("echo task"))
    assert (await task).stdout == b"task\n"
    async with asyncio.TaskGroup() as group:
        status = group.create_task(box.status())
        listed = group.create_task(box.list_dir("/"))
        node = group.create_task(client.node_status())
    info = status.result()
    assert isinstance(info, brig.SandboxInfo) and info.id == box.id and info.state == "Running"
    assert all(isinstance(e, brig.FileEntry) for e in listed.result())
    assert isinstance(node.result(), brig.NodeStatus) and node.result().sandboxes >= 1
    assert isinstance(node.result().capacity, brig.NodeCapacity)
    r1, r2 = await asyncio.gather(box.exec("echo a"), box.exec("echo b"))
    assert (r1.stdout, r2.stdout) == (b"a\n", b"b\n")
    assert (await asyncio.wait_for(box.exec("echo w"), timeout=30)).stdout == b"w\n"
    # A call past wait_for's deadline is cancelled: its Rust task is aborted.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(box.exec("sleep 30"), timeout=0.3)
    # Records: attributes, a readable repr, equality by value, and plain data back.
    again = await box.status()
    assert repr(info).startswith(f"SandboxInfo(id={box.id!r}")
    assert again.id == info.id and again.labels == info.labels
    same = brig.SandboxInfo._from_dict(info.to_dict())
    assert same == info and same != again.to_dict()
    with pytest.raises(AttributeError):
        info.id = "other"
    with pytest.raises(AttributeError):
        _ = info.no_such_field
