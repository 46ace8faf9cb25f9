"""Brig's code-interpreter server: the HTTP contract of E2B's code interpreter (what the
`e2b-code-interpreter` package calls on port 49999), on Jupyter kernels run with Debian's
python3-ipykernel and python3-jupyter-client.

    POST   /execute                {code, context_id?, language?, env_vars?}
           -> a stream of JSON lines: stdout, stderr, result, error,
              number_of_executions, end_of_execution
    POST   /contexts               {language?, cwd?} -> {id, language, cwd}
    GET    /contexts               -> [{id, language, cwd}]
    DELETE /contexts/{id}
    POST   /contexts/{id}/restart
    GET    /health

One kernel per context; executions in one context run one at a time, in order. Brig builds
this into its `code-interpreter-v1` template (host/e2b/templates/code-interpreter)."""

import argparse
import datetime
import http.server
import json
import socket
import threading
import uuid

from jupyter_client.manager import KernelManager

LANGUAGES = {"python": "python3"}
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
MAX_BODY = 16 << 20


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Context:
    """A kernel and the lock that keeps its executions in order."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.manager = KernelManager(kernel_name=LANGUAGES[language])
        self.manager.start_kernel(cwd=cwd)
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def run(self, code, env_vars, emit):
        """Runs `code`, calling `emit(message)` for each output; False once `emit` fails."""
        with self.lock:
            if env_vars:
                setup = "import os as __os; __saved = {k: __os.environ.get(k) for k in %r}; __os.environ.update(%r)"
                self._silent(setup % (list(env_vars), env_vars))
            try:
                return self._run(code, emit)
            finally:
                if env_vars:
                    self._silent(
                        "[__os.environ.pop(k, None) if v is None else __os.environ.__setitem__(k, v) for k, v in __saved.items()]"
                    )

    def _silent(self, code):
        msg_id = self.client.execute(code, silent=True, store_history=False)
        self._wait_idle(msg_id)

    def _wait_idle(self, msg_id):
        while True:
            msg = self.client.get_iopub_msg(timeout=None)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def _run(self, code, emit):
        msg_id = self.client.execute(code, allow_stdin=False, stop_on_error=True)
        listening = True
        while True:
            msg = self.client.get_iopub_msg(timeout=None)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            out = None
            if kind == "stream":
                out = {"type": content["name"], "text": content["text"], "timestamp": now()}
            elif kind in ("execute_result", "display_data"):
                out = {"type": "result", "is_main_result": kind == "execute_result"}
                extra = {}
                for mime, value in content.get("data", {}).items():
                    field = MIME_FIELDS.get(mime)
                    if field:
                        out[field] = value
                    else:
                        extra[mime] = value
                if extra:
                    out["extra"] = extra
            elif kind == "error":
                out = {
                    "type": "error",
                    "name": content["ename"],
                    "value": content["evalue"],
                    "traceback": "\n".join(content["traceback"]),
                }
            elif kind == "execute_input":
                out = {"type": "number_of_executions", "execution_count": content["execution_count"]}
            elif kind == "status" and content["execution_state"] == "idle":
                if listening:
                    emit({"type": "end_of_execution"})
                return listening
            if out is not None and listening and not emit(out):
                # The caller left: stop what it started.
                listening = False
                self.manager.interrupt_kernel()

    def restart(self):
        with self.lock:
            self.manager.restart_kernel(now=True)
            self.client.wait_for_ready(timeout=60)

    def close(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class Contexts:
    def __init__(self, cwd):
        self.cwd = cwd
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd):
        context = Context(language, cwd or self.cwd)
        with self.lock:
            self.by_id[context.id] = context
        return context

    def default(self, language):
        with self.lock:
            found = self.defaults.get(language)
        if found:
            return found
        context = self.create(language, self.cwd)
        with self.lock:
            return self.defaults.setdefault(language, context)

    def get(self, context_id):
        with self.lock:
            return self.by_id.get(context_id)

    def remove(self, context_id):
        with self.lock:
            context = self.by_id.pop(context_id, None)
            for language, default in list(self.defaults.items()):
                if default is context:
                    del self.defaults[language]
        if context:
            context.close()
        return context is not None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    contexts = None

    def setup(self):
        super().setup()
        # Output goes out line by line: no waiting for the last line's acknowledgement.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("the request body is too large")
        raw = self.rfile.read(length) if length else b"{}"
        return json.loads(raw or b"{}")

    def _answer(self, status, value=None):
        body = b"" if value is None else json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _language(self, language):
        language = (language or "python").lower()
        if language not in LANGUAGES:
            raise LookupError(f"language {language!r} is not served here (only python)")
        return language

    def do_GET(self):
        if self.path == "/health":
            return self._answer(200, {"status": "ok"})
        if self.path == "/contexts":
            with self.contexts.lock:
                listed = [c.describe() for c in self.contexts.by_id.values()]
            return self._answer(200, listed)
        self._answer(404, {"message": f"no route {self.path}"})

    def do_DELETE(self):
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            if self.contexts.remove(parts[1]):
                return self._answer(204)
            return self._answer(404, {"message": f"no context {parts[1]}"})
        self._answer(404, {"message": f"no route {self.path}"})

    def do_POST(self):
        try:
            body = self._body()
        except ValueError as e:
            return self._answer(400, {"message": str(e)})
        parts = self.path.strip("/").split("/")
        try:
            if parts == ["execute"]:
                return self._execute(body)
            if parts == ["contexts"]:
                context = self.contexts.create(self._language(body.get("language")), body.get("cwd"))
                return self._answer(200, context.describe())
            if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                context = self.contexts.get(parts[1])
                if not context:
                    return self._answer(404, {"message": f"no context {parts[1]}"})
                context.restart()
                return self._answer(204)
        except LookupError as e:
            return self._answer(400, {"message": str(e)})
        self._answer(404, {"message": f"no route {self.path}"})

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._answer(400, {"message": "no code"})
        if body.get("context_id"):
            context = self.contexts.get(body["context_id"])
            if not context:
                return self._answer(404, {"message": f"no context {body['context_id']}"})
        else:
            context = self.contexts.default(self._language(body.get("language")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(message):
            line = (json.dumps(message) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                return True
            except OSError:
                return False

        if context.run(code, body.get("env_vars") or {}, emit):
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=49999)
    parser.add_argument("--cwd", default="/home/user")
    args = parser.parse_args()
    Handler.contexts = Contexts(args.cwd)
    # The default Python kernel starts now, so the first run_code does not wait for it.
    threading.Thread(target=Handler.contexts.default, args=("python",), daemon=True).start()
    server = http.server.ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
