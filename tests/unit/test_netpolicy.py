"""The network policy model: parsing every shorthand, matching names and addresses, and
the ceiling checks every surface (MCP, REST, per key) relies on."""

from __future__ import annotations

import pytest

from agent_sandbox.core.errors import InvalidArgumentError, PermissionDeniedError
from agent_sandbox.core.network import PRESETS, NetworkPolicy, parse

OFF, FULL = NetworkPolicy(), NetworkPolicy(mode="full")


# ---- parsing --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, False, "off", "OFF", " none ", "", []])
def test_off_spellings(value: object) -> None:
    assert parse(value) == OFF


@pytest.mark.parametrize("value", [True, "full", "Full", "on", {"mode": "full"},
                                   {"mode": " FULL "}])
def test_full_spellings(value: object) -> None:
    assert parse(value) == FULL


def test_allowlist_spellings_are_canonical() -> None:
    want = NetworkPolicy(mode="allowlist", allow_out=("pypi.org", "*.example.com",
                                                      "10.1.0.0/16", "registries"))
    for value in ("PyPI.org., *.Example.com,10.1.2.3/16 , registries",
                  ["pypi.org", "*.example.com", "10.1.0.0/16", "registries", "pypi.org"],
                  {"allow_out": ["pypi.org", "*.example.com", "10.1.0.0/16", "registries"]},
                  {"mode": "allowlist", "allow_out": "pypi.org,*.example.com,10.1.0.0/16,"
                                                     "registries"}):
        assert parse(value) == want, value
    assert parse(want) is want
    assert parse("203.0.113.7").allow_out == ("203.0.113.7/32",)
    assert parse("2001:db8::1").allow_out == ("2001:db8::1/128",)


def test_deny_only_mapping_is_full_minus_it() -> None:
    policy = parse({"deny_out": ["evil.com"]})
    assert policy.mode == "full" and policy.deny_out == ("evil.com",)
    assert not policy.allows_name("evil.com") and policy.allows_name("good.com")


