"""Files through E2B's SDK: reads, writes (multipart, octet-stream, gzip), listings, watches."""

import asyncio
import hashlib
import io
import os

import pytest
from e2b import FileType, NotFoundException
from e2b.sandbox.filesystem.filesystem import WriteEntry


@pytest.mark.parametrize("size", [0, 1 << 20, 64 << 20])
async def test_files_of_every_size_go_in_and_out_intact(sandbox, size):
    data = os.urandom(size)
    info = await sandbox.files.write(f"/home/user/blob-{size}", data)
    assert info.path == f"/home/user/blob-{size}"
    back = await sandbox.files.read(f"/home/user/blob-{size}", format="bytes")
    assert len(back) == size and hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    # Written by the user, so the user's commands may change it.
    r = await sandbox.commands.run(f"stat -c %U blob-{size} && echo more >> blob-{size}")
    assert r.stdout == "user\n"


async def test_raw_streamed_and_gzip_writes(sandbox):
    await sandbox.files.write("notes/raw.txt", "raw body\n", use_octet_stream=True)
    assert await sandbox.files.read("/home/user/notes/raw.txt") == "raw body\n"
    await sandbox.files.write("gz.txt", "compressed " * 1000, gzip=True)
    assert await sandbox.files.read("gz.txt") == "compressed " * 1000
    # A file-like object streams (slime writes this way).
    await sandbox.files.write("/tmp/stream.bin", io.BytesIO(b"x" * 300_000), use_octet_stream=True)
    assert len(await sandbox.files.read("/tmp/stream.bin", format="bytes")) == 300_000
    chunks = []
    async for chunk in await sandbox.files.read("/tmp/stream.bin", format="stream"):
        chunks.append(chunk)
    assert sum(len(c) for c in chunks) == 300_000


async def test_many_files_in_one_write(sandbox):
    entries = [WriteEntry(path=f"/home/user/many/{i}.txt", data=f"file {i}") for i in range(5)]
    infos = await sandbox.files.write_files(entries)
    assert sorted(i.path for i in infos) == sorted(e["path"] for e in entries)
    listed = await sandbox.files.list("/home/user/many")
    assert sorted(e.name for e in listed) == [f"{i}.txt" for i in range(5)]
    assert all(e.type == FileType.FILE for e in listed)


async def test_listing_stat_mkdir_rename_remove(sandbox):
    assert await sandbox.files.make_dir("/home/user/a/b/c")
    assert not await sandbox.files.make_dir("/home/user/a/b/c"), "it exists already"
    await sandbox.files.write("/home/user/a/b/c/f.txt", "hello")
    deep = await sandbox.files.list("/home/user/a", depth=3)
    assert {e.path for e in deep} == {
        "/home/user/a/b",
        "/home/user/a/b/c",
        "/home/user/a/b/c/f.txt",
    }
    info = await sandbox.files.get_info("/home/user/a/b/c/f.txt")
    assert info.type == FileType.FILE and info.size == 5 and info.name == "f.txt"
    # Owner and group by name, as envd reports them.
    assert (info.owner, info.group) == ("user", "user"), info
    etc = await sandbox.files.get_info("/etc/passwd")
    assert (etc.owner, etc.group) == ("root", "root"), etc
    assert {(e.owner, e.group) for e in deep} == {("user", "user")}
    assert (await sandbox.files.get_info("/home/user/a")).type == FileType.DIR
    moved = await sandbox.files.rename("/home/user/a/b/c/f.txt", "/home/user/g.txt")
    assert moved.path == "/home/user/g.txt"
    assert await sandbox.files.exists("/home/user/g.txt")
    assert not await sandbox.files.exists("/home/user/a/b/c/f.txt")
    await sandbox.files.remove("/home/user/a")
    assert not await sandbox.files.exists("/home/user/a")
    # As envd's (os.RemoveAll, and E2B's own SDK tests): a missing path is removed already.
    await sandbox.files.remove("/home/user/a")


def _marks_links():
    """Whether this SDK reads envd's `is_symlink` (newer envd: `type` is the target's and the
    flag marks the link, which the SDK shows as SYMLINK); older SDKs show the target's type."""
    from e2b.envd.filesystem import filesystem_pb

    return hasattr(filesystem_pb.EntryInfo(), "is_symlink")


