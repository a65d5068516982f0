"""Admission between tenants: within a priority, tenants take turns, so one tenant
queueing many requests neither goes ahead of another's one request nor gets it shed."""

from __future__ import annotations

import asyncio
import random

import pytest

from plugins.admission.config import AdmissionConfig
from plugins.admission.plugin import AdmissionPlugin
from plugins.admission.queue import PriorityGate, Shed
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services
from proxy.context import RequestContext
from proxy.errors import Unavailable
from proxy.protocol import ChatCompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine
from tests.waiting import eventually


async def test_a_tenant_queueing_many_waits_behind_its_own_not_before_anothers() -> None:
    gate = PriorityGate(1, 100)
    await gate.acquire(10, None, owner="a")
    order: list[str] = []

    async def wait(name: str, owner: str) -> None:
        await gate.acquire(10, None, owner=owner)
        order.append(name)
        gate.release()

    tasks = []
    for name, owner in [*((f"a{i}", "a") for i in range(5)), ("b0", "b"), ("b1", "b"),
                        ("c0", "c")]:
        tasks.append(asyncio.create_task(wait(name, owner)))
        await eventually(lambda: gate.waiting == len(tasks))  # queued in this order
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]
    assert gate.in_use == 0


async def test_priority_orders_a_tenants_own_requests_and_breaks_ties_between_tenants(
) -> None:
    """A tenant's admin request goes ahead of its own user requests, taking its tenant's
    turn; at one turn the better priority goes first."""
    gate = PriorityGate(1, 100)
    await gate.acquire(10, None, owner="a")
    order: list[str] = []

    async def wait(name: str, prio: int, owner: str) -> None:
        await gate.acquire(prio, None, owner=owner)
        order.append(name)
        gate.release()

    tasks = []
    for args in (("a-user", 10, "a"), ("b-user", 10, "b"), ("a-admin", 0, "a")):
        tasks.append(asyncio.create_task(wait(*args)))
        await eventually(lambda: gate.waiting == len(tasks))
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["a-admin", "b-user", "a-user"]


async def test_a_tenant_with_a_better_role_does_not_starve_other_tenants() -> None:
    """Priority orders a tenant's own requests, not every tenant's: a tenant whose keys
    all have the admin role, queueing many requests, took every permit ahead of every
    other tenant's user requests for as long as it kept queueing."""
    gate = PriorityGate(1, 100)
    await gate.acquire(0, None, owner="a")
    order: list[str] = []

    async def wait(name: str, prio: int, owner: str) -> None:
        await gate.acquire(prio, None, owner=owner)
        order.append(name)
        gate.release()

    tasks = []
    for name, prio, owner in [("b0", 10, "b"), ("b1", 10, "b"), ("c0", 10, "c"),
                              *((f"a{i}", 0, "a") for i in range(5))]:
        tasks.append(asyncio.create_task(wait(name, prio, owner)))
        await eventually(lambda: gate.waiting == len(tasks))
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]
    assert gate.in_use == 0 and gate.waiting == 0


async def test_a_full_queue_sheds_the_flooding_tenants_last_not_the_newcomer() -> None:
    gate = PriorityGate(1, 3)
    await gate.acquire(10, None, owner="a")
    flood = []
    for _ in range(3):
        flood.append(asyncio.create_task(gate.acquire(10, None, owner="a")))
        await eventually(lambda: gate.waiting == len(flood))
    with pytest.raises(Shed):
        await gate.acquire(10, None, owner="a")  # a's own: shed at once, as before
    b = asyncio.create_task(gate.acquire(10, None, owner="b"))
    with pytest.raises(Shed):
        await flood[2]  # a's last waiter gives b its place
    assert gate.waiting == 3 and not b.done()
    gate.release()
    await flood[0]
    gate.release()
    await b  # b's turn came before a's second waiter's
    assert not flood[1].done()
    gate.release()
    await flood[1]
    gate.release()
    assert gate.in_use == 0 and gate.waiting == 0


def ctx(tenant: str) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    return RequestContext(route="chat", request=req, principal=Principal(tenant, "user", "u"),
                          request_id="r", headers={})


