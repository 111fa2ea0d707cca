"""What the service says about itself: an OpenAPI document that matches every answer it gives, and docs pages that
work offline.

FastAPI's document, generated from the routes, is true for ``/predict``'s request body and 200 answer (the typed
models of ``bertpipe.doors.serve.schema``) but not for the rest: LitServe's ``/`` and ``/ready`` answer plain text,
``/metrics`` answers Prometheus text, and the Guard answers ``/predict`` with 400/405/408/413/422/503 (and 500 for a
request the model failed on) in its own ``{"error": ...}`` shape, not FastAPI's validation error. ``openapi``
states each of those with its status and media type, and the request limits the service enforces (``serve``
params) as ``maxLength``/``maxItems``, so a client generated from the document, or schemathesis, sees the contract
that holds.

``/docs`` (Swagger UI) and ``/redoc`` load their scripts from the service itself (the assets shipped in the
fastapi-offline package), not from a CDN, so they render on a machine without internet.
"""

from __future__ import annotations

from pathlib import Path

from bertpipe.lib.inference.serve_params import ServeParams

STATIC = "/docs-assets"
ERROR = {"type": "object", "required": ["error"], "additionalProperties": False,
         "properties": {"error": {"type": "string", "description": "what was wrong, in one line"}}}
FAILED = {"type": "object", "required": ["error", "status"], "additionalProperties": False,
          "properties": {"error": {"type": "string"}, "status": {"type": "integer", "const": 500}}}
RETRY = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
HEALTH = {"type": "object", "required": ["status", "inflight", "rejected", "worker_restarts"],
          "properties": {
              "status": {"type": "string", "enum": ["ok", "degraded", "loading", "draining"],
                         "description": "degraded: the alias points at a version that failed to load "
                                        "(see load_error); the last good version is being served"},
              "model": {"type": "string"}, "alias": {"type": ["string", "null"]}, "version": {"type": "string"},
              "task": {"type": "string"}, "backend": {"type": "string"}, "device": {"type": "string"},
              "worker_pid": {"type": "integer"}, "loaded_at": {"type": "number"},
              "load_error": {"type": "object", "properties": {
                  "version": {"type": "string"}, "error": {"type": "string"}, "at": {"type": "number"}}},
              "inflight": {"type": "integer"}, "rejected": {"type": "integer"}, "worker_restarts": {"type": "integer"}}}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": schema}}}
    return {**out, "headers": headers} if headers else out


def _text(description: str, example: str | None = None) -> dict:
    schema = {"type": "string", **({"example": example} if example else {})}
    return {"description": description, "content": {"text/plain": {"schema": schema}}}


def _limit(schema: dict, max_chars: int, max_items: int) -> None:
    """Put the serve limits on every text of a request schema (strings and lists of strings)."""
    for prop in schema.get("properties", {}).values():
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "string":
                branch["maxLength"] = max_chars
            elif branch.get("type") == "array":
                branch["maxItems"] = max_items
                branch["items"] = {**branch["items"], "maxLength": max_chars}


def document(schema: dict, sp: ServeParams) -> dict:
    """FastAPI's generated ``schema`` made true to the service's answers (changed in place and returned)."""
    paths, comps = schema["paths"], schema.setdefault("components", {}).setdefault("schemas", {})
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)
    for name in ("TextRequest", "QARequest"):
        if name in comps:
            _limit(comps[name], sp.max_text_chars, sp.max_items)
    comps["Error"], comps["Failed"] = ERROR, FAILED
    err = {"$ref": "#/components/schemas/Error"}
    if "/" in paths:
        paths["/"]["get"]["responses"] = {"200": _text("the service is running", "litserve running")}
    if "/ready" in paths:  # LitServe's own health check (healthcheck_path)
        paths["/ready"]["get"]["responses"] = {"200": _text("the inference worker is ready", "ok"),
                                               "503": _text("not ready yet", "not ready")}
    if "/health" in paths:
        paths["/health"]["get"]["responses"] = {
            "200": _json(HEALTH, "serving (status ok, or degraded)"),
            "503": _json(HEALTH, "loading, restarting its worker, or draining")}
    if "/metrics" in paths:
        paths["/metrics"]["get"]["responses"] = {"200": _text("Prometheus text exposition format")}
    post = paths.get("/predict", {}).get("post")
    if post:
        ok = post["responses"]["200"]["content"]["application/json"]["schema"]
        ok["anyOf"] = [a for a in ok.get("anyOf", []) if not a.get("$ref", "").endswith("/Failed")] or ok["anyOf"]
        post["responses"].update({
            "400": _json(err, "the body is not UTF-8 or not JSON, or the client left before sending it all"),
            "408": _json(err, f"the body did not arrive within serve.body_timeout_s ({sp.body_timeout_s:g} s)"),
            "413": _json(err, f"over a limit: body bytes ({sp.max_body_bytes}), characters of a text "
                              f"({sp.max_text_chars}) or texts in a list ({sp.max_items})"),
            "405": {**_json(err, "a method other than POST"),
                    "headers": {"Allow": {"description": "POST", "schema": {"type": "string"}}}},
            "422": _json(err, "valid JSON of the wrong shape: unknown or missing fields, a non-string or blank text "
                              "(control or zero-width characters only count as blank)"),
            "500": _json({"$ref": "#/components/schemas/Failed"},
                         "the model failed on this request (the other requests of its batch are answered)"),
            "503": _json(err, "overloaded, shutting down, or the model worker is (re)starting; retry after "
                              "Retry-After seconds", RETRY),
        })
    return schema


def install(app, sp: ServeParams) -> None:
    """Serve ``document``'s OpenAPI at ``/openapi.json`` and the offline ``/docs`` and ``/redoc`` pages."""
    import fastapi_offline
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.openapi.utils import get_openapi
    from fastapi.staticfiles import StaticFiles

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document(get_openapi(title=app.title, version=app.version, routes=app.routes), sp)
        return app.openapi_schema

    app.openapi = openapi
    drop = {"/docs", "/redoc", "/docs/oauth2-redirect"}
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in drop]
    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount(STATIC, StaticFiles(directory=str(assets)), name="docs-assets")

    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC}/swagger-ui.css",
                                   swagger_favicon_url=f"{STATIC}/favicon.png")

    async def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{STATIC}/redoc.standalone.js", redoc_favicon_url=f"{STATIC}/favicon.png",
                              with_google_fonts=False)

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
