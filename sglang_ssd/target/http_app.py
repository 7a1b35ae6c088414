"""SGLang's HTTP app, imported after SGLang's plugins are loaded.

SGLang runs ``--tokenizer-worker-num > 1`` as separate worker processes that import the app by its
dotted path (``SGLANG_HTTP_SERVER_APP_PATH``) and do not call ``load_plugins()`` themselves; the
plugin points that path here (``serving_guards.point_workers_at_plugin_app``).
"""

from sglang.srt.plugins import load_plugins

load_plugins()

from sglang.srt.entrypoints.http_server import app  # noqa: E402

__all__ = ["app"]
