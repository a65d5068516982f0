"""Cross-origin calls from browsers (CORS), opt-in: `server.cors`.

Off by default, and then nothing here is installed: an OPTIONS preflight is a 405 and
a web page cannot drive Weir (every body route needs `Content-Type: application/json`,
which no page sends to another origin without a preflight), a local `auth.mode: open`
Weir included.

With `allow_origins` set:

- a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) on a path
  a route serves is answered here, before any key is asked for (a browser sends none
  on a preflight): a 204 with the `Access-Control-Allow-*` headers where the origin,
  the method (one the path serves, as the router says: `allow_methods` is listed as far
  as the path serves them) and every header it asks for are allowed, else a 403
  `cors_not_allowed` (OpenAI-shaped, saying which) with none of them, which the browser
  reads as a refusal;
- every answer to an allowed origin (a whole answer, a stream, an error of a handler,
  a middleware or the router) carries `Access-Control-Allow-Origin` (the origin, or
  `*` where any origin is allowed without credentials), `-Allow-Credentials` where set
  and `-Expose-Headers`; every answer carries `Vary: Origin` where it depends on the
  origin (`on_response_prepare`, so a stream's head has them too). Allowing any origin,
  every answer carries `*`, one without `Origin` too: the same for all, so an HTTP cache
  in front (which keys by `Vary` alone) never serves a page an answer granting nothing.

Answers written on the connection below the app, which no middleware nor hook sees,
are marked by `wire_grant` alike (`Vary: Origin`, and the grant where the origin is
allowed), so a page reads their status, not a network error: what aiohttp's parser
refuses (a 400, a 501) and a head past its bound (a 431, a 503), by the `Origin` line
`proxy.connections` finds in the head's bytes as they come; a connection refused at the
cap, before any byte of it is read, by `*` alone, where any origin is allowed.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from .errors import WeirError, shown
from .middleware import route_resource
from .settings import HTTP_TOKEN, CorsSettings

#: Request headers a browser may send without asking (CORS-safelisted), always allowed.
_SAFELISTED = frozenset({"accept", "accept-language", "content-language", "content-type"})


class CorsNotAllowed(WeirError):
    status = 403
    type = "invalid_request_error"
    default_code = "cors_not_allowed"


def served_methods(request: web.Request) -> frozenset[str] | None:
    """The methods the routes of a request's path serve, as the router's 405 names them
    (HEAD wherever GET is); None where a route takes any method (`*`)."""
    match = request.match_info
    refused = getattr(match, "http_exception", None)
    if isinstance(refused, web.HTTPMethodNotAllowed):
        return frozenset(refused.allowed_methods)
    resource = match.route.resource
    methods = frozenset(route.method for route in resource) if resource is not None else None
    return None if methods is None or hdrs.METH_ANY in methods else methods


class Cors:
    """`server.cors`, read once: the preflight middleware, the response hook, and the
    grant of an answer written below the app (`wire_grant`)."""

    def __init__(self, settings: CorsSettings) -> None:
        self.any_origin = settings.allow_origins == ["*"]
        self.origins = frozenset(settings.allow_origins)
        self.any_method = "*" in settings.allow_methods
        self.methods = [m.upper() for m in settings.allow_methods if m != "*"]
        self.any_header = "*" in settings.allow_headers
        self.headers = frozenset(h.lower() for h in settings.allow_headers) | _SAFELISTED
        self.credentials = settings.allow_credentials
        self.private_network = settings.allow_private_network
        self.expose = ", ".join(settings.expose_headers)
        self.max_age = str(settings.max_age_s)

    def allow_origin(self, origin: str | None) -> str | None:
        """`Access-Control-Allow-Origin` for a request from `origin`, or None where it is
        not allowed."""
        if not origin:
            return None
        if self.any_origin:
            return "*"
        return origin if origin.lower() in self.origins else None

    async def on_response_prepare(self, request: web.Request,
                                  response: web.StreamResponse) -> None:
        headers = response.headers
        # (every answer, so an HTTP cache keys each by it: a hit of Weir's too)
        if not self.any_origin and "origin" not in headers.get(hdrs.VARY, "").lower():
            headers.add(hdrs.VARY, "Origin")
        for name, value in self._grant(request.headers.get(hdrs.ORIGIN),
                                       request.method != "OPTIONS"):
            headers[name] = value

    def wire_grant(self, origin: str | None) -> list[tuple[str, str]]:
        """The headers `on_response_prepare` gives an answer, for one written on the
        connection below the app to a request from `origin` (None: none found)."""
        vary: list[tuple[str, str]] = [] if self.any_origin else [(hdrs.VARY, "Origin")]
        return vary + self._grant(origin, True)

    def _grant(self, origin: str | None, expose: bool) -> list[tuple[str, str]]:
        """The `Access-Control-Allow-*` headers (and `-Expose-Headers` where `expose`: not
        on a preflight's answer) of an answer to a request from `origin`; none where it
        is not allowed. With any origin allowed, `*` on every answer, Origin or none:
        the same for all."""
        allowed = "*" if self.any_origin else self.allow_origin(origin)
        if allowed is None:
            return []
        headers: list[tuple[str, str]] = [(hdrs.ACCESS_CONTROL_ALLOW_ORIGIN, allowed)]
        if self.credentials:
            headers.append((hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS, "true"))
        if self.expose and expose:
            headers.append((hdrs.ACCESS_CONTROL_EXPOSE_HEADERS, self.expose))
        return headers

    def preflight(self, request: web.Request) -> web.Response:
        """A preflight's answer, or `CorsNotAllowed` saying what is not allowed."""
        origin = request.headers[hdrs.ORIGIN]
        if self.allow_origin(origin) is None:
            raise CorsNotAllowed(f"Origin `{shown(origin, 128)}` is not allowed to call "
                                 "this server (server.cors.allow_origins).")
        method = request.headers[hdrs.ACCESS_CONTROL_REQUEST_METHOD].strip()
        if not HTTP_TOKEN.fullmatch(method):
            raise CorsNotAllowed(f"Method `{shown(method, 32)}` is no HTTP method name.")
        if not self.any_method and method.upper() not in self.methods:
            raise CorsNotAllowed(f"Method `{shown(method, 32)}` is not allowed from another "
                                 "origin (server.cors.allow_methods).")
        served = served_methods(request)
        if served is not None and method not in served:
            # (its request would be the router's 405: the browser is told so now, and
            # sends none; methods are case-sensitive, as the router reads them)
            raise CorsNotAllowed(
                f"Method `{shown(method, 32)}` is not served on "
                f"{shown(request.path, 128)}; allowed: {', '.join(sorted(served))}.")
        asked = [h.strip() for h in request.headers.get(
            hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "").split(",") if h.strip()]
        if bad := next((h for h in asked if not HTTP_TOKEN.fullmatch(h)), None):
            raise CorsNotAllowed(f"Header `{shown(bad, 64)}` is no HTTP header name.")
        if not self.any_header:
            refused = [h for h in asked if h.lower() not in self.headers]
            if refused:
                raise CorsNotAllowed(
                    f"Header `{shown(refused[0], 64)}` is not allowed from another origin "
                    "(server.cors.allow_headers).")
        headers: dict[str, str] = {
            hdrs.ACCESS_CONTROL_ALLOW_METHODS: method if self.any_method
            else ", ".join(m for m in self.methods if served is None or m in served),
            hdrs.ACCESS_CONTROL_MAX_AGE: self.max_age,
        }
        if asked:
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = ", ".join(asked)
        # (Private Network Access: a public page calling a private address; refused, the
        # header is left out and the browser fails the preflight)
        if self.private_network and request.headers.get(
                "Access-Control-Request-Private-Network", "").strip().lower() == "true":
            headers["Access-Control-Allow-Private-Network"] = "true"
        return web.Response(status=204, headers=headers)

    def middleware(self) -> Any:
        """Answers a preflight on a path a route serves (any other OPTIONS, or a path no
        route serves, goes on as without CORS: a 405 or a 404)."""

        @web.middleware
        async def cors_middleware(request: web.Request,
                                  handler: Handler) -> web.StreamResponse:
            if (request.method == "OPTIONS" and hdrs.ORIGIN in request.headers
                    and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
                    and route_resource(request) is not None):
                return self.preflight(request)
            return await handler(request)

        return cors_middleware


#: The app's `server.cors`, where it is on (`proxy.listener` marks the answers written
#: below the app by it).
CORS = web.AppKey("weir_cors", Cors)
