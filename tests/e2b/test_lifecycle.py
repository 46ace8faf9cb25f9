"""Sandbox lifecycle and the control API through E2B's SDK: create, list, info, timeouts,
pause and connect, fork, snapshots, metrics, network rules, and the error cases."""

import asyncio
import os
import time

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    NotEnoughSpaceException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)


async def test_info_list_by_metadata_and_kill():
    a = await AsyncSandbox.create(timeout=300, metadata={"job": "list-test", "n": "1"})
    b = await AsyncSandbox.create(timeout=300, metadata={"job": "list-test", "n": "2"})
    try:
        info = await a.get_info()
        assert info.sandbox_id == a.sandbox_id and info.metadata == {"job": "list-test", "n": "1"}
        assert info.template_id == "base" and info.state == SandboxState.RUNNING
        assert info.end_at > info.started_at
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"job": "list-test"}), limit=1)
        seen = []
        while paginator.has_next:
            page = await paginator.next_items()
            assert len(page) <= 1
            seen += [s.sandbox_id for s in page]
        assert sorted(seen) == sorted([a.sandbox_id, b.sandbox_id])
        only = await AsyncSandbox.list(query=SandboxQuery(metadata={"n": "2"})).next_items()
        assert [s.sandbox_id for s in only] == [b.sandbox_id]
    finally:
        assert await a.kill()
        await b.kill()
    assert not await AsyncSandbox.kill(a.sandbox_id), "a second kill finds nothing"
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(a.sandbox_id)
    # A killed sandbox's envd answers "not running".
    with pytest.raises(TimeoutException):
        await a.commands.run("true")
    assert not await a.is_running()


async def test_list_filters_by_template_start_and_awkward_metadata_in_either_order():
    """`SandboxQuery(template=, started_after=)`, `order`, and metadata values with `&`, `=`,
    spaces and `%` (E2B's SDK encodes them three times over)."""
    from datetime import datetime, timezone

    job = {"job": "a&b=c d%", "n": "x y"}
    first = await AsyncSandbox.create(timeout=300, metadata=job)
    await asyncio.sleep(0.05)
    middle = datetime.now(timezone.utc)
    await asyncio.sleep(0.05)
    second = await AsyncSandbox.create(timeout=300, metadata=job)
    other = await AsyncSandbox.create("busybox", timeout=300, metadata=job)
    try:
        ids = lambda page: [s.sandbox_id for s in page]  # noqa: E731
        mine = SandboxQuery(metadata=job)
        newest = await AsyncSandbox.list(query=mine).next_items()
        assert ids(newest) == [other.sandbox_id, second.sandbox_id, first.sandbox_id]
        oldest = await AsyncSandbox.list(query=mine, order="asc").next_items()
        assert ids(oldest) == ids(newest)[::-1]
        base = SandboxQuery(metadata=job, template="base")
        assert ids(await AsyncSandbox.list(query=base).next_items()) == [
            second.sandbox_id, first.sandbox_id,
        ]
        busybox = SandboxQuery(metadata=job, template="busybox")
        assert ids(await AsyncSandbox.list(query=busybox).next_items()) == [other.sandbox_id]
        late = SandboxQuery(metadata=job, started_after=middle)
        assert ids(await AsyncSandbox.list(query=late).next_items()) == [
            other.sandbox_id, second.sandbox_id,
        ]
        none = SandboxQuery(metadata=job, template="no-such-template")
        assert await AsyncSandbox.list(query=none).next_items() == []
    finally:
        await asyncio.gather(first.kill(), second.kill(), other.kill())


async def test_template_env_vars_and_image_by_metadata():
    sb = await AsyncSandbox.create(envs={"FROM_CREATE": "yes"}, timeout=120)
    try:
        r = await sb.commands.run("echo $FROM_CREATE; python3 -c 'print(6*7)'; git --version")
        assert r.stdout.startswith("yes\n42\ngit version")
    finally:
        await sb.kill()
    # The configured metadata key picks the image directly (slime's E2B backend does this).
    sb = await AsyncSandbox.create(metadata={"image": "busybox"}, timeout=120)
    try:
        # busybox has no bash for E2B's commands; its files tell which image it is.
        assert await sb.files.exists("/bin/busybox")
        assert not await sb.files.exists("/usr/bin/python3")
    finally:
        await sb.kill()
    with pytest.raises(SandboxException):
        await AsyncSandbox.create(template="no-such-image", timeout=60)


