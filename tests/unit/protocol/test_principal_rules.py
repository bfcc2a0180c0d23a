"""Kafka's `ssl.principal.mapping.rules`: the cases of Kafka's own SslPrincipalMapperTest, and more.

The strings below are Java source strings from that test written as Python raw strings, so a
``\\\\`` there is one backslash here.
"""

from __future__ import annotations

import pytest

from protocol.principal_rules import MappingRuleError, NoMatchingRule, SslPrincipalMapper


@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules: str) -> None:
    SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize("rules", [
    "default",
    "DEFAUL",
    "DEFAULT/L",
    "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(MappingRuleError):
        SslPrincipalMapper.from_rules(rules)


def test_kafka_mapper_examples() -> None:
    mapper = SslPrincipalMapper.from_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]))
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"


def test_kafka_documentation_example() -> None:
    # docs/security.html, "Customizing SSL User Name"
    mapper = SslPrincipalMapper.from_rules(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
        "DEFAULT")
    service = "CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown"
    assert mapper.name(service) == "serviceuser"
    assert mapper.name("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown") == "adminuser@admin"


@pytest.mark.parametrize(("expected", "rules"), [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
     "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    # empty rules are ignored
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    # escape sequences
    (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),
    (r"[RULE:\**\/+/*/L, RULE:\/*\**/**]", r"RULE:\**\/+/*/L,RULE:\/*\**/**/"),
    # rules rule
    (r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_rules_splitting(expected: str, rules: str) -> None:
    assert str(SslPrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_comma_with_whitespace() -> None:
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


def test_no_matching_rule_fails_like_kafka() -> None:
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=([^,]+),O=Sluice$/$1/")
    assert mapper.name("CN=alice,O=Sluice") == "alice"
    with pytest.raises(NoMatchingRule, match="No rules apply to CN=mallory,O=Elsewhere"):
        mapper.name("CN=mallory,O=Elsewhere")


def test_empty_rules_match_nothing() -> None:
    with pytest.raises(NoMatchingRule):
        SslPrincipalMapper.from_rules("").name("CN=x")


def test_none_means_default() -> None:
    assert SslPrincipalMapper.from_rules(None).name("CN=x,O=y") == "CN=x,O=y"


def test_back_reference_to_a_missing_group_is_literal() -> None:
    # Kafka (from NiFi): with 2 groups, "$1@$4" keeps "$4" as text; "$12" is group 1 then "2"
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=(.*?),OU=(.*?)$/$1@$4/,RULE:^C=(.*)$/$12/")
    assert mapper.name("CN=a,OU=b") == "a@$4"
    assert mapper.name("C=x") == "x2"


def test_replacement_escapes_and_named_groups() -> None:
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=(?<user>[^,]+).*$/\$${user}\\x/")
    assert mapper.name("CN=bob,O=x") == r"$bob\x"


def test_replace_all_semantics_on_a_pattern_that_can_match_empty() -> None:
    # Java: "abc".replaceAll("(.*)", "<$1>") == "<abc><>" (a second, empty match at the end)
    assert SslPrincipalMapper.from_rules("RULE:(.*)/<$1>/").name("abc") == "<abc><>"


def test_case_folding() -> None:
    assert SslPrincipalMapper.from_rules("RULE:^CN=([^,]+).*$/$1/U").name("CN=Ab,O=x") == "AB"
    assert SslPrincipalMapper.from_rules("RULE:^CN=([^,]+).*$/$1/L").name("CN=Ab,O=x") == "ab"


@pytest.mark.parametrize("rules", [r"RULE:^\p{Alpha}+$/x/", "RULE:^[a-z&&[^e]]+$/x/", "RULE:^(unclosed$/x/"])
def test_unsupported_or_invalid_patterns_fail_when_parsed(rules: str) -> None:
    with pytest.raises(MappingRuleError):
        SslPrincipalMapper.from_rules(rules)
