"""`POST /admin/faults`: switch the fault injector (proxy/engine/faults.py) over HTTP.

Registered by the terminal that holds a FaultyEngine, so the route exists only where
`engine.faults: true`. An operator key only: a fault hits every tenant.
"""

from __future__ import annotations

from aiohttp import web

from .app_state import STATE
from .body import read_json
from .engine.faults import FaultRequest, FaultyEngine
from .protocol import parse_model
from .telemetry import get_logger
from .terminal import Route

log = get_logger("weir.faults")


def fault_routes(engine: FaultyEngine) -> list[Route]:
    async def switch(request: web.Request) -> web.Response:
        st = request.app[STATE]
        st.auth.require_role(request.headers, "operator",
                             "Fault injection")
        data, _ = await read_json(request, 4096)
        req = parse_model(FaultRequest, data)
        engine.switch(req)
        log.warning("fault injection", mode=req.mode, delay_s=engine.delay_s)
        return web.json_response({"mode": req.mode, "delay_s": engine.delay_s})

    return [("POST", "/admin/faults", switch)]