async def test_a_timeout_ends_the_sandbox_and_set_timeout_extends_it():
    sb = await AsyncSandbox.create(timeout=3)
    keep = await AsyncSandbox.create(timeout=3)
    await keep.set_timeout(60)
    await asyncio.sleep(6)
    assert not await sb.is_running()
    assert await keep.is_running()
    await keep.kill()


async def test_pause_then_connect_keeps_files_and_processes(sandbox):
    await sandbox.files.write("/home/user/state.txt", "kept")
    server = await sandbox.commands.run("sleep 600", background=True)
    assert await sandbox.pause()
    assert not await sandbox.pause(), "already paused"
    info = await AsyncSandbox.get_info(sandbox.sandbox_id)
    assert info.state == SandboxState.PAUSED
    with pytest.raises(TimeoutException):
        await sandbox.commands.run("true")
    again = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=300)
    assert (await again.files.read("/home/user/state.txt")) == "kept"
    assert server.pid in [p.pid for p in await again.commands.list()]
    assert (await AsyncSandbox.get_info(sandbox.sandbox_id)).state == SandboxState.RUNNING


async def test_a_filesystem_only_pause_ends_processes_and_keeps_files(sandbox):
    await sandbox.files.write("/home/user/state.txt", "kept")
    await sandbox.commands.run("sleep 606", background=True)
    assert await sandbox.pause(mode="filesystem")
    assert (await AsyncSandbox.get_info(sandbox.sandbox_id)).state == SandboxState.PAUSED
    again = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=300)
    assert (await again.files.read("/home/user/state.txt")) == "kept"
    r = await again.commands.run("pgrep -f '^sleep 606' || echo none")
    assert r.stdout == "none\n", r.stdout
    # The deprecated spelling means the same.
    assert await again.pause(keep_memory=False)
    await again.connect()


async def test_a_filesystem_only_auto_pause_needs_an_explicit_resume():
    with pytest.raises(Exception):
        await AsyncSandbox.create(
            timeout=60,
            lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}, "auto_resume": True},
        )
    sb = await AsyncSandbox.create(
        timeout=3, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}
    )
    try:
        await sb.commands.run("sleep 707", background=True)
        for _ in range(100):
            if (await AsyncSandbox.get_info(sb.sandbox_id)).state == SandboxState.PAUSED:
                break
            await asyncio.sleep(0.2)
        assert (await AsyncSandbox.get_info(sb.sandbox_id)).state == SandboxState.PAUSED
        await sb.connect(timeout=60)
        r = await sb.commands.run("pgrep -f '^sleep 707' || echo none")
        assert r.stdout == "none\n", r.stdout
    finally:
        await sb.kill()


async def test_connect_lengthens_a_running_sandboxs_timeout_and_never_shortens_it(sandbox):
    """E2B: connecting to a running sandbox with a timeout sets it only if the new end is later."""
    ends = (await sandbox.get_info()).end_at  # the fixture's 600 s
    await AsyncSandbox.connect(sandbox.sandbox_id, timeout=30)
    assert (await sandbox.get_info()).end_at >= ends, "connect(timeout=30) shortened 600 s"
    await AsyncSandbox.connect(sandbox.sandbox_id, timeout=3000)
    longer = (await sandbox.get_info()).end_at
    assert (longer - ends).total_seconds() > 2000, (ends, longer)