@pytest.mark.parametrize(("value", "says"), [
    ("allowlist", "needs its entries"),
    (",, ,", "names no entry"),
    ("pypi.org:443", "not understood"),
    ("https://pypi.org", "not understood"),
    ("*", "not understood"),
    ("*.", "wildcard"),
    ("**.example.com", "wildcard"),
    ("localhost", "not understood"),  # no dot: not a public name
    ("-bad.example.com", "not understood"),
    ("a" * 64 + ".com", "not understood"),
    ("010.1.1.1", "not understood"),
    ("1.2.3", "not understood"),
    ([1], "not a non-empty string"),
    ([""], "not a non-empty string"),
    ([True], "not a non-empty string"),
    ({"mode": "sometimes"}, "not one of"),
    ({"mode": "off", "allow_out": ["pypi.org"]}, "takes no allow_out"),
    ({"mode": "full", "allow_out": ["pypi.org"]}, "allowlist"),
    ({"mode": "allowlist"}, "at least one"),
    ({"allow": ["pypi.org"]}, "unknown field"),
    ({"allow_out": 3}, "must be a list"),
    (["x.com"] * 257, "at most 256"),
    (3, "not understood"),
    (b"full", "not understood"),
])
def test_bad_policies_are_refused_clearly(value: object, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        parse(value)


# ---- matching -------------------------------------------------------------------------------

def test_names_exact_and_wildcard() -> None:
    policy = parse("pypi.org, *.example.com")
    assert policy.allows_name("pypi.org") and policy.allows_name("PYPI.ORG.")
    assert not policy.allows_name("files.pypi.org")  # an exact name is only itself
    assert not policy.allows_name("evilpypi.org")
    assert policy.allows_name("a.example.com") and policy.allows_name("a.b.example.com")
    assert not policy.allows_name("example.com")  # the wildcard is subdomains only
    assert not policy.allows_name("badexample.com")
    for junk in ("", "pypi.org\x00", "pypi..org", "1.2.3.4", "a b.com", "x" * 300):
        assert not policy.allows_name(junk)


def test_presets_expand_and_deny_wins() -> None:
    policy = parse({"allow_out": ["registries"], "deny_out": ["registry.npmjs.org"]})
    for name in PRESETS["registries"]:
        if not name.startswith("*."):
            assert policy.allows_name(name) == (name != "registry.npmjs.org"), name
    assert policy.allows_name("de.archive.ubuntu.com")
    assert not policy.allows_name("github.com")


def test_addresses() -> None:
    policy = parse({"allow_out": ["198.51.100.0/24", "pypi.org"], "deny_out": ["198.51.100.7"]})
    assert policy.allows_address("198.51.100.8")
    assert not policy.allows_address("198.51.100.7")
    assert not policy.allows_address("203.0.113.1")
    assert not policy.allows_address("pypi.org") and not policy.allows_address("")
    assert FULL.allows_address("203.0.113.1") and not OFF.allows_address("203.0.113.1")
    assert not parse("198.51.100.0/24").allows_name("pypi.org")  # CIDRs allow no names
    assert not OFF.allows_name("pypi.org")
    assert FULL.allows_name("anything.example")


def test_describe() -> None:
    assert OFF.describe() == "off" and FULL.describe() == "full"
    assert parse("registries,pypi.org").describe() == "allowlist (registries, pypi.org)"
    assert parse({"deny_out": ["evil.com"]}).describe() == "full except (evil.com)"


# ---- ceilings -------------------------------------------------------------------------------

def within(policy: object, ceiling: object) -> bool:
    return parse(policy).within(parse(ceiling))


def test_off_is_within_everything_and_nothing_is_within_off() -> None:
    for ceiling in ("off", "registries", "full", "pypi.org"):
        assert within("off", ceiling)
    for policy in ("registries", "full", "pypi.org", "10.0.0.0/8"):
        assert not within(policy, "off")


def test_full_is_within_only_full_with_no_more_denied() -> None:
    assert within("full", "full")
    assert not within("full", "registries")
    assert not within("full", {"deny_out": ["evil.com"]})
    assert within({"deny_out": ["evil.com"]}, {"deny_out": ["evil.com"]})
    # Denying more than the ceiling (a wildcard that includes its name) is within it.
    assert within({"deny_out": ["*.evil.com", "evil.com"]}, {"deny_out": ["x.evil.com"]})
    assert within({"deny_out": ["10.0.0.0/8"]}, {"deny_out": ["10.1.0.0/16"]})
    assert not within({"deny_out": ["10.1.0.0/16"]}, {"deny_out": ["10.0.0.0/8"]})


def test_the_mcp_default_ceiling() -> None:
    assert within("registries", "registries")
    assert within("pypi.org", "registries")
    assert within("pypi.org,files.pythonhosted.org", "registries")
    assert within("de.archive.ubuntu.com", "registries")
    assert within("*.de.archive.ubuntu.com", "registries")
    assert within("*.archive.ubuntu.com", "registries")
    assert not within("archive.ubuntu.com,github.com", "registries")
    assert not within("*.ubuntu.com", "registries")  # wider than the preset's wildcard
    assert not within("*.pypi.org", "registries")  # the preset lists pypi.org, not subdomains
    assert not within("151.101.0.0/16", "registries")  # an address is not a name
    assert not within("full", "registries")


def test_wildcards_and_exact_names() -> None:
    assert within("a.example.com", "*.example.com")
    assert within("*.a.example.com", "*.example.com")
    assert not within("example.com", "*.example.com")
    assert not within("*.example.com", "a.example.com")  # infinitely many names
    assert not within("*.example.com", "example.com")
    assert not within("*.xample.com", "*.example.com")
    assert not within("*.badexample.com", "*.example.com")


def test_cidrs() -> None:
    assert within("203.0.113.0/25", "203.0.113.0/24")
    assert within("203.0.113.7", "203.0.113.0/24")
    assert not within("203.0.113.0/23", "203.0.113.0/24")
    assert not within("2001:db8::/64", "203.0.113.0/24")  # never across IP versions
    assert within("2001:db8::/64", "full")
    assert not within("203.0.113.0/24", "pypi.org")


def test_ceiling_denials_must_be_kept() -> None:
    ceiling = {"deny_out": ["evil.example.com", "203.0.113.0/24"]}
    assert within("good.example.com", ceiling)
    assert not within("evil.example.com", ceiling)
    assert not within("*.example.com", ceiling)  # would include the denied name
    assert within({"allow_out": ["*.example.com"], "deny_out": ["evil.example.com"]}, ceiling)
    assert within({"allow_out": ["*.example.com"], "deny_out": ["*.evil.example.com",
                                                                  "evil.example.com"]},
                  ceiling)
    assert not within("203.0.0.0/16", ceiling)
    assert within({"allow_out": ["203.0.0.0/16"], "deny_out": ["203.0.113.0/24"]}, ceiling)
    assert within("198.51.100.0/24", ceiling)
    # A ceiling whose wildcard deny reaches the asked wildcard from above or below.
    assert not within("*.a.example.com", {"deny_out": ["*.example.com"]})
    assert not within("*.example.com", {"deny_out": ["*.a.example.com"]})
    assert within("*.example.org", {"deny_out": ["*.example.com"]})
    # An allowlist ceiling's own denials count too.
    assert not within("x.example.com", {"allow_out": ["*.example.com"],
                                        "deny_out": ["x.example.com"]})


def test_check_within_names_the_ceiling_and_what_is_beyond() -> None:
    parse("registries").check_within(parse("registries"), "this MCP server's operator")
    with pytest.raises(PermissionDeniedError) as caught:
        parse("full").check_within(parse("registries"), "this MCP server's operator",
                                   "the operator raises it with ABX_MCP_NETWORK_CEILING")
    err = caught.value
    assert err.http_status == 403 and err.code == "permission_denied"
    assert "this MCP server's operator" in err.message
    assert "ceiling is allowlist (registries)" in err.message
    assert "ABX_MCP_NETWORK_CEILING" in err.message
    assert err.details["beyond"] == ["full"]
    assert err.details["ceiling"]["allow_out"] == ["registries"]
    with pytest.raises(PermissionDeniedError, match="github.com is beyond"):
        parse("pypi.org,github.com").check_within(parse("registries"), "API key 'ci'")
    many = ",".join(f"h{i}.example.com" for i in range(9))
    with pytest.raises(PermissionDeniedError, match="and 4 more") as caught:
        parse(many).check_within(OFF, "API key 'ci'")
    assert "only the operator can raise it" in caught.value.message


def test_errors_never_echo_a_huge_value() -> None:
    for value in ("x" * 100_000, ["y" * 100_000], {"mode": "z" * 100_000},
                  {"q" * 100_000: 1}):
        with pytest.raises(InvalidArgumentError) as caught:
            parse(value)
        assert len(caught.value.message) < 600, value


def test_compact_is_the_shortest_spelling_parse_reads_back() -> None:
    from agent_sandbox.core.network import compact

    assert compact(OFF) is False and compact(FULL) is True
    for value in ("registries", {"deny_out": ["evil.com"]}, "pypi.org,10.0.0.0/8"):
        policy = parse(value)
        assert isinstance(compact(policy), dict) and parse(compact(policy)) == policy
