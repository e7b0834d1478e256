"""A corpus run as JUnit XML, the report CI systems show natively.

One ``testsuite`` named ``kda replay``; one ``testcase`` per trace (``name`` the trace's
path, ``time`` its seconds). A mismatch is a ``failure`` whose ``message`` is the first
mismatch; a trace refused (damaged), whose implementation raised or whose worker crashed is
an ``error`` of that ``type``; a trace an interruption left is ``skipped``.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from traces.corpus.run import CorpusRun
from traces.format.files import written_whole

SUITE = "kda replay"

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
"""Characters XML 1.0 cannot hold, even escaped."""


def _text(s: str) -> str:
    """``s`` with the characters XML cannot hold written as Python escapes (``\\x1b``)."""
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), s)


def junit_xml(run: CorpusRun) -> bytes:
    """The JUnit XML document of ``run`` (UTF-8, with its declaration)."""
    counts = run.counts()
    suite = ET.Element("testsuite", name=SUITE, tests=str(len(run.traces)), failures=str(counts["mismatch"]),
                       errors=str(counts["refused"] + counts["raised"] + counts["crashed"]),
                       skipped=str(counts["not_run"]), time=f"{run.seconds:.3f}")
    by_trace = {r.trace: r for r in run.results}
    for trace in run.traces:
        result = by_trace.get(trace)
        case = ET.SubElement(suite, "testcase", classname="kda.replay", name=_text(trace),
                             time=f"{result.seconds:.3f}" if result else "0")
        if result is None:
            ET.SubElement(case, "skipped", message="not run: the replay was interrupted")
        elif result.outcome != "passed":
            tag = "failure" if result.outcome == "mismatch" else "error"
            ET.SubElement(case, tag, message=_text(result.message), type=result.outcome).text = _text(result.message)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def write_junit(path: str | os.PathLike, run: CorpusRun) -> None:
    """Write ``junit_xml(run)`` to ``path``, whole or not at all."""
    with written_whole(path) as tmp:
        tmp.write_bytes(junit_xml(run))


__all__ = ["junit_xml", "write_junit"]
