"""The README's library example runs as written (keeps the README true to the code)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})


def test_readme_names_the_two_setup_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text