async def test_a_sandbox_paused_by_its_timeout_resumes_on_a_request_when_asked():
    """`lifecycle={"on_timeout": "pause", "auto_resume": True}`: a command to the paused
    sandbox resumes it (its files and state kept); without auto_resume it stays paused."""
    woken = await AsyncSandbox.create(
        timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True}
    )
    asleep = await AsyncSandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        await woken.files.write("/home/user/kept.txt", "kept")
        info = await woken.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}, info.lifecycle
        assert (await asleep.get_info()).lifecycle["auto_resume"] is False
        for _ in range(150):
            states = [(await s.get_info()).state for s in (woken, asleep)]
            if states == [SandboxState.PAUSED, SandboxState.PAUSED]:
                break
            await asyncio.sleep(0.2)
        assert states == [SandboxState.PAUSED, SandboxState.PAUSED], states
        r = await woken.commands.run("cat /home/user/kept.txt")
        assert r.stdout == "kept"
        assert (await woken.get_info()).state == SandboxState.RUNNING
        assert await woken.files.read("/home/user/kept.txt") == "kept"
        with pytest.raises(TimeoutException):
            await asleep.commands.run("true")
        assert (await asleep.get_info()).state == SandboxState.PAUSED
    finally:
        await asyncio.gather(woken.kill(), asleep.kill())


async def test_fork_children_start_from_the_parents_files(sandbox):
    await sandbox.files.write("/home/user/from-parent.txt", "parent")
    children = await sandbox.fork(count=2, timeout=120)
    try:
        assert len(children) == 2
        for child in children:
            assert not isinstance(child, Exception), child
            assert await child.files.read("/home/user/from-parent.txt") == "parent"
            await child.files.write("/home/user/mine.txt", child.sandbox_id)
        assert not await sandbox.files.exists("/home/user/mine.txt")
    finally:
        for child in children:
            if not isinstance(child, Exception):
                await child.kill()


async def test_metrics_report_what_the_sandbox_uses(sandbox):
    await sandbox.commands.run("python3 -c 'x = bytearray(50 << 20); import time; time.sleep(0.2)'")
    metrics = await sandbox.get_metrics()
    assert metrics and metrics[-1].mem_total > 0 and metrics[-1].cpu_count >= 1


async def test_metrics_cover_a_time_range_sampled_every_five_seconds(sandbox):
    """`get_metrics(start, end)`: samples every 5 s kept for the sandbox's life, each with the
    CPU share since the one before; a range gets only its own."""
    from datetime import datetime, timedelta, timezone

    began = datetime.now(timezone.utc)
    # A busy stretch, then an idle one: about 12 s, two or more samples.
    await sandbox.commands.run("timeout 6 sh -c 'while :; do :; done'; sleep 6", timeout=60)
    every = await sandbox.get_metrics()
    assert len(every) >= 3, every
    stamps = [m.timestamp for m in every]
    assert stamps == sorted(stamps), stamps
    assert max(m.cpu_used_pct for m in every) > 20, [m.cpu_used_pct for m in every]
    assert every[-1].cpu_used_pct < 20, "idle at the end"
    middle = began + timedelta(seconds=6)
    later = await sandbox.get_metrics(start=middle)
    assert later and all(m.timestamp >= middle.replace(microsecond=0) for m in later), later
    assert len(later) < len(every)
    early = await sandbox.get_metrics(end=middle)
    assert all(m.timestamp <= middle + timedelta(seconds=1) for m in early), early


async def reachable(sb, ip, port):
    probe = (
        "python3 -c \"import socket; s=socket.socket(); s.settimeout(3);"
        f" print(s.connect_ex(('{ip}', {port})))\""
    )
    return (await sb.commands.run(probe)).stdout.strip() == "0"


async def test_network_rules_deny_a_destination_and_can_change():
    # A web service on a host of its own (a network namespace the test harness made).
    ip, port = os.environ["BRIG_TEST_WEB"].split(":")
    sb = await AsyncSandbox.create(timeout=120)
    denied = await AsyncSandbox.create(timeout=120, network={"deny_out": [f"{ip}/32"]})
    offline = await AsyncSandbox.create(timeout=120, allow_internet_access=False)
    try:
        assert await reachable(sb, ip, port), "the default allows the internet"
        assert not await reachable(denied, ip, port)
        assert not await reachable(offline, ip, port)
        await sb.update_network({"deny_out": ["0.0.0.0/0"]})
        assert not await reachable(sb, ip, port)
        await denied.update_network({"allow_out": [f"{ip}/32"]})
        assert await reachable(denied, ip, port)
    finally:
        for s in (sb, denied, offline):
            await s.kill()


