"""The value formats Kubernetes and Chaos Mesh parse, checked as they parse them.

Names and labels (ObjectMeta's DNS-1123 and label rules), Go ``time.Duration``
strings, NetworkChaos bandwidth rates (Chaos Mesh's ``ConvertUnitToBytes``) and
Schedule cron specs (robfig/cron's ``ParseStandard``). :mod:`injectors.chaosmesh.schema`
applies them to whole objects; the mapping and the Workflow builder use them to
spell values the cluster will accept.
"""
from __future__ import annotations

import re
from typing import TypeGuard

# --- names and labels (Kubernetes ObjectMeta rules) ---------------------------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns_label(text: object) -> bool:
    """A DNS-1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, at most 63 chars."""
    return isinstance(text, str) and len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: object) -> TypeGuard[str]:
    """A DNS-1123 subdomain (what a custom resource's name must be): dot-separated labels, <= 253 chars."""
    return isinstance(text, str) and len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def is_label_key(text: object) -> bool:
    """A label key: an optional DNS-subdomain prefix and '/', then a name of <= 63 chars."""
    if not isinstance(text, str):
        return False
    prefix, _, name = text.rpartition("/")
    return ((not prefix or is_dns_subdomain(prefix)) and len(name) <= 63
            and _LABEL_NAME.fullmatch(name) is not None)


def is_label_value(text: object) -> bool:
    """A label value: empty, or <= 63 alphanumerics, '-', '_', '.' with alphanumeric ends."""
    return isinstance(text, str) and (text == "" or (len(text) <= 63 and _LABEL_NAME.fullmatch(text) is not None))


# --- Go durations ---------------------------------------------------------------------------------

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_TERM = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_GO_MAX_SECONDS = (2**63 - 1) / 1e9


def parse_go_duration(text: str) -> float:
    """Seconds in a Go ``time.ParseDuration`` string ("300ms", "1h30m", "-1.5h", "0"); ValueError otherwise.

    Follows Go's grammar: an optional sign, then one or more number+unit terms (a number
    has digits before or after an optional '.'), units ns, us/µs, ms, s, m, h; a bare
    "0" is the only unit-less duration; the total must fit in an int64 of nanoseconds.
    """
    if not isinstance(text, str):
        raise ValueError(f"a Go duration is a string, found {text!r}")
    s, sign = text, 1.0
    if s[:1] in ("-", "+"):
        sign, s = (-1.0 if s[0] == "-" else 1.0), s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid Go duration {text!r}")
    total, pos = 0.0, 0
    while pos < len(s):
        m = _GO_TERM.match(s, pos)
        assert m is not None  # the pattern matches the empty string
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"invalid Go duration {text!r}")
        if not unit:
            raise ValueError(f"missing unit in Go duration {text!r}")
        if unit not in _GO_UNITS:
            raise ValueError(f"unknown unit {unit!r} in Go duration {text!r}")
        total += float(f"{whole or '0'}.{frac or '0'}") * _GO_UNITS[unit]
        pos = m.end()
    if total > _GO_MAX_SECONDS:
        raise ValueError(f"Go duration {text!r} overflows int64 nanoseconds")
    return sign * total


# --- bandwidth rates -----------------------------------------------------------------------------

_CHAOS_RATE_UNITS = ("tbps", "gbps", "mbps", "kbps", "bps")  # checked in this order, as Chaos Mesh does


def chaos_rate_bytes(text: str) -> int:
    """Bytes per second of a NetworkChaos bandwidth ``rate``, parsed exactly as Chaos Mesh's
    ``ConvertUnitToBytes`` does (the webhook and the daemon both use it).

    Only the ``bps`` family is accepted — ``bps`` means *bytes*/s, and each step
    ``kbps``..``tbps`` multiplies by 1024 — with an unsigned decimal integer in front,
    case-insensitively. ``mbit`` and friends, though the CRD description lists them,
    fail there with "invalid unit", and so do fractions. ValueError otherwise, also
    for a count that overflows uint64 (Go would silently wrap it).
    """
    if not isinstance(text, str):
        raise ValueError(f"a rate is a string like '1250000bps', found {text!r}")
    s = text.strip().lower()
    for i, unit in enumerate(_CHAOS_RATE_UNITS):
        if s.endswith(unit):
            digits = s[: -len(unit)].strip()
            if not re.fullmatch(r"[0-9]+", digits):
                raise ValueError(f"rate {text!r}: expected an unsigned integer before {unit!r}")
            value = int(digits) * 1024 ** (4 - i)
            if value >= 2**64:
                raise ValueError(f"rate {text!r} overflows uint64 bytes/s")
            return value
    raise ValueError(f"rate {text!r}: invalid unit (Chaos Mesh accepts bps, kbps, mbps, gbps, tbps; bps = bytes/s)")


def format_chaos_rate(bytes_per_s: int) -> str:
    """Spell bytes/s in Chaos Mesh's units exactly: the largest of tbps..bps (powers of 1024) that divides it."""
    if isinstance(bytes_per_s, bool) or not isinstance(bytes_per_s, int) or bytes_per_s < 1:
        raise ValueError(f"expected a positive int of bytes/s, found {bytes_per_s!r}")
    for i, unit in enumerate(_CHAOS_RATE_UNITS):
        scale = 1024 ** (4 - i)
        if bytes_per_s % scale == 0:
            return f"{bytes_per_s // scale}{unit}"
    raise AssertionError("unreachable: bps divides everything")


# --- cron (robfig/cron v3 ParseStandard) ----------------------------------------------------------

_CRON_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_CRON_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (  # (name, low, high, names)
    ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}),
    ("day of week", 0, 6, {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}),
)


def check_cron(spec: str) -> None:
    """Raise ValueError unless robfig/cron's ``ParseStandard`` accepts ``spec`` (what the Schedule webhook calls).

    Accepts an optional ``TZ=``/``CRON_TZ=`` prefix, the descriptors ``@hourly``..``@yearly``,
    ``@every <Go duration>``, or exactly five fields of ``*``, ``?``, numbers or names,
    ranges ``a-b`` and steps ``/n`` within each field's bounds.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty cron spec {spec!r}")
    s = spec.strip()
    if s.startswith(("TZ=", "CRON_TZ=")):
        s = s.partition(" ")[2].strip()
    if s.startswith("@"):
        if s.startswith("@every "):
            parse_go_duration(s[len("@every "):])
            return
        if s not in _CRON_DESCRIPTORS:
            raise ValueError(f"unrecognized cron descriptor {s!r}")
        return
    fields = s.split()
    if len(fields) != 5:
        raise ValueError(f"expected exactly 5 cron fields, found {len(fields)}: {spec!r}")
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS):
        for part in text.split(","):
            rng, _, step = part.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                raise ValueError(f"cron {name}: bad step in {part!r}")
            if rng in ("*", "?"):
                continue
            ends = [names.get(e.lower(), e) for e in rng.split("-")]
            if len(ends) > 2 or not all(isinstance(e, int) or e.isdigit() for e in ends):
                raise ValueError(f"cron {name}: cannot parse {part!r}")
            lo, hi = int(ends[0]), int(ends[-1])
            if not low <= lo <= hi <= high:
                raise ValueError(f"cron {name}: {part!r} is outside {low}..{high}")