async def test_through_the_plugin_a_flooding_tenant_cannot_shed_another() -> None:
    """A gateway's callers (`acme~gw~...`) are one tenant's turns: naming many callers
    wins no more turns."""
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    p = AdmissionPlugin(AdmissionConfig.model_validate(
        {"max_concurrent": 1, "max_queue": 4}), services)
    hold = asyncio.Event()

    async def engine(c: RequestContext) -> Reply:
        await hold.wait()
        return Completion({})

    callers = [f"acme~gw~{i:032x}" for i in range(5)]
    flood = [asyncio.create_task(p(ctx(t), engine)) for t in callers]
    await eventually(lambda: p.gate.in_use == 1 and p.gate.waiting == 4)
    other = asyncio.create_task(p(ctx("globex"), engine))
    await eventually(lambda: sum(t.done() for t in flood) == 1)
    shed = [t for t in flood if t.done()]
    with pytest.raises(Unavailable):
        await shed[0]
    assert not other.done() and p.gate.waiting == 4
    hold.set()
    await asyncio.gather(other, *(t for t in flood if t not in shed))
    assert p.gate.in_use == 0




async def test_turns_a_tenant_gave_up_are_not_held_against_it() -> None:
    """Waiters shed or timed out took no turn: their tenant's next request is not put
    behind turns nobody used (another tenant queueing steadily would go first for as
    many requests again)."""
    gate = PriorityGate(1, 100)
    await gate.acquire(10, None, owner="a")
    burst = [asyncio.create_task(gate.acquire(10, None, owner="a")) for _ in range(20)]
    await eventually(lambda: gate.waiting == 20)
    order: list[str] = []

    async def wait(name: str, owner: str) -> None:
        await gate.acquire(10, None, owner=owner)
        order.append(name)
        gate.release()

    tasks = []
    for name, owner in (("b0", "b"), ("b1", "b"), ("b2", "b"), ("a0", "a")):
        tasks.append(asyncio.create_task(wait(name, owner)))
        queued = len(tasks) + (20 if name == "b0" else 0)
        await eventually(lambda: gate.waiting == queued)  # noqa: B023 (awaited here)
        if name == "b0":  # a's clients leave while b waits: the queue never empties
            for t in burst:
                t.cancel()
            await asyncio.gather(*burst, return_exceptions=True)
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["b0", "a0", "b1", "b2"]


async def test_a_grant_at_a_better_priority_does_not_put_a_newcomer_behind_a_flood() -> None:
    """A tenant's request granted at a better priority takes its tenant's next turn (its
    backlog's move back), not a turn after that backlog: the turn being served stays
    there, and another tenant's one request goes next, not after the flooding tenant's
    whole backlog."""
    gate = PriorityGate(1, 100)
    await gate.acquire(10, None, owner="a")
    order: list[str] = []

    async def wait(name: str, prio: int, owner: str) -> None:
        await gate.acquire(prio, None, owner=owner)
        order.append(name)  # (holds its permit until the test releases it)

    tasks = [asyncio.create_task(wait(f"a{i}", 10, "a")) for i in range(5)]
    await eventually(lambda: gate.waiting == 5)
    tasks.append(asyncio.create_task(wait("a-admin", 0, "a")))
    await eventually(lambda: gate.waiting == 6)
    gate.release()
    await eventually(lambda: order == ["a-admin"])  # first by priority
    tasks.append(asyncio.create_task(wait("b0", 10, "b")))
    await eventually(lambda: gate.waiting == 6)
    for n in range(2, 8):
        gate.release()
        await eventually(lambda: len(order) == n)  # noqa: B023 (awaited here)
    await asyncio.gather(*tasks)
    assert order == ["a-admin", "b0", "a0", "a1", "a2", "a3", "a4"]
    gate.release()
    assert gate.in_use == 0 and gate.waiting == 0


async def test_many_tenants_queueing_do_not_make_each_request_walk_them_all() -> None:
    """The owners' next turns are forgotten once served in passes whose cost is amortized:
    with more tenants than twice the queue (a standing queue of many tenants, each
    served in turn), every request walked all of them (a pass per request, O(tenants)
    where the gate is busiest)."""
    gate = PriorityGate(8, 100_000)
    passes, served, n = 0, 0, 4000
    seen = gate._next  # (a pass makes a new one)

    async def client(c: int) -> None:
        nonlocal passes, served, seen
        i = c
        while served < n:
            await gate.acquire(1, None, 1, f"t{i % 2000}")
            passes += gate._next is not seen
            seen = gate._next
            served += 1
            i += 256
            await asyncio.sleep(0)
            gate.release(1)

    await asyncio.gather(*(client(c) for c in range(256)))
    assert gate.in_use == 0
    assert passes < n // 20, passes


