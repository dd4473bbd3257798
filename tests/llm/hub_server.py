"""Test helper: a Hugging Face Hub stand-in on 127.0.0.1 serving the part of the Hub's API that
huggingface_hub's snapshot_download uses (checked against huggingface_hub 2.4):

    GET  /api/{models,datasets}/{repo}/revision/{rev}   -> {"id", "sha", "siblings"}
    GET  /api/{models,datasets}/{repo}/tree/{rev}       -> [{"type": "file", "path", "size", "oid"}]
    HEAD|GET /{repo}/resolve/{rev}/{path}                (datasets: /datasets/{repo}/resolve/...) with
         X-Repo-Commit, ETag and Content-Length

Every request's path is recorded, so a test can tell which files were downloaded, and so is every
Authorization header (which token was sent).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class HubStandIn:
    """Repositories (repo_type, repo_id) -> {"commit": sha, "files": {path: bytes}}, served on a free port."""

    def __init__(self):
        self.repos: dict[tuple[str, str], dict] = {}
        self.requests: list[str] = []
        self.authorizations: set[str | None] = set()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add_folder(self, folder, repo_id: str, repo_type: str = "model", commit: str = "c" * 40) -> None:
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}
        self.repos[(repo_type, repo_id)] = {"commit": commit, "files": files}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _send(self, status: int, payload: bytes, headers: dict, body: bool) -> None:
                self.send_response(status)
                for key, value in {"Content-Length": str(len(payload)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _serve(self, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                hub.authorizations.add(self.headers.get("Authorization"))
                parts = path.strip("/").split("/")
                if parts[0] == "api":  # api/{models|datasets}/{org}/{name}/{revision|tree}/{rev}
                    repo = hub.repos.get((parts[1][:-1], "/".join(parts[2:4])))
                    if repo is None or len(parts) < 6:
                        return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)
                    if parts[4] == "revision":
                        info = {
                            "id": "/".join(parts[2:4]),
                            "sha": repo["commit"],
                            "siblings": [{"rfilename": name} for name in repo["files"]],
                        }
                    else:
                        info = [
                            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in repo["files"].items()
                        ]
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
                repo_type = "dataset" if parts[0] == "datasets" else "model"
                parts = parts[1:] if repo_type == "dataset" else parts
                repo = hub.repos.get((repo_type, "/".join(parts[:2])))
                name = "/".join(parts[4:])
                if repo is None or parts[2:3] != ["resolve"] or name not in repo["files"]:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, body)
                data = repo["files"][name]
                headers = {"X-Repo-Commit": repo["commit"], "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
                return self._send(200, data, headers, body)

        return Handler
