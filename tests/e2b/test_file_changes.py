"""File metadata and directory watches, as E2B documents them: metadata written with a file is
kept with it (an extended attribute the sandbox can read), listed, and follows a rename;
`watch_dir` reports every kind of change as it happens, short-lived files too, follows folders
made later when recursive, and carries entries when asked."""

import asyncio

import pytest

from e2b.envd import versions

HAS_METADATA = hasattr(versions, "ENVD_FILE_METADATA")
HAS_ENTRY = hasattr(versions, "ENVD_VERSION_FS_EVENT_ENTRY_INFO")


@pytest.mark.skipif(not HAS_METADATA, reason="this e2b release has no file metadata")
async def test_file_metadata_is_kept_listed_and_follows_a_rename(sandbox):
    info = await sandbox.files.write(
        "/home/user/meta/a.txt", "hello", metadata={"Owner": "ann", "stage": "eval"}
    )
    assert info.metadata == {"owner": "ann", "stage": "eval"}, info

    got = await sandbox.files.get_info("/home/user/meta/a.txt")
    assert got.metadata == {"owner": "ann", "stage": "eval"}, got

    # Kept as E2B keeps it: an extended attribute a command in the sandbox reads.
    out = await sandbox.commands.run(
        "python3 -c \"import os; print(os.getxattr('/home/user/meta/a.txt', 'user.e2b.owner').decode())\""
    )
    assert out.stdout.strip() == "ann", out

    await sandbox.files.rename("/home/user/meta/a.txt", "/home/user/meta/b.txt")
    listed = {e.name: e for e in await sandbox.files.list("/home/user/meta")}
    assert listed["b.txt"].metadata == {"owner": "ann", "stage": "eval"}, listed

    # An upload replaces a file's metadata; one without any clears it (E2B's envd does so).
    await sandbox.files.write("/home/user/meta/b.txt", "again", metadata={"stage": "done"})
    assert (await sandbox.files.get_info("/home/user/meta/b.txt")).metadata == {"stage": "done"}
    await sandbox.files.write("/home/user/meta/b.txt", "plain")
    assert not (await sandbox.files.get_info("/home/user/meta/b.txt")).metadata
    # Several files of one upload share one map.
    many = await sandbox.files.write_files(
        [
            {"path": "/home/user/meta/c.txt", "data": "c"},
            {"path": "/home/user/meta/d.txt", "data": "d"},
        ],
        metadata={"batch": "7"},
    )
    assert [m.metadata for m in many] == [{"batch": "7"}, {"batch": "7"}], many
    assert (await sandbox.files.get_info("/home/user/meta/d.txt")).metadata == {"batch": "7"}


async def _settle(events, done, timeout=10.0):
    for _ in range(int(timeout / 0.1)):
        if done(events):
            return
        await asyncio.sleep(0.1)


async def test_watch_dir_reports_every_change_as_it_happens(sandbox):
    await sandbox.files.make_dir("/home/user/live")
    events = []
    kw = {"include_entry": True} if HAS_ENTRY else {}
    handle = await sandbox.files.watch_dir(
        "/home/user/live", on_event=events.append, recursive=True, **kw
    )
    try:
        # Made, written, mode changed, renamed, removed; and a file that lives a moment only.
        await sandbox.commands.run(
            "cd /home/user/live && echo one > f.txt && chmod 600 f.txt && mv f.txt g.txt"
            " && touch brief && rm brief && rm g.txt"
        )
        # A tree made at once, after the watch started: its deepest file is seen.
        await sandbox.commands.run("mkdir -p /home/user/live/a/b/c && echo deep > /home/user/live/a/b/c/deep.txt")
        # A folder made later is followed: a file written there afterwards is seen.
        await sandbox.commands.run("sleep 0.3; echo later > /home/user/live/a/b/c/later.txt")
        await _settle(events, lambda ev: any(e.name == "a/b/c/later.txt" for e in ev))
    finally:
        await handle.stop()
    kinds = [(e.name, e.type.name) for e in events]
    for expected in [
        ("f.txt", "CREATE"),
        ("f.txt", "WRITE"),
        ("f.txt", "CHMOD"),
        ("f.txt", "RENAME"),
        ("g.txt", "CREATE"),
        ("g.txt", "REMOVE"),
        ("brief", "CREATE"),
        ("brief", "REMOVE"),
        ("a", "CREATE"),
        ("a/b/c/deep.txt", "CREATE"),
        ("a/b/c/later.txt", "CREATE"),
    ]:
        assert expected in kinds, (expected, kinds)
    if HAS_ENTRY:
        later = [e for e in events if e.name == "a/b/c/later.txt" and e.type.name == "CREATE"]
        assert later[0].entry is not None and later[0].entry.path == "/home/user/live/a/b/c/later.txt", later


async def test_a_watch_ends_when_its_directory_is_removed(sandbox):
    await sandbox.files.make_dir("/home/user/gone")
    ended = asyncio.get_running_loop().create_future()
    handle = await sandbox.files.watch_dir(
        "/home/user/gone",
        on_event=lambda e: None,
        on_exit=lambda err: ended.done() or ended.set_result(err),
    )
    try:
        await sandbox.commands.run("rm -rf /home/user/gone")
        await asyncio.wait_for(ended, 10)
    finally:
        await handle.stop()
