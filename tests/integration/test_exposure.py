"""Who may read /metrics, /health/ready's details and /dashboard (observability.*)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.conftest import MakeClient, make_settings

KEYS = [{"key": "k-user", "tenant": "a"}, {"key": "k-admin", "tenant": "a", "role": "admin"}]


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{key}".encode()).decode()}


async def client_with(make_client: MakeClient, **observability: Any) -> Any:
    return await make_client(make_settings(auth={"mode": "keys", "keys": KEYS},
                                           observability=observability))


async def test_defaults(make_client: MakeClient) -> None:
    c = await client_with(make_client)
    assert (await c.get("/health/live")).status == 200
    bare = await c.get("/health/ready")
    assert bare.status == 200 and await bare.json() == {"status": "ready"}
    user = await (await c.get("/health/ready", headers=h("k-user"))).json()
    assert user == {"status": "ready"}
    full = await (await c.get("/health/ready", headers=h("k-admin"))).json()
    assert full["status"] == "ready" and "engine" in full and "in_flight" in full
    assert (await c.get("/metrics")).status == 200  # scrapers: open by default
    page = await c.get("/dashboard")
    assert page.status == 401 and page.headers["www-authenticate"].startswith("Basic")
    assert (await c.get("/dashboard", headers=basic("k-user"))).status == 403
    assert (await c.get("/dashboard", headers=basic("k-admin"))).status == 200
    assert (await c.get("/dashboard", headers=h("k-admin"))).status == 200


@pytest.mark.parametrize(("key", "status"), [(None, 401), ("k-user", 403), ("k-admin", 200)])
async def test_metrics_behind_an_admin_key(make_client: MakeClient, key: str | None,
                                           status: int) -> None:
    c = await client_with(make_client, metrics="admin")
    r = await c.get("/metrics", headers=h(key) if key else {})
    assert r.status == status
    if status != 200:
        assert set((await r.json())["error"]) == {"message", "type", "param", "code"}


async def test_everything_open_and_dashboard_off(make_client: MakeClient) -> None:
    c = await client_with(make_client, health_details="open", dashboard="off")
    assert "engine" in await (await c.get("/health/ready")).json()
    assert (await c.get("/dashboard", headers=h("k-admin"))).status == 404


async def test_open_auth_mode_is_open(make_client: MakeClient) -> None:
    c = await make_client(make_settings(observability={"metrics": "admin"}))
    assert (await c.get("/metrics")).status == 200
    assert (await c.get("/dashboard")).status == 200
    assert "engine" in await (await c.get("/health/ready")).json()


async def test_operator_exposure_keeps_tenant_admins_out(make_client: MakeClient) -> None:
    """The figures are every tenant's: `operator` shows them to operator keys only."""
    keys = [*KEYS, {"key": "k-op", "tenant": "ops", "operator": True}]
    c = await make_client(make_settings(auth={"mode": "keys", "keys": keys}, observability={
        "metrics": "operator", "health_details": "operator", "dashboard": "operator"}))
    for path in ("/metrics", "/dashboard"):
        assert (await c.get(path, headers=h("k-admin"))).status == 403, path
        assert (await c.get(path, headers=h("k-op"))).status == 200, path
    assert await (await c.get("/health/ready", headers=h("k-admin"))).json() == {
        "status": "ready"}
    assert "engine" in await (await c.get("/health/ready", headers=h("k-op"))).json()
