"""The built-in dashboard (proxy/static/dashboard.html): its script's figures, read from
the metrics Weir renders, run under Node where it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.telemetry import Metrics

PAGE = Path(__file__).parents[2] / "proxy" / "static" / "dashboard.html"
NODE = shutil.which("node")


def percentiles(before: str, after: str) -> dict[str, float | None]:
    """The page's p50 and p99 (ms) over the interval between two scrapes."""
    script = re.search(r"<script>(.*)</script>", PAGE.read_text(), re.S)
    assert script is not None
    body = script.group(1).replace("tick();\nsetInterval(tick, 2000);", "")
    assert "setInterval" not in body  # (the page's timer is not started here)
    program = body + """
const [a, b] = JSON.parse(require("fs").readFileSync(0, "utf8"));
const before = buckets(parse(a)), after = buckets(parse(b));
console.log(JSON.stringify({p50: quantile(0.5, after, before),
                            p99: quantile(0.99, after, before)}));
"""
    assert NODE is not None
    out = subprocess.run([NODE, "-e", program], input=json.dumps([before, after]),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_latency_percentiles_read_every_bucket() -> None:
    """prometheus_client writes a whole bucket bound as `1.0`, `10.0`: the page looked
    those up as `1`, `10`, found nothing, and read the next bound with a fraction (a
    p50 in (0.5 s, 1 s] said 2500 ms) or, past 5 s, the last bucket (600000 ms)."""
    m = Metrics()
    before = m.render().decode()
    # (the percentiles read every status's buckets together)
    for _ in range(98):
        m.latency.labels("chat", "m", "200").observe(0.6)
    for _ in range(2):
        m.latency.labels("chat", "m", "504").observe(7.0)
    assert percentiles(before, m.render().decode()) == {"p50": 1000, "p99": 10000}