async def test_symlinks_read_as_envd_reports_them(sandbox):
    """A link's type is its target's (marked as a link for SDKs that read `is_symlink`) and
    `symlink_target` the fully resolved absolute path (E2B's test_file_symlink); a dangling
    link has no type, and the SDK leaves it out of listings."""
    await sandbox.files.write("/home/user/links/test.txt", "x")
    await sandbox.commands.run(
        "cd /home/user/links && ln -s test.txt to_file && ln -s /home/user/links to_dir"
        " && ln -s nowhere dangling"
    )
    marked = _marks_links()
    info = await sandbox.files.get_info("/home/user/links/to_file")
    assert info.type == (FileType.SYMLINK if marked else FileType.FILE), info
    assert info.symlink_target == "/home/user/links/test.txt", info
    assert info.name == "to_file" and info.permissions.startswith("L"), info
    to_dir = await sandbox.files.get_info("/home/user/links/to_dir")
    assert to_dir.type == (FileType.SYMLINK if marked else FileType.DIR), to_dir
    assert to_dir.symlink_target == "/home/user/links"
    listed = {e.name: e for e in await sandbox.files.list("/home/user/links")}
    assert set(listed) == {"test.txt", "to_file", "to_dir"}, listed
    assert listed["to_file"].symlink_target == "/home/user/links/test.txt"
    assert listed["test.txt"].symlink_target is None


async def test_signed_file_urls_read_and_write_until_they_expire():
    """`download_url`/`upload_url` of a secured sandbox, fetched with no token at the host
    E2B's SDK addresses envd at (`49983-<id>.<domain>`): they read and write; a changed path,
    an expired URL or another sandbox's signature is refused (401)."""
    from urllib.parse import urlparse

    import httpx
    from e2b import AsyncSandbox
    from e2b.sandbox.signature import get_signature

    sb = await AsyncSandbox.create(secure=True, timeout=120)
    other = await AsyncSandbox.create(secure=True, timeout=120)
    try:
        await sb.files.write("/home/user/signed.txt", "signed")
        base = os.environ["E2B_SANDBOX_URL"]
        host = {"Host": f"49983-{sb.sandbox_id}.e2b.local"}
        query = lambda url: urlparse(url).query  # noqa: E731
        read = query(sb.download_url("/home/user/signed.txt", use_signature_expiration=60))
        write = query(sb.upload_url("/home/user/up.txt", use_signature_expiration=60))
        never = query(sb.download_url("/home/user/signed.txt"))
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(f"{base}/files?{read}", headers=host)
            assert (r.status_code, r.text) == (200, "signed"), r.text
            r = await c.get(f"{base}/files?{never}", headers=host)
            assert (r.status_code, r.text) == (200, "signed"), "a URL without expiry"
            r = await c.post(
                f"{base}/files?{write}", headers=host, files={"file": ("up.txt", b"uploaded")}
            )
            assert r.status_code == 200, r.text
            assert await sb.files.read("/home/user/up.txt") == "uploaded"
            changed = read.replace("signed.txt", "other.txt")
            assert (await c.get(f"{base}/files?{changed}", headers=host)).status_code == 401
            r = await c.get(f"{base}/files?{write}", headers=host)
            assert r.status_code == 401, "a write URL does not read"
            old = get_signature("/home/user/signed.txt", "read", None, sb._envd_access_token, -5)
            expired = f"path=/home/user/signed.txt&signature={old['signature']}&signature_expiration={old['expiration']}"
            r = await c.get(f"{base}/files?{expired}", headers=host)
            assert r.status_code == 401 and "expired" in r.text, r.text
            theirs = {"Host": f"49983-{other.sandbox_id}.e2b.local"}
            assert (await c.get(f"{base}/files?{read}", headers=theirs)).status_code == 401
    finally:
        await asyncio.gather(sb.kill(), other.kill())


async def test_missing_files_are_not_found(sandbox):
    with pytest.raises(NotFoundException):
        await sandbox.files.read("/no/such/file")
    with pytest.raises(NotFoundException):
        await sandbox.files.get_info("/no/such/file")
    with pytest.raises(NotFoundException):
        await sandbox.files.list("/no/such/dir")
    with pytest.raises(NotFoundException):
        await sandbox.files.rename("/no/such/file", "/tmp/x")


async def test_watching_a_directory_reports_changes(sandbox):
    await sandbox.files.make_dir("/home/user/watched")
    events = []
    handle = await sandbox.files.watch_dir("/home/user/watched", on_event=events.append, recursive=True)
    try:
        await sandbox.files.write("/home/user/watched/new.txt", "one")
        await asyncio.sleep(0.6)
        await sandbox.commands.run("echo two >> /home/user/watched/new.txt")
        await asyncio.sleep(0.6)
        await sandbox.files.remove("/home/user/watched/new.txt")
        for _ in range(30):
            if any(e.type.name == "REMOVE" for e in events):
                break
            await asyncio.sleep(0.2)
    finally:
        await handle.stop()
    kinds = [(e.name, e.type.name) for e in events]
    assert ("new.txt", "CREATE") in kinds, kinds
    assert ("new.txt", "WRITE") in kinds, kinds
    assert ("new.txt", "REMOVE") in kinds, kinds
