"""Reading YAML from untrusted files, bounded: a document with more than
:data:`MAX_ALIASES` aliases (``*name``) or nested deeper than :data:`MAX_DEPTH` is refused
while it is parsed; a scenario file over :data:`MAX_FILE_BYTES` is refused before."""

from __future__ import annotations

from typing import Any

import yaml

MAX_FILE_BYTES = 1_000_000  # a scenario file
MAX_ALIASES = 8  # YAML aliases (*name) in one document
MAX_DEPTH = 40  # nesting of YAML collections


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses alias bombs and deep nesting while composing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name); expand the repeated values",
                    mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_yaml_load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing alias bombs and deep nesting."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return problem
