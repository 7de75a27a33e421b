import ast, json, os, sys, traceback, types
_airlock_stdin = sys.stdin.buffer
class ToolError(Exception):
    """A tool call or a fetch the host refused or could not perform."""
def _airlock_host(request):
    # One frame on stdout (see channel.rs), one answer line on stdin.
    sys.stdout.flush()
    frame = b"\x1d\x1dairlock-host-call\x1d" + json.dumps(request).encode() + b"\n"
    while frame:
        frame = frame[os.write(1, frame):]
    answer = json.loads(_airlock_stdin.readline() or b'{"error": "the host went away"}')
    if "error" in answer:
        raise ToolError(answer["error"])
    return answer["ok"]
class _Tools:
    def __init__(self, names):
        self._names = names
    def __dir__(self):
        return list(self._names)
    def __getattr__(self, name):
        if name not in self._names:
            known = ", ".join(self._names) or "none"
            raise AttributeError(f"no tool {name!r} in this sandbox (its tools: {known})")
        def call(args=None, **kwargs):
            return _airlock_host({"tool": name, "args": kwargs if args is None and kwargs else args})
        return call
class Response:
    def __init__(self, url, status, headers, body):
        self.url, self.status, self.headers, self._body = url, status, headers, body
        self.ok = 200 <= status < 300
    def text(self):
        return self._body
    def json(self):
        return json.loads(self._body)
def fetch(url, method="GET", headers=None, body=None):
    """One HTTP request through the sandbox's egress proxy (its rules apply)."""
    got = _airlock_host({"fetch": {"url": str(url), "method": str(method).upper(),
        "headers": dict(headers or {}), "body": None if body is None else str(body)}})
    return Response(str(url), got["status"], got["headers"], got["body"])
_airlock = types.ModuleType("airlock")
_airlock.tools = _Tools([n for n in os.environ.get("AIRLOCK_TOOLS", "").split(",") if n])
_airlock.fetch, _airlock.Response, _airlock.ToolError = fetch, Response, ToolError
sys.modules["airlock"] = _airlock
def _airlock_scope():
    return {"__name__": "__main__", "__builtins__": __builtins__,
            "tools": _airlock.tools, "fetch": fetch, "ToolError": ToolError}
def _airlock_eval(source, scope):
    tree = ast.parse(source, "<eval>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<eval>", "exec"), scope)
    return None if last is None else eval(compile(last, "<eval>", "eval"), scope)
def _airlock_cell(scope):
    """Reads one code frame (its length in bytes on a line, then the code; stdin stays open
    for the answers to host calls) and runs it: its exit status and value."""
    size = _airlock_stdin.readline()
    if not size:
        os._exit(0)
    source = _airlock_stdin.read(int(size)).decode()
    try:
        return 0, _airlock_eval(source, scope)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0, None
        print(stop.code, file=sys.stderr)
        return 1, None
    except BaseException:
        traceback.print_exc()
        return 1, None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
if os.environ.get("AIRLOCK_SESSION"):
    # A kept instance (a context): one scope for every cell; each cell's end is a frame.
    _airlock_kept = _airlock_scope()
    while True:
        _airlock_status, _airlock_value = _airlock_cell(_airlock_kept)
        _airlock_host({"done": {"status": _airlock_status,
            "value": json.loads(json.dumps(_airlock_value, default=repr))}})
_airlock_status, _airlock_value = _airlock_cell(_airlock_scope())
if _airlock_status == 0:
    sys.stdout.write("\x1e" + json.dumps(_airlock_value, default=repr) + "\n")
    sys.stdout.flush()
# The instance is thrown away: skip the interpreter's finalisation (tens of milliseconds).
os._exit(_airlock_status)
