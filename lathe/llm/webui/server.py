"""The web page's HTTP side (FastAPI): static files, the Train / Watch / Chat / Export routes, the key check
on every route, bounded request bodies, and every path kept under the root."""

from __future__ import annotations

import hmac
import json
import os
import tempfile
from importlib import resources

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError:  # this module is imported only by `lathe webui` / `lathe webchat`
    raise ImportError("lathe webui needs FastAPI and uvicorn: pip install 'lathe[api]'") from None

from lathe.llm.inference.browser import Boundary
from lathe.llm.webui import forms, runs
from lathe.llm.webui.chat import ChatSession
from lathe.llm.webui.jobs import Jobs, run_short
from lathe.llm.webui.paths import PathError, check_config_paths, check_dataset_files, inside
from lathe.llm.webui.strings import STRINGS
from lathe.llm.workflows.lock import OutputDirBusy, busy_message

MAX_BODY = 1 << 20  # JSON requests: 1 MiB
MAX_UPLOAD = 32 << 20  # a dataset file: 32 MiB
MAX_DEPTH = 32  # JSON nesting of a request body
SHORT_TIMEOUT = 300  # seconds for --dry_run, data preview and export
STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
CHAT_ONLY = ("/", "/static/", "/api/strings", "/api/chat")  # what `lathe webchat` serves
COOKIE = "lathe_webui_key"
# export_gguf's types offered by the export tab (lathe.llm.gguf; the k-quants need llama.cpp's quantizer)
GGUF_TYPES = ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m")
EXPORT_KEYS = (
    "model_name_or_path",
    "adapter_name_or_path",
    "template",
    "finetuning_type",
    "export_dir",
    "export_size",
    "infer_dtype",
    "export_gguf",
)


def _static(name: str) -> str:
    return resources.files("lathe.llm.webui").joinpath("static", name).read_text(encoding="utf-8")


async def _form(request: Request) -> dict:
    """The JSON body, at most MAX_BODY bytes (the guard checked Content-Length; this checks what came) and
    MAX_DEPTH levels deep (checked before parsing: Python's parser recurses once per level)."""
    from lathe.llm.inference.requests import json_depth

    body = await request.body()
    if len(body) > MAX_BODY:
        raise ValueError(f"request body over {MAX_BODY} bytes.")
    depth = json_depth(body)
    if depth > MAX_DEPTH:
        raise ValueError(f"the request body nests JSON {depth} levels deep; at most {MAX_DEPTH} are allowed.")
    try:
        form = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError("expected a JSON body.") from None
    if not isinstance(form, dict):
        raise ValueError("expected a JSON object.")
    return form


def _authorized(request: Request, api_key: str) -> bool:
    given = request.headers.get("authorization", "")
    candidates = [
        given[7:] if given.lower().startswith("bearer ") else "",
        request.cookies.get(COOKIE, ""),
        request.query_params.get("key", ""),
    ]
    return any(candidate and hmac.compare_digest(candidate.encode(), api_key.encode()) for candidate in candidates)


