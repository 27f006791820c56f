"""The hierarchy drawn in dressage.errors' docstring is the real class tree, and lists every class."""

import inspect
import re

import dressage.errors as errors

ENTRY = re.compile(r"^((?:│   |    )*)([├└]── )?([A-Z]\w*)")


def _drawn_tree():
    """``{class name: parent name}`` as the docstring draws it (depth = the entry's column / 4)."""
    parents, stack = {}, []
    for line in errors.__doc__.split("::", 1)[1].splitlines():
        m = ENTRY.match(line[4:])
        if not m:
            continue
        depth = len(m.group(1)) // 4 + (1 if m.group(2) else 0)
        del stack[depth:]
        parents[m.group(3)] = stack[-1] if stack else None
        stack.append(m.group(3))
    return parents


def test_the_docstring_tree_is_the_class_tree():
    drawn = _drawn_tree()
    classes = {n: c for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.DressageError)}
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        base = next((b for b in classes[name].__bases__ if issubclass(b, errors.DressageError)), None)
        assert (base.__name__ if base else None) == parent, name