async def test_many_tenants_priorities_and_weights_giving_up_leave_no_leak() -> None:
    gate = PriorityGate(4, 30)
    rng = random.Random(3)

    async def user() -> None:
        weight = gate.weight(rng.choice([1, 1, 2, 3, 8]))
        try:
            await gate.acquire(rng.choice([0, 10]), rng.choice([0.001, 0.01, None]), weight,
                               rng.choice("abcde"))
        except (TimeoutError, Shed):
            return
        assert gate.in_use <= 4
        await asyncio.sleep(0)
        gate.release(weight)

    tasks = [asyncio.create_task(user()) for _ in range(600)]
    for t in rng.sample(tasks, 120):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert gate.in_use == 0 and gate.waiting == 0 and not gate._owned


async def _users_place_behind_a_flood_of_its_tenants_admins(gate: PriorityGate,
                                                             admins: int) -> int:
    """Where a tenant's user request, queued first, is granted among `admins` requests
    of its tenant's admin key queued after it (priorities 10 and 0)."""
    await gate.acquire(10, None, owner="a")
    order: list[str] = []

    async def wait(name: str, prio: int) -> None:
        await gate.acquire(prio, None, owner="a")
        order.append(name)
        gate.release()

    tasks = []
    for args in [("user", 10), *((f"admin{i}", 0) for i in range(admins))]:
        tasks.append(asyncio.create_task(wait(*args)))
        await eventually(lambda: gate.waiting == len(tasks))
    gate.release()
    await asyncio.gather(*tasks)
    assert gate.in_use == 0 and gate.waiting == 0
    return order.index("user")


async def test_a_tenants_admin_flood_does_not_starve_its_own_users() -> None:
    """Priority within a tenant is weighted, not strict: a user request is passed by at
    most `priority_passes` of its tenant's later better requests per point of priority
    between them (an admin key's steady traffic kept its own tenant's users waiting
    until their wait ran out)."""
    assert await _users_place_behind_a_flood_of_its_tenants_admins(
        PriorityGate(1, 200, priority_passes=1), 30) == 10
    default = AdmissionConfig().priority_passes
    assert default is not None
    assert await _users_place_behind_a_flood_of_its_tenants_admins(
        PriorityGate(1, 200), 20 * default) == 10 * default
    # null: strict priority, as before (the user goes last)
    assert await _users_place_behind_a_flood_of_its_tenants_admins(
        PriorityGate(1, 200, priority_passes=None), 30) == 30


async def test_the_plugin_takes_priority_passes_from_its_config() -> None:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    plugin = AdmissionPlugin(AdmissionConfig(priority_passes=2), services)
    assert plugin.gate.priority_passes == 2 and plugin.embed_gate.priority_passes == 2


async def test_priority_passes_0_is_plain_arrival_order() -> None:
    """`priority_passes: 0`: no request passes another, whatever its priority: the user
    goes first, as it came first (it was refused at load, though 0 is what an operator
    writes to turn priorities off)."""
    config = AdmissionConfig(priority_passes=0)
    assert config.priority_passes == 0
    assert await _users_place_behind_a_flood_of_its_tenants_admins(
        PriorityGate(1, 200, priority_passes=config.priority_passes), 30) == 0


async def test_priority_passes_0_lets_no_priority_go_first_at_one_turn() -> None:
    """At one turn (two tenants, each its first waiter) the earlier goes first, not the
    better priority: 0 turns priorities off, tenants still take turns."""
    gate = PriorityGate(1, 10, priority_passes=0)
    await gate.acquire(0, None, owner="x")
    order: list[str] = []

    async def wait(owner: str, prio: int) -> None:
        await gate.acquire(prio, None, owner=owner)
        order.append(owner)
        gate.release()

    tasks = []
    for owner, prio in (("user-tenant", 10), ("admin-tenant", 0)):
        tasks.append(asyncio.create_task(wait(owner, prio)))
        await eventually(lambda: gate.waiting == len(tasks))
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["user-tenant", "admin-tenant"]
