"""Reading YAML nodes for the rules: every value checked where it is read, every error naming the file,
the line (from the composed node's mark) and the field."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

from evalbot.rules.schema import RulesError

_Node = yaml.Node  # the composed node type, for loaders that do not import yaml themselves


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


_SHA256 = re.compile(r"[0-9a-f]{64}")


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


_MAX_LABEL = 50  # GitHub refuses longer label names
_MAX_RULES_CHARS = 1_000_000
_MAX_DEPTH = 32


def _join(field: str, key: str | int) -> str:
    return f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}"


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """A value as the error's ``got``, in YAML's words where Python's differ."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _range(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if hi is None:
        return f"a number {'>' if lo_open else '>='} {lo:g}"
    return f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


class _File:
    """One rules file: its display name, its field prefix, and checks that turn nodes into values."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.stem = path.stem

    def fail(self, node: yaml.Node | None, field: str, message: str) -> NoReturn:
        raise RulesError(self.name, None if node is None else node.start_mark.line + 1, field, message)

    def describe(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        try:
            return _show(yaml.constructor.SafeConstructor().construct_object(node))
        except yaml.YAMLError:
            return repr(node.value)

    def items(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """(key, key node, value node) of a mapping, in file order; duplicate keys are errors."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, field, f"expected a mapping, got {self.describe(node)}")
        seen: dict[str, int] = {}
        out = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(key_node, field, f"expected a text key, got {self.describe(key_node)}")
            # The raw text, not the resolved value: a key such as `on` or `1` is still just a name.
            key = key_node.value
            if key in seen:
                self.fail(key_node, _join(field, key), f"duplicate key (first on line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
            out.append((key, key_node, value_node))
        return out

    def mapping(self, node: yaml.Node, field: str, keys: Sequence[str]) -> dict[str, yaml.Node]:
        """The values of a mapping that must have exactly these keys."""
        got = {}
        for key, key_node, value_node in self.items(node, field):
            if key not in keys:
                hint = _did_you_mean(key, keys)
                self.fail(
                    key_node, _join(field, key), f"unknown key{hint}; expected one of: {', '.join(keys)}"
                )
            got[key] = value_node
        for key in keys:
            if key not in got:
                self.fail(node, _join(field, key), f"missing; this mapping needs: {', '.join(keys)}")
        return got

    def sequence(self, node: yaml.Node, field: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, field, f"expected a list, got {self.describe(node)}")
        return list(node.value)

    def scalar(self, node: yaml.Node, field: str, expected: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, field, f"expected {expected}, got {self.describe(node)}")
        try:
            return yaml.constructor.SafeConstructor().construct_object(node)
        except yaml.YAMLError as exc:
            self.fail(
                node, field, f"expected {expected}, got {node.value!r} ({getattr(exc, 'problem', exc)})"
            )

    def number(
        self,
        node: yaml.Node,
        field: str,
        lo: float,
        hi: float | None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        expected = _range(lo, hi, lo_open, hi_open)
        value = self.scalar(node, field, expected)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > lo if lo_open else value >= lo)
        ok = ok and (hi is None or (value < hi if hi_open else value <= hi))
        if not ok:
            self.fail(node, field, f"expected {expected}, got {_show(value)}")
        return float(value)

    def fraction(self, node: yaml.Node, field: str) -> float:
        return self.number(node, field, 0, 1)

    def ratio(self, node: yaml.Node, field: str) -> float:
        """A share of main's figure: above 0, at most 1 (a gate asking for more than main is a typo)."""
        return self.number(node, field, 0, 1, lo_open=True)

    def integer(self, node: yaml.Node, field: str, minimum: int = 1) -> int:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        value = self.scalar(node, field, expected)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(node, field, f"expected {expected}, got {_show(value)}")
        return value

    def boolean(self, node: yaml.Node, field: str) -> bool:
        value = self.scalar(node, field, "true or false")
        if not isinstance(value, bool):
            self.fail(node, field, f"expected true or false, got {_show(value)}")
        return value

    def text(
        self, node: yaml.Node, field: str, pattern: re.Pattern[str] | None = None, what: str = "a string"
    ) -> str:
        value = self.scalar(node, field, what)
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
            self.fail(node, field, f"expected {what}, got {_show(value)}")
        return value

    def choice(self, node: yaml.Node, field: str, choices: Sequence[str], what: str) -> str:
        """A string that must be one of choices (a reference to a name defined elsewhere)."""
        expected = f"{what} (one of: {', '.join(choices)})"
        value = self.scalar(node, field, expected)
        if value not in choices:
            hint = _did_you_mean(value, choices) if isinstance(value, str) else ""
            self.fail(node, field, f"expected {expected}, got {_show(value)}{hint}")
        return value

    def sha256(self, node: yaml.Node, field: str) -> str:
        what = "a sha256 (64 lowercase hex digits)"
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, field, f"expected {what}, got {self.describe(node)}")
        # The raw text: an all-digit hash would otherwise resolve to an int.
        if not _SHA256.fullmatch(node.value):
            self.fail(node, field, f"expected {what}, got {node.value!r}")
        return node.value

    def label(self, node: yaml.Node, field: str) -> str:
        what = f"a label name (1-{_MAX_LABEL} characters, no surrounding spaces)"
        value = self.text(node, field, what=what)
        if len(value) > _MAX_LABEL or value != value.strip():
            self.fail(node, field, f"expected {what}, got {value!r}")
        return value

    def path_pattern(self, node: yaml.Node, field: str) -> str:
        what = "a repository-relative path or glob (no leading '/')"
        value = self.text(node, field, what=what)
        if value.startswith("/"):
            self.fail(node, field, f"expected {what}, got {value!r}")
        return value


def _check_depth(f: _File, text: str) -> None:
    """RulesError at the first collection nested deeper than _MAX_DEPTH (the parser is iterative)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise RulesError(
                    f.name, line, f.stem, f"nested deeper than {_MAX_DEPTH} levels; rules are flat"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _compose(path: Path) -> tuple[_File, yaml.Node]:
    """A file's node tree; syntax errors carry YAML's own line and column."""
    f = _File(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        f.fail(None, f.stem, f"expected UTF-8 text ({exc.reason} at byte {exc.start})")
    if len(text) > _MAX_RULES_CHARS:
        f.fail(
            None, f.stem, f"expected a rules file under {_MAX_RULES_CHARS:,} characters, got {len(text):,}"
        )
    try:
        _check_depth(f, text)  # yaml.compose recurses: 5,000-deep YAML would blow Python's stack
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        column = "" if mark is None else f" at column {mark.column + 1}"
        raise RulesError(
            f.name, line, f.stem, f"invalid YAML{column}: {exc.problem or exc.context}"
        ) from None
    except yaml.YAMLError as exc:
        raise RulesError(f.name, None, f.stem, f"invalid YAML: {exc}") from None
    if root is None:
        raise RulesError(f.name, 1, f.stem, "empty file; expected a mapping")
    return f, root
