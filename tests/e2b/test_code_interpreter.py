"""The real `e2b-code-interpreter` package against Brig's code-interpreter template (built by
Brig's own builder from Debian's Jupyter packages on first use; served by our server on port
49999, reached through the gateway's port route): stateful contexts, streamed output, rich
results, errors, env vars, context management."""

import asyncio

from e2b_code_interpreter import AsyncSandbox


async def test_run_code_keeps_state_streams_output_and_reports_errors():
    # The first create builds the template (apt inside a build container): a long request.
    sb = await AsyncSandbox.create(timeout=600, request_timeout=900)
    try:
        first = await sb.run_code("x = 41\nx + 1")
        assert first.error is None, first.error
        assert first.text == "42"
        assert first.results[0].is_main_result
        assert (await sb.run_code("x * 2")).text == "82", "a variable kept across calls"

        seen = []
        streamed = await sb.run_code(
            "import sys, time\nprint('out', flush=True)\ntime.sleep(0.2)\nprint('err', file=sys.stderr)",
            on_stdout=lambda m: seen.append(("stdout", m.line)),
            on_stderr=lambda m: seen.append(("stderr", m.line)),
        )
        assert streamed.logs.stdout == ["out\n"] and streamed.logs.stderr == ["err\n"], streamed.logs
        assert seen == [("stdout", "out\n"), ("stderr", "err\n")], seen

        failed = await sb.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError", failed
        assert "division by zero" in failed.error.value

        rich = await sb.run_code(
            "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))\n{'a': 1}"
        )
        assert rich.results[0].html == "<b>hi</b>" and not rich.results[0].is_main_result
        assert rich.results[1].is_main_result and rich.results[1].text == "{'a': 1}"

        env = await sb.run_code("import os\nos.environ.get('GREETING')", envs={"GREETING": "hello"})
        assert env.text == "'hello'"
        assert (await sb.run_code("os.environ.get('GREETING')")).text is None, "env vars last one run"

        ctx = await sb.create_code_context(cwd="/tmp")
        assert ctx.cwd == "/tmp"
        assert (await sb.run_code("import os\nos.getcwd()", context=ctx)).text == "'/tmp'"
        missing = await sb.run_code("x", context=ctx)
        assert missing.error and missing.error.name == "NameError", "contexts are separate"
        listed = await sb.list_code_contexts()
        assert ctx.id in [c.id for c in listed]
        await sb.restart_code_context(ctx)
        await sb.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in await sb.list_code_contexts()]

        # Commands run beside the kernel, as E2B's user.
        assert (await sb.commands.run("id -un")).stdout == "user\n"
    finally:
        await sb.kill()


async def test_concurrent_runs_in_one_context_run_in_order():
    sb = await AsyncSandbox.create(timeout=300, request_timeout=900)
    try:
        await sb.run_code("n = []")
        runs = [sb.run_code(f"n.append({i})") for i in range(5)]
        await asyncio.gather(*runs)
        assert sorted((await sb.run_code("n")).text.strip("[]").split(", ")) == ["0", "1", "2", "3", "4"]
    finally:
        await sb.kill()
