"""Kafka's `ssl.principal.mapping.rules` (KIP-371): a TLS client certificate's subject -> principal.

The rules are a comma-separated list, tried in order; the first that applies gives the name:

* ``DEFAULT``: the distinguished name as it is (``CN=alice,OU=eng,O=Example``);
* ``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` after the last slash (lower or upper
  case the result): applies when `pattern` matches the whole DN, and gives
  ``dn.replaceAll(pattern, replacement)`` with Java's ``$1`` group references. ``\\`` escapes a
  ``/`` (or any character) inside the pattern and the replacement.

If no rule applies, Kafka fails the authentication; `NoMatchingRule` says so here. This is a port
of Kafka's `SslPrincipalMapper` (its splitting regex, its back-reference escaping and Java's
replacement syntax), checked against Kafka's own unit-test cases. Patterns run on Python's `re`,
which reads Java's common syntax the same way; Java-only constructs (``\\p{Alpha}``, ``[a-z&&[^e]]``,
``\\Q..\\E``) are rejected when the rules are parsed. Named groups ``(?<name>...)`` are accepted.

The DN string is what Java's `X500Principal.getName()` prints (RFC 2253), see `protocol.x500`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from protocol.errors import ProtocolError

# Kafka's SslPrincipalMapper.RULE_PATTERN / RULE_SPLITTER, verbatim (Java and Python agree on them)
_RULE_PATTERN: Final = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER: Final = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER: Final = re.compile(_RULE_PATTERN)
_BACK_REFERENCE: Final = re.compile(r"\$(\d+)")
_JAVA_ONLY: Final = re.compile(r"\\[pPQE]|&&")
_JAVA_NAMED_GROUP: Final = re.compile(r"(?<!\\)\(\?<(?=[A-Za-z])")


class MappingRuleError(ProtocolError, ValueError):
    """An invalid rule (Kafka: IllegalArgumentException at startup)."""


class NoMatchingRule(ProtocolError):
    """No rule applies to the DN (Kafka fails the authentication)."""


def _java_to_python_pattern(pattern: str) -> re.Pattern[str]:
    if _JAVA_ONLY.search(pattern):
        raise MappingRuleError(f"rule pattern {pattern!r} uses Java-only regex syntax (\\p, \\Q..\\E or &&)")
    try:
        return re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern))
    except re.error as exc:
        raise MappingRuleError(f"rule pattern {pattern!r} is not a valid regex: {exc}") from None


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: str | None = None          # None: DEFAULT
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    @property
    def is_default(self) -> bool:
        return self.pattern is None

    def apply(self, dn: str) -> str | None:
        """The principal name, or None if the rule does not apply."""
        if self.pattern is None:
            return dn
        compiled = _java_to_python_pattern(self.pattern)
        if compiled.fullmatch(dn) is None:
            return None
        replacement = _escape_literal_back_references(self.replacement, compiled.groups)
        result = compiled.sub(lambda m: _java_replacement(m, replacement), dn)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:  # Kafka's Rule.toString
        if self.pattern is None:
            return "DEFAULT"
        case = "/L" if self.to_lower else "/U" if self.to_upper else ""
        return f"RULE:{self.pattern}/{self.replacement}{case}"


def _escape_literal_back_references(unescaped: str, groups: int) -> str:
    """Kafka's `escapeLiteralBackReferences` (from Apache NiFi), quirks included: a ``$n`` naming a
    group the pattern does not have becomes a literal ``$n`` (the insert positions are those of the
    original string, as in Kafka)."""
    if groups == 0:
        return unescaped
    value = unescaped
    for m in _BACK_REFERENCE.finditer(unescaped):
        number = m.group(1)
        if number.startswith("0"):
            continue
        index = int(number)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = m.start(1)
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _java_replacement(m: re.Match[str], replacement: str) -> str:
    """Java's `Matcher.appendReplacement`: ``\\x`` is a literal x, ``$n`` the longest group number
    that exists, ``${name}`` a named group; an unmatched group adds nothing."""
    out: list[str] = []
    i, n = 0, len(replacement)
    groups = m.re.groups
    while i < n:
        c = replacement[i]
        if c == "\\":
            i += 1
            if i == n:
                raise NoMatchingRule("rule replacement ends with an escape character")
            out.append(replacement[i])
            i += 1
        elif c == "$":
            i += 1
            if i == n:
                raise NoMatchingRule("rule replacement has a '$' without a group")
            ref: int | str
            if replacement[i] == "{":
                close = replacement.find("}", i)
                name = replacement[i + 1:close] if close > i else ""
                if not name or not name.isalnum() or not name.isascii() or name[0].isdigit():
                    raise NoMatchingRule("rule replacement has an invalid ${name} group reference")
                if name not in m.re.groupindex:
                    raise NoMatchingRule(f"rule replacement names no group {{{name}}}")
                ref = name
                i = close + 1
            else:
                if not "0" <= replacement[i] <= "9":
                    raise NoMatchingRule("rule replacement has an illegal group reference")
                number = int(replacement[i])
                i += 1
                while i < n and "0" <= replacement[i] <= "9" and number * 10 + int(replacement[i]) <= groups:
                    number = number * 10 + int(replacement[i])
                    i += 1
                if number > groups:
                    raise NoMatchingRule(f"rule replacement refers to group {number} of {groups}")
                ref = number
            out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _split(rules: str) -> list[str]:
    """Kafka's splitRules: `Matcher.find()` over the trimmed string, keeping group 1."""
    text = rules.strip()
    out: list[str] = []
    pos = 0
    while pos <= len(text):
        m = _RULE_SPLITTER.search(text, pos)
        if m is None:
            break
        out.append(m.group(1))
        # Java's find() resumes at the end of the match, or one further after an empty match
        pos = m.end() if m.end() > m.start() else m.end() + 1
    return out


def _parse(rule: str) -> Rule | None:
    m = _RULE_PARSER.match(rule)
    if m is None:
        raise MappingRuleError(f"Invalid rule: {rule}")
    if m.end() != len(rule):
        raise MappingRuleError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end():]}`")
    if m.group(1) is not None:
        return Rule()
    if m.group(2) is not None:
        pattern = m.group(2)
        _java_to_python_pattern(pattern)  # reject it now rather than at the first client
        return Rule(pattern, m.group(4), m.group(6) == "L", m.group(6) == "U")
    return None  # empty rules are ignored


class SslPrincipalMapper:
    """Kafka's `SslPrincipalMapper.fromRules(rules)`; `name(dn)` is its `getName`."""

    def __init__(self, rules: str | None = "DEFAULT") -> None:
        parsed = [_parse(r) for r in _split("DEFAULT" if rules is None else rules)]
        self.rules: tuple[Rule, ...] = tuple(r for r in parsed if r is not None)

    @classmethod
    def from_rules(cls, rules: str | None) -> SslPrincipalMapper:
        return cls(rules)

    def name(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRule(f"No rules apply to {dn}, rules [{', '.join(map(str, self.rules))}]")

    def __str__(self) -> str:  # Kafka's toString
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"
