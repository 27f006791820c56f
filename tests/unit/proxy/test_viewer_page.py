"""The session viewer page carries its data in a JSON script element that agent text cannot end early or
keep open (``</script>``, ``<!--<script>``): the page's data reads back whole."""

from __future__ import annotations

import json

from dressage.proxy.http.viewer_page import render_viewer


def test_agent_text_cannot_end_or_hold_open_the_data_element():
    hostile = "<!--<script> </script><b>x</b>"
    doc = {"session_id": "s", "steps": [{"messages": [{"role": "user", "content": hostile}]}]}
    page = render_viewer([doc])
    head = '<script id="viewer-data" type="application/json">'
    start = page.index(head) + len(head)
    end = page.index("</script>", start)
    payload = page[start:end]
    assert "<" not in payload  # nothing the HTML parser reads inside a script element
    assert json.loads(payload)["sessions"][0]["steps"][0]["messages"][0]["content"] == hostile
    assert "</html>" in page[end:]  # the rest of the page (the viewer's code) is still after it
