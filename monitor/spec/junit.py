"""JUnit XML of spec results, in the shape CI servers read (Ant's, as Jenkins' XSD has it).

One `testsuite` per spec file, one `testcase` per expectation, a `failure` with the
diff for each one not met. Every attribute the stricter schemas require is written
(`id`, `package`, `hostname`, `timestamp` without a zone, times with 3 decimals).
"""

from __future__ import annotations

import datetime as dt
import socket
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from monitor.spec.runner import SpecResult, report


def _t(seconds: float) -> str:
    return f"{seconds:.3f}"


def junit_xml(results: Sequence[SpecResult], when: dt.datetime | None = None) -> bytes:
    """The results as a JUnit XML document."""
    when = (when or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S")
    host = socket.gethostname() or "localhost"
    cases = sum(len(r.outcomes) for r in results)
    failures = sum(not o.ok for r in results for o in r.outcomes)
    total = sum(r.replayed.seconds for r in results)
    root = ET.Element(
        "testsuites",
        name="flopwatch test",
        tests=str(cases),
        failures=str(failures),
        errors="0",
        time=_t(total),
    )
    for i, r in enumerate(results):
        failed = sum(not o.ok for o in r.outcomes)
        suite = ET.SubElement(
            root,
            "testsuite",
            id=str(i),
            package="flopwatch",
            name=str(r.path),
            timestamp=stamp,
            hostname=host,
            tests=str(len(r.outcomes)),
            failures=str(failed),
            errors="0",
            skipped="0",
            time=_t(r.replayed.seconds),
        )
        props = ET.SubElement(suite, "properties")
        inp = r.spec.input
        source = inp.recording or f"scenario {inp.scenario} seed {inp.seed}"
        ET.SubElement(props, "property", name="input", value=source)
        classname = r.path.name.removesuffix(".yaml").replace(".", "_")
        for o in r.outcomes:
            case = ET.SubElement(suite, "testcase", classname=classname, name=o.name, time=_t(0.0))
            if not o.ok:
                fail = ET.SubElement(
                    case, "failure", message=o.detail.split("\n", 1)[0], type="ExpectationNotMet"
                )
                fail.text = o.detail
        ET.SubElement(suite, "system-out").text = report(r)
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml + b"\n"
