"""``abx sandbox create --network``, ``abx sandbox network`` and how info/list show a
policy; bad policies are one clear line, never a traceback."""

from __future__ import annotations

import pytest
from conftest import Abx

pytestmark = pytest.mark.integration


def test_bad_policies_are_refused_before_anything_is_made(abx: Abx) -> None:
    before = abx("sandbox", "list", "--json").json()
    for bad, says in (("pypi.org:443", "not understood"), ("allowlist", "needs its entries"),
                      (",", "names no entry")):
        r = abx("sandbox", "create", "--network", bad, check=1)
        assert r.err.startswith("error: --network: network") and says in r.err, r.err
        assert "Traceback" not in r.err
    r = abx("sandbox", "network", "sbx-0000000000", "http://x", check=1)
    assert "POLICY: network entry 'http://x' is not understood" in r.err
    r = abx("sandbox", "create", "--network", check=2)  # the value is required
    assert "requires an argument" in r.err
    assert abx("sandbox", "list", "--json").json() == before


def test_create_change_and_show_the_policy(abx: Abx) -> None:
    """Needs the engine's network policies (a networked sandbox is started)."""
    info = abx("sandbox", "create", "--network", "registries, PyPI.org", "--json",
               timeout=120).json()
    sid = info["sandbox_id"]
    try:
        assert info["network"] == {"mode": "allowlist", "allow_out": ["registries", "pypi.org"],
                                   "deny_out": []}
        shown = abx("sandbox", "info", sid).out
        assert "allowlist (registries, pypi.org) and nothing else" in shown
        assert "allowlist (registries, pypi.org)" in abx("sandbox", "list").out
        r = abx("sandbox", "network", sid, "pypi.org,files.pythonhosted.org")
        assert r.out.strip() == f"{sid}: network allowlist (pypi.org, files.pythonhosted.org)"
        data = abx("sandbox", "network", sid, "off", "--json").json()
        assert data["network"] == {"mode": "off", "allow_out": [], "deny_out": []}
        assert "off (loopback only)" in abx("sandbox", "info", sid).out
        listed = {s["sandbox_id"]: s for s in abx("sandbox", "list", "--json").json()}
        assert listed[sid]["network"]["mode"] == "off"
    finally:
        abx("sandbox", "kill", sid, "--delete-volume", check=None)
    plain = abx("sandbox", "create", "--json", timeout=120).json()
    try:
        assert plain["network"]["mode"] == "off"  # the default
    finally:
        abx("sandbox", "kill", plain["sandbox_id"], "--delete-volume", check=None)
