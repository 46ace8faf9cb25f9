"""E2B's template API through the real `e2b` package: `Template.build` (sync and async) with
every step kind, the step cache, a failing step, names with tags, `Template.exists`,
`from_dockerfile`, `from_image` from a registry, and start/ready commands that a create from
the template waits for."""

import os
import time

import pytest
from e2b import AsyncSandbox, AsyncTemplate, BuildException, Template, wait_for_file


def _context(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.sh").write_text("echo main\n")
    (tmp_path / "app" / "main.sh").chmod(0o755)
    (tmp_path / "notes.txt").write_text("notes\n")


def _steps(logs):
    """The build's step lines (`[i/n] RUN ...`, with ` (cached)` when taken from the cache)."""
    return [e.message for e in logs if e.message.startswith("[")]


async def test_a_template_builds_every_step_kind_and_a_rebuild_takes_the_cache(tmp_path):
    _context(tmp_path)
    template = (
        Template(file_context_path=tmp_path)
        .from_base_image()
        .set_envs({"GREETING": "hello", "TWO": "two words"})
        .run_cmd("echo built-as-$(id -un)")
        .copy("app", "/home/user/app")
        .copy("notes.txt", "/home/user/notes.txt", mode=0o600)
        .run_cmd("mkdir -p /opt/tool && echo tool > /opt/tool/v", user="root")
        .set_workdir("/home/user/app")
        .set_start_cmd("echo started > /tmp/started; sleep 1000", wait_for_file("/tmp/started"))
    )
    logs = []
    info = Template.build(template, "brig-tpl", on_build_logs=logs.append)
    assert info.template_id
    messages = [e.message for e in logs]
    assert "built-as-user" in messages, messages
    assert Template.exists("brig-tpl")
    assert not Template.exists("no-such-template")

    sb = await AsyncSandbox.create(template="brig-tpl", timeout=300)
    try:
        r = await sb.commands.run(
            "cat /tmp/started; echo $GREETING $TWO; pwd; cat main.sh; "
            "stat -c '%U %a' /home/user/notes.txt /home/user/app; cat /opt/tool/v; id -un"
        )
        assert r.stdout == (
            "started\nhello two words\n/home/user/app\necho main\n"
            "user 600\nuser 755\ntool\nuser\n"
        ), r.stdout

        # A filesystem-only pause ends every process and keeps the files; the resume is a
        # cold boot: the template's start command runs again before `connect` answers.
        await sb.commands.run("rm /tmp/started; echo kept > /home/user/kept.txt")
        await sb.commands.run("sleep 777", background=True)
        await sb.pause(mode="filesystem")
        assert (await sb.get_info()).state.value == "paused"
        await sb.connect()
        r = await sb.commands.run("cat /tmp/started /home/user/kept.txt; pgrep -f '^sleep 777' || echo none")
        assert r.stdout == "started\nkept\nnone\n", r.stdout
    finally:
        await sb.kill()

    # Unchanged: every step from the cache.
    again = []
    started = time.monotonic()
    await AsyncTemplate.build(template, "brig-tpl", on_build_logs=again.append)
    layer_steps = [s for s in _steps(again) if " RUN " in s or " COPY " in s or "WORKDIR" in s]
    assert layer_steps and all(s.endswith("(cached)") for s in layer_steps), _steps(again)
    assert time.monotonic() - started < 30

    # One file changed: its COPY and what follows run again, what precedes is cached.
    (tmp_path / "notes.txt").write_text("changed\n")
    changed = []
    Template.build(template, "brig-tpl:v2", on_build_logs=changed.append)
    runs = {s.split("] ", 1)[1].removesuffix(" (cached)"): s.endswith("(cached)") for s in _steps(changed)}
    assert runs["RUN echo built-as-$(id -un)"] is True, runs
    assert runs["COPY notes.txt /home/user/notes.txt"] is False, runs
    sb = await AsyncSandbox.create(template="brig-tpl:v2", timeout=120)
    try:
        assert (await sb.commands.run("cat /home/user/notes.txt")).stdout == "changed\n"
    finally:
        await sb.kill()


async def test_a_failing_step_fails_the_build_with_its_output():
    template = Template().from_base_image().run_cmd("echo before-failing; exit 7")
    logs = []
    with pytest.raises(BuildException) as failed:
        Template.build(template, "brig-fails", on_build_logs=logs.append)
    assert "exit code 7" in str(failed.value), failed.value
    assert "before-failing" in [e.message for e in logs]


async def test_from_dockerfile_and_from_a_registry_image(tmp_path):
    _context(tmp_path)
    dockerfile = (
        "FROM e2bdev/base\nENV A=1\nRUN echo from-dockerfile > /tmp/df\n"
        "WORKDIR /srv\nCOPY notes.txt /srv/notes.txt\n"
    )
    template = Template(file_context_path=tmp_path).from_dockerfile(dockerfile)
    await AsyncTemplate.build(template, "brig-df")
    sb = await AsyncSandbox.create(template="brig-df", timeout=120)
    try:
        r = await sb.commands.run("cat /tmp/df /srv/notes.txt; echo $A; id -un")
        assert r.stdout == "from-dockerfile\nnotes\n1\nuser\n", r.stdout
    finally:
        await sb.kill()

    reference = os.environ["BRIG_TEST_IMAGE_REF"]
    pulled = (
        Template(file_context_path=tmp_path)
        .from_image(reference)
        .copy("notes.txt", "/home/user/n.txt")
        .run_cmd("cat /etc/pulled")
        # E2B's SDK runs commands with /bin/bash, which this small image lacks.
        .run_cmd("printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash", user="root")
    )
    logs = []
    Template.build(pulled, "brig-pulled", on_build_logs=logs.append)
    assert "from a registry" in [e.message for e in logs]
    sb = await AsyncSandbox.create(template="brig-pulled", timeout=120)
    try:
        r = await sb.commands.run("cat /home/user/n.txt /etc/pulled")
        assert r.stdout == "notes\nfrom a registry\n", r.stdout
    finally:
        await sb.kill()


async def test_tags_users_and_deleting_a_template(tmp_path):
    import httpx

    template = (
        Template()
        .from_base_image()
        .set_user("root")
        .run_cmd("id -un > /whoami")
        .set_user("user")
    )
    Template.build(template, "brig-tags:one")
    Template.assign_tags("brig-tags:one", ["two"])
    tags = {t.tag for t in Template.get_tags("brig-tags")}
    assert {"one", "two"} <= tags, tags
    sb = await AsyncSandbox.create(template="brig-tags:two", timeout=60)
    try:
        assert (await sb.commands.run("cat /whoami; id -un")).stdout == "root\nuser\n"
    finally:
        await sb.kill()
    Template.remove_tags("brig-tags", ["two"])
    assert "two" not in {t.tag for t in Template.get_tags("brig-tags")}
    url, key = os.environ["E2B_API_URL"], os.environ["E2B_API_KEY"]
    r = httpx.delete(f"{url}/templates/brig-tags", headers={"X-API-Key": key})
    assert r.status_code == 204, r.text
    assert not Template.exists("brig-tags")


async def test_a_built_in_templates_name_is_refused():
    """`base` (the gateway's configured template) and the code interpreter's names are not a
    user's to build under: 409, and the SDK's build fails with the reason."""
    import httpx

    url, key = os.environ["E2B_API_URL"], os.environ["E2B_API_KEY"]
    for name in ["base", "code-interpreter-v1", "code-interpreter:v2"]:
        r = httpx.post(f"{url}/v3/templates", headers={"X-API-Key": key}, json={"name": name})
        assert r.status_code == 409, (name, r.status_code, r.text)
        assert "built-in" in r.json()["message"], r.text
    with pytest.raises(Exception) as refused:
        Template.build(Template().from_base_image().run_cmd("true"), "base")
    assert "built-in" in str(refused.value), refused.value