def _add_guard(app: FastAPI, api_key: str | None, chat_only: bool, boundary: Boundary) -> None:
    """Every request: Host and Origin (inference/browser.py), the key (when there is one), the routes webchat
    serves, a bounded body; error replies."""

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refused = boundary.refusal(request.method, request.headers)
        if refused is not None:
            return JSONResponse({"error": f"refused: {refused}"}, 403)
        if api_key is not None and not _authorized(request, api_key):
            return JSONResponse({"error": "a key is required (Authorization: Bearer KEY or /?key=KEY)."}, 401)
        path = request.url.path
        if chat_only and not any(path == p or (p != "/" and path.startswith(p)) for p in CHAT_ONLY):
            return JSONResponse({"error": "lathe webchat serves the chat only."}, 404)
        limit = MAX_UPLOAD if path == "/api/upload" else MAX_BODY
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return JSONResponse({"error": f"request body over {limit} bytes."}, 413)
        if request.method == "POST" and length is None:
            return JSONResponse({"error": "a Content-Length header is required."}, 411)
        response = await call_next(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Content-Security-Policy"] = "default-src 'self'; img-src 'self' data:"
        if api_key is not None and request.query_params.get("key") == api_key:
            response.set_cookie(COOKIE, api_key, httponly=True, samesite="strict")
        return response

    @app.exception_handler(PathError)
    async def outside(_request, error: PathError):
        return JSONResponse({"error": str(error)}, 403)

    @app.exception_handler(OutputDirBusy)
    async def busy(_request, error: OutputDirBusy):
        return JSONResponse({"error": str(error)}, 409)

    @app.exception_handler(ValueError)
    async def bad_input(_request, error: ValueError):
        return JSONResponse({"error": str(error)}, 400)

    @app.exception_handler(FileNotFoundError)
    async def missing(_request, error: FileNotFoundError):
        return JSONResponse({"error": str(error)}, 404)

    @app.exception_handler(TypeError)
    async def wrong_type(request, error: TypeError):  # a field of the wrong JSON type (a list for a name, ...)
        return JSONResponse({"error": f"{request.url.path}: a field has the wrong type ({error})."}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, error: StarletteHTTPException):  # unknown routes, wrong methods: JSON too
        return JSONResponse({"error": str(error.detail)}, error.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_query(request, error: RequestValidationError):  # a missing or mistyped query parameter
        where = "; ".join(f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors())
        return JSONResponse({"error": f"{request.url.path}: {where}."}, 400)


def _add_page_routes(app: FastAPI, root: str, chat_config: dict | None) -> None:
    @app.get("/", response_class=HTMLResponse)
    def index():
        return _static("index.html")

    @app.get("/static/{name}")
    def static(name: str):
        if name not in STATIC:
            raise HTTPException(404)
        return Response(_static(name), media_type=STATIC[name])

    @app.get("/api/strings")
    def strings():
        return {
            "strings": STRINGS,
            "methods": list(forms.METHODS),
            "stages": forms.STAGES,
            "gguf_types": list(GGUF_TYPES),
            "defaults": forms.DEFAULTS,
            "method_keys": {name: keys for name, (_, keys) in forms.METHODS.items()},
            "stage_keys": forms.STAGE_KEYS,
            "chat": chat_config,
        }

    @app.get("/api/models")
    def models():
        return {"models": forms.list_models(root)}

    @app.get("/api/datasets")
    def datasets(dataset_dir: str = "data"):
        return {"datasets": forms.list_datasets(root, dataset_dir)}

    @app.get("/api/template")
    def template(model: str):
        return {"templates": forms.suggest_template(root, model)}

    @app.post("/api/upload")
    async def upload(request: Request, name: str, dataset_dir: str = "data"):
        if not forms.NAME.match(name):
            raise ValueError(f"upload name {name!r}: letters, digits, '.', '_' and '-' only.")
        body = await request.body()
        if len(body) > MAX_UPLOAD:
            raise ValueError(f"uploads are at most {MAX_UPLOAD} bytes.")
        target = inside(root, os.path.join(dataset_dir, name), "upload")
        if name == "dataset_info.json":  # the files it names must be under the root too
            try:
                info = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise ValueError("dataset_info.json: not JSON.") from None
            check_dataset_files(root, os.path.dirname(target), info)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(body)
        return {"saved": runs.relative(root, target), "bytes": len(body)}


def _short(root: str, values: dict, args: list[str]) -> dict:
    """`lathe ARGS` with CONFIG (in args) standing for a temporary copy of `values` (plan, preview, export)."""
    folder = inside(root, forms.CONFIG_FOLDER)
    os.makedirs(folder, exist_ok=True)
    handle, path = tempfile.mkstemp(suffix=".yaml", prefix=".webui-", dir=folder)
    with os.fdopen(handle, "w", encoding="utf-8") as f:
        f.write(forms.config_yaml(values))
    try:
        return run_short([path if arg == "CONFIG" else arg for arg in args], root, SHORT_TIMEOUT)
    finally:
        os.remove(path)


def _add_train_routes(app: FastAPI, root: str, jobs: Jobs) -> None:
    @app.post("/api/config")
    async def config(request: Request):
        values = forms.build_config(root, await _form(request))
        return {"yaml": forms.config_yaml(values), "run": forms.run_name(root, values)}

    @app.post("/api/plan")
    async def plan(request: Request):
        return _short(root, forms.build_config(root, await _form(request)), ["train", "CONFIG", "--dry_run"])

    @app.post("/api/preview")
    async def preview(request: Request):
        return _short(root, forms.build_config(root, await _form(request)), ["data", "preview", "CONFIG", "-n", "3"])

    @app.post("/api/start")
    async def start(request: Request):
        form = await _form(request)
        values = forms.build_config(root, form)
        shown = form.get("yaml")
        if shown is not None and shown != forms.config_yaml(values):
            # The page shows the YAML before it starts: a form changed since (or a stale page) starts nothing.
            raise ValueError("the form changed after its YAML was shown: check the YAML on the page and start again.")
        busy = busy_message(values["output_dir"])  # a run from the command line writes there
        if busy is not None:
            raise OutputDirBusy(busy)
        path = forms.save_config(root, values)
        run = forms.run_name(root, values)
        jobs.start(run, path)
        return {"run": run, "config": runs.relative(root, path), "yaml": forms.config_yaml(values)}

    @app.post("/api/stop")
    async def stop(request: Request):
        run = _run(root, (await _form(request)).get("run"))
        jobs.stop(run)
        return {"run": run, "status": jobs.status(run)}

    @app.post("/api/resume")
    async def resume(request: Request):
        run = _run(root, (await _form(request)).get("run"))
        path = inside(root, os.path.join(forms.CONFIG_FOLDER, run.replace("/", "_") + ".yaml"), "config")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no saved config for {run!r} (resume runs started from the command line there).")
        busy = busy_message(os.path.join(root, run))
        if busy is not None:
            raise OutputDirBusy(busy)
        return {"run": run, "checkpoint": runs.relative(root, jobs.resume(run, path))}


def _run(root: str, run) -> str:
    """A run's name (its output_dir relative to root), checked to be a folder under root."""
    folder = inside(root, run if isinstance(run, str) else "", "run")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no run {run!r} under the root.")
    return runs.relative(root, folder)


def _add_watch_routes(app: FastAPI, root: str, jobs: Jobs) -> None:
    @app.get("/api/runs")
    def list_runs():
        return {"runs": [runs.summary(root, run, jobs.status(run)) for run in runs.find_runs(root)]}

    @app.get("/api/run")
    def run_detail(run: str):
        run = _run(root, run)
        folder = os.path.join(root, run)
        return {
            **runs.summary(root, run, jobs.status(run)),
            "points": runs.read_points(folder),
            "log": runs.log_tail(folder),
        }


def _add_chat_export_routes(app: FastAPI, root: str, chat: ChatSession) -> None:
    @app.post("/api/chat/load")
    async def chat_load(request: Request):
        return chat.load(await _form(request))

    @app.post("/api/chat")
    async def chat_answer(request: Request):
        form = await _form(request)
        pieces = chat.stream(form.get("messages"), form.get("max_new_tokens"), form.get("temperature"))
        return StreamingResponse(pieces, media_type="text/plain; charset=utf-8")

    @app.post("/api/export")
    async def export(request: Request):
        form = await _form(request)
        values = {key: forms.parse_value(form[key]) for key in EXPORT_KEYS if form.get(key) not in (None, "")}
        values = check_config_paths(root, values)
        result = _short(root, values, ["export", "CONFIG"])
        if result["code"] == 0 and values.get("export_dir"):
            result["files"] = sorted(os.listdir(values["export_dir"]))
            result["export_dir"] = runs.relative(root, values["export_dir"])
        return result

    @app.get("/api/download")
    def download(path: str):
        target = inside(root, path)
        if not os.path.isfile(target):
            raise FileNotFoundError(f"no file {path!r} under the root.")
        return FileResponse(target, filename=os.path.basename(target))


def create_app(
    root: str, api_key: str | None = None, chat_config: dict | None = None, boundary: Boundary | None = None
) -> FastAPI:
    """The application serving `root` (every path stays under it); with `api_key`, every route needs it
    (Authorization: Bearer KEY, or the cookie set by opening /?key=KEY once). With `chat_config` (lathe
    webchat), only the chat. `boundary` (default: bound to 127.0.0.1) says which Host / Origin headers pass."""
    root = os.path.realpath(root)
    app = FastAPI(title="lathe webui", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.jobs, app.state.chat = Jobs(root), ChatSession(root)
    _add_guard(app, api_key, chat_only=chat_config is not None, boundary=boundary or Boundary())
    _add_page_routes(app, root, chat_config)
    _add_train_routes(app, root, app.state.jobs)
    _add_watch_routes(app, root, app.state.jobs)
    _add_chat_export_routes(app, root, app.state.chat)
    return app


def check_port(host: str, port: int) -> None:
    """One line when the port is taken, before the page says it serves (uvicorn would log a traceback-like
    error after our "serving" line). The probe binds as uvicorn does (SO_REUSEADDR), then lets go."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"port {port} on {host} is taken ({error.strerror}): stop what uses it, or choose another with "
                f"--port (e.g. --port {port + 1})."
            ) from None


def serve(
    root: str,
    host: str = "127.0.0.1",
    port: int = 7860,
    api_key: str | None = None,
    chat_config=None,
    allowed_hosts: tuple[str, ...] = (),
) -> int:
    """`lathe webui`: serve the page until Ctrl-C (runs it started go on). A host other than loopback needs a key."""
    import uvicorn

    if host not in LOOPBACK and not api_key:
        raise ValueError(f"--host {host} opens the page to other machines: give a key (--api_key or LATHE_WEBUI_KEY).")
    if not os.path.isdir(root):
        raise NotADirectoryError(f"--root {root!r} is not a folder.")
    check_port(host, port)
    app = create_app(root, api_key, chat_config, Boundary(host, allowed_hosts))
    if chat_config is not None:
        print("lathe webchat: loading the model ...", flush=True)
        app.state.chat.load(chat_config, whole_config=True)
    where = f"http://{host}:{port}/" + ("?key=KEY" if api_key else "")
    print(f"lathe webui: serving {os.path.realpath(root)} on {where} (Ctrl-C stops the page; runs go on)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=5, limit_concurrency=64)
    return 0
