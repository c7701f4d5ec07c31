"""Arbitrary JSON documents for the readers' property tests: any JSON value, every path into a
document, and the document with one path's value replaced (a copy)."""
from __future__ import annotations

import copy
from collections.abc import Iterator

from hypothesis import strategies as st

# Any JSON value, small: null, booleans, numbers, short strings, and lists and objects of them.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10)


def paths(node, prefix: tuple = (), lists: bool = False) -> Iterator[tuple]:
    """Every path of keys into node (and of list indexes, with lists), the empty path (node
    itself) first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key), lists)
    elif lists and isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*prefix, i), lists)


def replaced(doc, path: tuple, value):
    """A copy of doc with the value at path replaced (the empty path: value itself)."""
    if not path:
        return value
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc
