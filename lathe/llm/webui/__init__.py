"""`lathe webui`: a local web page to fine-tune, watch, chat with and export models (LLaMA Board's jobs).

The page is plain HTML, CSS and JavaScript shipped in static/ (no CDN, works offline), served by FastAPI
and uvicorn (the `api` extra). Training runs are `lathe train` subprocesses (jobs.py), so the CLI stays the
one source of truth and closing the browser loses nothing; runs.py reads what any run leaves in its
output_dir (trainer_log.jsonl, trainer_state.json). paths.py keeps every path a form names under the root.
Nothing here is imported by `import lathe` or by the CLI's start-up: `lathe webui` imports server.py.
"""
