"""Sandboxes: files, lifecycle, forks, labels, egress, audit, tool calls, errors, sync client."""

import asyncio
import json
import os
import threading

import pytest

import brig


async def test_files_round_trip(box, tmp_path):
    assert await box.write_file("/tmp/d/a.txt", "text") == 4
    assert await box.read_file("/tmp/d/a.txt") == b"text"
    await box.mkdir("/tmp/d/sub/deeper", parents=True)
    names = sorted(e.path.rsplit("/", 1)[-1] for e in await box.list_dir("/tmp/d"))
    assert names == ["a.txt", "sub"]
    st = await box.stat("/tmp/d/a.txt")
    assert st.size == 4 and st.kind == "File"
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(3 << 20))
    assert await box.upload_file("/tmp/big.bin", str(local)) == 3 << 20
    await box.download_file("/tmp/big.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    await box.remove("/tmp/d", recursive=True)
    with pytest.raises(brig.SandboxNotFound):
        await box.read_file("/tmp/d/a.txt")


async def test_pause_resume_fork_and_evaluation(client):
    sb = await client.create(image="debian-12", labels={"suite": "python-sdk", "group": "g1"}, hidden_paths=["/etc/debian_version"])
    try:
        await sb.write_file("/root/progress", "step-3")
        await sb.pause()
        assert (await sb.status()).state == "Paused"
        assert (await sb.exec("cat /root/progress")).stdout == b"step-3"  # implicit resume
        # Keeping the files only: every process ends, the resume starts with nothing running.
        await sb.exec("sleep 900 &")
        await sb.pause_files_only()
        paused = await sb.status()
        assert paused.state == "Paused" and paused.paused_files_only, paused
        left = await sb.exec("cat /root/progress; echo; cat /proc/[0-9]*/comm | grep -c '^sleep$'")
        assert left.stdout == b"step-3\n0\n", left
        assert not (await sb.status()).paused_files_only
        kids = await sb.fork(3, labels={"kid": "yes"})
        assert len(kids) == 3
        for kid in kids:
            assert (await kid.read_file("/root/progress")) == b"step-3"
            assert (await kid.status()).labels["kid"] == "yes"
        assert (await sb.exec("cat /etc/debian_version")).stdout == b"", "hidden from the agent"
        judge = await sb.fork_for_evaluation()
        assert (await judge.status()).labels["purpose"] == "evaluation"
        assert (await judge.exec("cat /etc/debian_version")).stdout_text.startswith("12"), "shown to the grader"
        listed = await client.list({"group": "g1"})
        assert {s.id for s in listed} >= {sb.id, *(k.id for k in kids)}
        assert sorted(await client.pause({"kid": "yes"})) == sorted(k.id for k in kids)
        assert sorted(await client.resume({"kid": "yes"})) == sorted(k.id for k in kids)
        # Another client (a restarted trainer) reaches the same sandbox by id.
        other = await brig.AsyncClient.connect_local()
        assert (await other.sandbox(sb.id).read_file("/root/progress")) == b"step-3"
    finally:
        await client.destroy({"group": "g1"})


async def test_ttls_expire_sandboxes_with_their_own_error(client):
    sb = await client.create(image="busybox", idle_ttl=0.5)
    for _ in range(40):
        await asyncio.sleep(0.25)
        try:
            await sb.status()
        except brig.Expired as e:
            assert e.code == "expired" and not e.retryable
            break
    else:
        pytest.fail("the idle TTL never expired the sandbox")
    info = await (await client.create(image="busybox", max_lifetime=60, pause_when_idle=True, idle_ttl=30)).status()
    assert info.max_lifetime_ms == 60000 and info.idle_action == "Pause"
    await client.sandbox(info.id).destroy()


async def test_errors_are_typed(client, box):
    with pytest.raises(brig.SandboxNotFound) as e:
        await client.sandbox("sb-00000000-0123456789abcdef").exec("true")
    assert e.value.code == "not_found" and isinstance(e.value, brig.BrigError)
    with pytest.raises(brig.BadRequest):
        await client.sandbox("not-an-id").status()
    with pytest.raises(brig.BadRequest):
        await box.set_egress(["10.1.2.3/40"])
    with pytest.raises(brig.BadRequest):
        await client.create(image="no-such-image")
    with pytest.raises(ValueError):
        await client.create(tier="nonsense")
    with pytest.raises(TypeError):
        await client.create(image="busybox", colour="blue")
    with pytest.raises(brig.ConnectionFailed) as e:
        await brig.AsyncClient.connect("127.0.0.1:1", "00" * 32, "token")
    assert e.value.code is None


async def test_egress_and_audit(client):
    sb = await client.create(image="busybox", egress=[])
    try:
        assert (await sb.status()).egress == []
        info = await sb.set_egress(["10.0.0.0/8:443"])
        assert info.egress == ["10.0.0.0/8:443"]
        await sb.exec("echo audited")
        events = await sb.audit()
        kinds = [next(iter(e.kind)) if isinstance(e.kind, dict) else e.kind for e in events]
        assert "exec_start" in kinds and "policy" in kinds, kinds
        streamed = [e async for e in await sb.audit_stream(0, follow=False)]
        assert [e.seq for e in streamed] == [e.seq for e in events]
    finally:
        await sb.destroy()


async def test_tool_calls_one_shot_and_in_a_sandbox(client):
    tools = {t.name for t in await client.tools()}
    assert {"jq", "files"} <= tools
    r = await client.call("jq", '{"query": "$.a", "json": {"a": [1, 2]}}')
    assert r.ok and r.outcome == "ok", r
    results = await asyncio.gather(*[client.call("jq", '{"query": "$.n", "json": {"n": %d}}' % i) for i in range(1000)])
    assert [json.loads(r.output)["results"] for r in results] == [[i] for i in range(1000)]
    ws = await client.create(tier="fncall")
    try:
        w = await ws.call("files", '{"op": "write", "path": "notes.txt", "content": "kept"}')
        assert w.ok, w
        back = await ws.call("files", '{"op": "read", "path": "notes.txt"}')
        assert back.ok and "kept" in back.output, back
    finally:
        await ws.destroy()
    bad = await client.call_with("jq", "not json", timeout=5)
    assert not bad.ok and bad.outcome == "tool_error" and bad.error


def test_the_sync_client():
    c = brig.Client.connect_local()
    sb = c.create(image="busybox")
    try:
        assert sb.exec("echo sync").stdout == b"sync\n"
        sb.write_file("/tmp/f", b"x")
        assert sb.read_file("/tmp/f") == b"x"
        chunks = list(sb.exec_stream("echo a; echo b"))
        assert b"".join(d for _, d in chunks) == b"a\nb\n"
    finally:
        sb.destroy()


async def test_qos_checkpoints_images_and_terminals(client, box):
    assert (await box.set_qos("best_effort")).qos == "BestEffort"
    await box.write_file("/root/state", "saved")
    layer = await box.checkpoint("py-ckpt", scrub=["/tmp"])
    ref = f"{layer.name}@{layer.version}"
    assert ref in {f"{i.name}@{i.version}" for i in await client.images()}
    details = await client.inspect_image(ref)
    assert any(p.endswith("root/state") for p in details.paths), details.paths
    assert (await client.verify_image(ref)).digest == details.layer.digest
    resumed = await client.create(image=f"busybox+{ref}")
    try:
        assert await resumed.read_file("/root/state") == b"saved"
    finally:
        await resumed.destroy()
    tagged = await client.tag_image(ref, "py-ckpt-tag")
    await client.remove_image(f"{tagged.name}@{tagged.version}")
    gc = await client.gc_images()
    assert isinstance(gc, brig.GcSummary) and set(gc.to_dict()) == {"removed_layers", "removed_chunks", "freed_bytes"}
    assert client.call_hops() == {"direct": 0, "via_control": 0}

    shell = await box.exec_stream(["sh"], stdin=True, terminal=(24, 80))
    await box.resize_terminal(shell.exec_id, 30, 100)
    await shell.write_stdin(b"stty size; echo $((6 * 7)); exit\n")
    out = b"".join([d async for _, d in shell])
    assert b"30 100" in out and b"42" in out, out


async def test_pull_image_from_a_registry(client):
    """An image of the registry the Rust harness started (BRIG_TEST_IMAGE_REF), pulled and run."""
    reference = os.environ["BRIG_TEST_IMAGE_REF"]
    seen = []
    loop_thread = threading.get_ident()

    def on_progress(state):
        assert threading.get_ident() == loop_thread, "called on the event loop's thread"
        seen.append(state)

    pulled = await client.pull_image(reference, name="py/pulled", on_progress=on_progress)
    assert pulled.name == "py/pulled"
    assert [layer.reused for layer in pulled.layers] == [False]
    await asyncio.sleep(0)  # progress scheduled before the result has run by now
    assert seen, "no progress reached the callback"
    last = seen[-1]
    assert last.reference == reference
    assert [layer.state for layer in last.layers] == ["Done"]
    assert last.layers[0].downloaded == last.layers[0].size > 0
    sb = await client.create(image="env:py/pulled")
    try:
        assert await sb.read_file("/etc/pulled") == b"from a registry\n"
    finally:
        await sb.destroy()
    again = await client.pull_image(reference)
    assert again.downloaded_bytes == 0 and again.name.startswith("pulled/")


async def test_build_image_from_a_dockerfile(client, tmp_path):
    """A Dockerfile on the image the Rust harness pushed: its steps stream, a rebuild is cached,
    a failing step raises with its output."""
    (tmp_path / "hello.txt").write_text("hi there\n")
    base = os.environ["BRIG_TEST_IMAGE_REF"]
    dockerfile = f"FROM {base}\nCOPY hello.txt /hello.txt\nRUN cat /hello.txt\nENV WHO=py\n"
    events = []
    built = await client.build_image("py/built", dockerfile, context=tmp_path, on_event=events.append)
    assert (built.steps_run, built.steps_cached) == (2, 0)
    assert {"step": 3, "steps": 4, "type": "log", "stream": "stdout", "text": "hi there\n"} in events
    again = await client.build_image("py/built", dockerfile, context=tmp_path)
    assert (again.steps_run, again.steps_cached) == (0, 2)
    sb = await client.create(image="env:py/built")
    try:
        assert await sb.read_file("/hello.txt") == b"hi there\n"
        assert (await sb.exec("echo $WHO")).stdout == b"py\n"
    finally:
        await sb.destroy()
    with pytest.raises(brig.BadRequest) as failed:
        await client.build_image("py/fails", f"FROM {base}\nRUN echo oops; exit 4\n")
    assert "exit code 4" in str(failed.value) and "oops" in str(failed.value)


async def test_a_volume_is_written_mounted_read_only_and_deleted(client):
    made = await client.create_volume("py-vol", quota_mib=32)
    assert made.name == "py-vol" and made.quota_bytes == 32 << 20
    entry = await client.volume_write("py-vol", "/notes/a.txt", "from python\n")
    assert entry.size == 12 and entry.path == "/notes/a.txt"
    sb = await client.create(image="busybox", volumes={"/v": ("py-vol", True)})
    try:
        r = await sb.exec(["sh", "-c", "cat /v/notes/a.txt; echo x > /v/b.txt"])
        assert r.stdout == b"from python\n" and r.exit_code != 0, r
        assert [e.path for e in await client.volume_list("py-vol", "/", depth=2)] == ["/notes", "/notes/a.txt"]
        with pytest.raises(brig.Conflict):
            await client.delete_volume("py-vol")
    finally:
        await sb.destroy()
    assert await client.volume_read("py-vol", "/notes/a.txt") == b"from python\n"
    await client.delete_volume("py-vol")
    assert "py-vol" not in {v.name for v in await client.volumes()}
