"""Sluice's TLS principals against the real thing: the JDK's `X500Principal.getName()` and Kafka's
`SslPrincipalMapper`, run from the Kafka jars the broker tests use (tests/oracle/PrincipalOracle.java).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from protocol.principal_rules import MappingRuleError, NoMatchingRule, SslPrincipalMapper
from protocol.x500 import certificate_subject
from tests.harness.kafka import KAFKA_LIBS, REPO
from tests.unit.protocol.subjects import SUBJECTS, der_certificate

pytestmark = pytest.mark.integration

ORACLE = REPO / "tests" / "oracle" / "PrincipalOracle.java"
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "r": "\r", "\\": "\\"}

RULES = [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,DEFAULT",
    "RULE:^CN=([^,]+),O=Sluice$/$1/",
    "RULE:^CN=(.*?),OU=(.*?)$/$1@$4/,RULE:^C=(.*)$/$12/,DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?)$/$5$6/",
    r"RULE:^CN=(?<user>[^,]+).*$/\$${user}\\x/",
    "RULE:(.*)/<$1>/",
    r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT",
    "RULE:^(.*)$/$0-$1/U",
    "RULE:^O=(x)?.*$/[$1]/",
    "RULE:^CN=([a-z]+)$/$2/",
    "RULE:^CN=([a-z]+)$/$/",
    "RULE:^CN=([a-z]+)$/x\\/",
    ",,",
]
DNS = ["CN=Duke,OU=ServiceUsers,O=Org,C=US", "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US",
       "cn=duke,ou=sme,dc=mycp,dc=com", "cN=duke,OU=JavaSoft,O=Sun Microsystems", "CN=alice,O=Sluice",
       "CN=a,OU=b", "C=x", "CN=bob,O=x", "abc", r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz", "O=y", "CN=abc", ""]


def ask(requests: list[str]) -> list[str]:
    done = subprocess.run(["java", "-cp", f"{KAFKA_LIBS}/*", str(ORACLE)], input="\n".join(requests) + "\n",
                          capture_output=True, text=True, timeout=120, check=True)
    answers = done.stdout.splitlines()
    assert len(answers) == len(requests), done.stderr
    return [_UNESCAPE.sub(lambda m: _ESCAPES[m.group(1)], a) for a in answers]


def test_subjects_print_as_the_jdk_prints_them(tmp_path: Path) -> None:
    requests, expected = [], []
    for case, (subject, _) in sorted(SUBJECTS.items()):
        der = der_certificate(subject)
        path = tmp_path / f"{case}.der"
        path.write_bytes(der)
        requests.append(f"subject {path}")
        expected.append(f"ok {certificate_subject(der)}")
    assert ask(requests) == expected


def test_mapping_rules_map_as_kafka_maps_them() -> None:
    requests, expected = [], []
    for rules in RULES:
        for dn in DNS:
            requests.append(f"map {rules}\t{dn}")
            try:
                expected.append(f"ok {SslPrincipalMapper.from_rules(rules).name(dn)}")
            except NoMatchingRule:
                expected.append("error")   # Kafka: NoMatchingRule, or the replacement's own exception
            except MappingRuleError:
                expected.append("error IllegalArgumentException")
    answers = ask(requests)
    normalized = [a if a.startswith("ok ") or e != "error" else "error" for a, e in zip(answers, expected,
                                                                                          strict=True)]
    assert list(zip(requests, normalized, strict=True)) == list(zip(requests, expected, strict=True))
