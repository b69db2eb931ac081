"""A checker for the JUnit XML shape CI servers read: Ant's format, as the Jenkins xUnit
plugin's `junit-10.xsd` and the stricter windyroad `JUnit.xsd` define it.

Written out rather than validated with an XSD library: what matters is the intersection
of the two schemas (every attribute either requires, in the order both require), and
each rule below is one line of those schemas.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

# junit-10.xsd's SUREFIRE_TIME; windyroad's xs:decimal accepts every value it does.
SUREFIRE_TIME = re.compile(r"^(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]{0,3})?$")
# windyroad's ISO8601_DATETIME_PATTERN: no zone.
TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}$")
SUITES_ATTRS = {"name", "time", "tests", "failures", "disabled", "errors"}
SUITE_REQUIRED = {"name", "tests", "failures", "errors", "time", "timestamp", "hostname",
                  "id", "package"}  # fmt: skip
SUITE_ATTRS = SUITE_REQUIRED | {"skipped", "disabled", "log", "group", "url", "file"}
CASE_REQUIRED = {"name", "classname", "time"}
CASE_ATTRS = CASE_REQUIRED | {"assertions", "status", "file", "line"}


def _ints(el: ET.Element, *names: str) -> None:
    for n in names:
        if n in el.attrib:
            assert re.fullmatch(r"[0-9]+", el.attrib[n]), f"{el.tag}@{n}={el.attrib[n]!r}"


def check_junit(xml: bytes) -> list[ET.Element]:
    """Assert that `xml` has the shape; returns the testsuite elements."""
    root = ET.fromstring(xml)  # noqa: S314 - our own output
    assert root.tag == "testsuites"
    assert set(root.attrib) <= SUITES_ATTRS, set(root.attrib) - SUITES_ATTRS
    _ints(root, "tests", "failures", "errors", "disabled")
    if "time" in root.attrib:
        assert SUREFIRE_TIME.match(root.attrib["time"])
    suites = list(root)
    assert all(s.tag == "testsuite" for s in suites)
    for suite in suites:
        _check_suite(suite)
    if "tests" in root.attrib:
        assert int(root.attrib["tests"]) == sum(int(s.attrib["tests"]) for s in suites)
    return suites


def _check_suite(suite: ET.Element) -> None:
    attrs = set(suite.attrib)
    assert attrs >= SUITE_REQUIRED, f"testsuite lacks {SUITE_REQUIRED - attrs}"
    assert attrs <= SUITE_ATTRS, f"testsuite has {attrs - SUITE_ATTRS}"
    _ints(suite, "tests", "failures", "errors", "skipped", "disabled", "id")
    assert SUREFIRE_TIME.match(suite.attrib["time"]), suite.attrib["time"]
    assert TIMESTAMP.match(suite.attrib["timestamp"]), suite.attrib["timestamp"]
    assert suite.attrib["name"]
    assert suite.attrib["hostname"]
    tags = [c.tag for c in suite]
    # windyroad: properties, testcase*, system-out, system-err, in that order.
    assert tags[0] == "properties", tags
    assert tags[-2:] == ["system-out", "system-err"], tags
    assert set(tags[1:-2]) <= {"testcase"}, tags
    for prop in suite[0]:
        assert prop.tag == "property"
        assert {"name", "value"} <= set(prop.attrib)
    cases = suite.findall("testcase")
    failures = 0
    for case in cases:
        assert CASE_REQUIRED <= set(case.attrib) <= CASE_ATTRS, case.attrib
        assert SUREFIRE_TIME.match(case.attrib["time"])
        for child in case:
            assert child.tag in ("failure", "error"), child.tag
            assert "type" in child.attrib  # windyroad requires it
            assert set(child.attrib) <= {"type", "message"}
        failures += case.find("failure") is not None
    assert int(suite.attrib["tests"]) == len(cases)
    assert int(suite.attrib["failures"]) == failures