async def test_errors_reach_the_sdk_as_its_own_exceptions():
    url = os.environ["E2B_API_URL"]
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.create(api_key="not-a-brig-token", timeout=60)
    with pytest.raises(NotFoundException):
        await AsyncSandbox.connect("sb-0-doesnotexist")
    async with httpx.AsyncClient() as http:
        key = {"X-API-Key": os.environ["E2B_API_KEY"]}
        bad = await http.post(f"{url}/v2/sandboxes", content=b"{not json", headers=key)
        assert bad.status_code == 400 and "malformed" in bad.json()["message"]
        bad = await http.post(f"{url}/v2/sandboxes", json={"timeout": 10**9}, headers=key)
        assert bad.status_code == 400
        assert (await http.get(f"{url}/health")).status_code == 200
        # What the SDK does not call itself: refreshes and logs.
        sb = await AsyncSandbox.create(timeout=60)
        try:
            refreshed = await http.post(f"{url}/sandboxes/{sb.sandbox_id}/refreshes", json={"duration": 600}, headers=key)
            assert refreshed.status_code == 204
            assert (await sb.get_info()).end_at.timestamp() - time.time() > 500
            await sb.commands.run("echo logged")
            logs = await http.get(f"{url}/sandboxes/{sb.sandbox_id}/logs", headers=key)
            assert logs.status_code == 200 and any("echo logged" in l["line"] for l in logs.json()["logs"])
            gone = await http.get(f"{url}/sandboxes/sb-0-nothing/logs", headers=key)
            assert gone.status_code == 404 and "message" in gone.json()
        finally:
            await sb.kill()
    # Past the sandbox's disk quota: a typed error, and the sandbox goes on.
    sb = await AsyncSandbox.create(timeout=120)
    try:
        with pytest.raises((NotEnoughSpaceException, SandboxException)):
            await sb.files.write("/home/user/huge.bin", os.urandom(300 << 20))
        assert (await sb.commands.run("echo alive")).stdout == "alive\n"
    finally:
        await sb.kill()


def test_the_sync_sdk_works_too():
    sb = Sandbox.create(timeout=120, metadata={"sdk": "sync"})
    try:
        assert sb.commands.run("echo sync").stdout == "sync\n"
        sb.files.write("/home/user/s.txt", "sync file")
        assert sb.files.read("/home/user/s.txt") == "sync file"
        handle = sb.files.watch_dir("/home/user")
        sb.files.write("/home/user/t.txt", "x")
        import time

        events = []
        for _ in range(20):
            events += handle.get_new_events()
            if events:
                break
            time.sleep(0.3)
        handle.stop()
        assert any(e.name == "t.txt" for e in events), events
        assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"sdk": "sync"})).next_items()] == [
            sb.sandbox_id
        ]
    finally:
        sb.kill()


async def test_snapshots_become_templates(sandbox):
    await sandbox.files.write("/home/user/snap.txt", "from the snapshot")
    snap = await sandbox.create_snapshot("Task 42")
    assert snap.snapshot_id.startswith("debian-12+snapshots/task-42@")
    listed = await AsyncSandbox.list_snapshots().next_items()
    assert snap.snapshot_id in [s.snapshot_id for s in listed]
    child = await AsyncSandbox.create(snap.snapshot_id, timeout=120)
    try:
        assert await child.files.read("/home/user/snap.txt") == "from the snapshot"
        assert (await child.commands.run("whoami")).stdout == "user\n"
    finally:
        await child.kill()
    assert await AsyncSandbox.delete_snapshot(snap.snapshot_id)
