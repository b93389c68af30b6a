"""What the upstream writer's parts share: the file being written (its
imports, module-level code and test body), the modules of vLLM's test
helpers, the refusal of a run the writer cannot state, and the lines
that assert a fact (what they refer to in the test: :class:`Context`)."""

from __future__ import annotations

import dataclasses
import textwrap

from fuzz.model import Fact

__all__ = ["CORE", "UNIT", "Context", "File", "Unwritable", "assert_lines", "message_lines", "quoted"]

# vLLM's test helpers: the core ones, and the KV connector unit tests'.
CORE = "tests.v1.core.utils"
UNIT = "tests.v1.kv_connector.unit.utils"


class Unwritable(Exception):
    """The run uses something the writer does not state (yet)."""


class File:
    """The file's imports and lines, gathered as the test is written."""

    def __init__(self) -> None:
        self.imports: dict[str, set[str]] = {}
        self.top: list[str] = []  # module-level code after the imports
        self.body: list[str] = []

    def need(self, module: str, *names: str) -> None:
        self.imports.setdefault(module, set()).update(names)

    def import_lines(self) -> list[str]:
        lines = ["import pytest", *(f"import {m}" for m in sorted(self.imports) if not self.imports[m]), ""]
        for module in sorted(m for m in self.imports if self.imports[m]):
            names = sorted(self.imports[module])
            line = f"from {module} import {', '.join(names)}"
            if len(line) > 88:
                line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"
            lines.append(line)
        return lines


@dataclasses.dataclass(frozen=True)
class Context:
    """What a fact's lines refer to in the test: the variable of each
    request, the step's ``SchedulerOutput`` variable, the hash block size
    and each group's block size."""

    names: dict[str, str]
    output: str
    step: int
    hash_block_size: int
    block_sizes: tuple[int, ...]

    def key_index(self, tokens: int, group: int | None = None) -> int | None:
        """The index in ``request.block_hashes`` of the key over the first
        ``tokens`` tokens (None where the group's keys are not the hasher's).
        A group of larger blocks keys each by the hash at its last hash-block
        boundary (``BlockHashListWithBlockSize``), a partial entry by the hash
        at its own end: the hasher's key either way."""
        if tokens % self.hash_block_size or tokens <= 0:
            return None
        if group is not None and self.block_sizes[group] % self.hash_block_size:
            return None
        return tokens // self.hash_block_size - 1


def message_lines(text: str) -> list[str]:
    """``text`` as string literals of at most 80 characters, one a line."""
    return ["        " + quoted(part) for part in textwrap.wrap(text, 80, drop_whitespace=False)]


def quoted(text: str) -> str:
    """``text`` as a double-quoted literal (vLLM's style)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def assert_lines(expression: str, fact: Fact, message: str) -> list[str]:
    """``assert`` ``expression`` against the fact's expected value."""
    expected = fact.expected
    if fact.relation == "len":
        test = f"len({expression}) == {expected!r}"
    elif fact.relation == "in":
        test = f"{expression} in {tuple(expected)!r}"  # type: ignore[arg-type]
    elif expected is True:
        test = expression
    elif expected is False:
        test = f"not {expression}" if " " not in expression else f"not ({expression})"
    else:
        test = f"{expression} {fact.relation} {expected!r}"
    return [f"    assert {test}, (", *message_lines(message), "    )"]
