"""Reading a spec for submission: a file (YAML, or JSON by its suffix) or a mapping,
parsed here so a mistake names the file, and sent to the API as JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecFileError


class SpecLoader(yaml.SafeLoader):
    """The API's YAML reading: `1e-3` is a float (as in JSON and YAML 1.2), no aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed in a spec", mark)
        return super().compose_node(parent, index)


# The same float pattern as the API's loader (worker.spec), so a value means the same here.
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def read_spec(path: Path) -> Any:
    """A spec file's data; SpecFileError naming the file if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as fh:
            if path.suffix.lower() == ".json":
                return json.load(fh)
            # Read from the open file, YAML's messages say `in "<path>", line N`.
            return yaml.load(fh, Loader=SpecLoader)
    except OSError as exc:
        raise SpecFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecFileError(f"malformed JSON in {path}: {exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecFileError(f"malformed YAML in {path}: {exc}") from None


def submission_body(spec: str | Path | Mapping[str, Any]) -> tuple[bytes, str]:
    """The request body and content type that carry a spec (a file path or a mapping).

    The data goes as JSON. Where JSON cannot hold it (NaN, a date), a file goes as its own
    text, so the API refuses it with the reason it gives for that text.
    """
    if isinstance(spec, Mapping):
        data: Any = dict(spec)
        text: bytes | None = None
        kind = "application/json"
    else:
        path = Path(spec)
        data = read_spec(path)
        text = path.read_bytes()
        kind = "application/json" if path.suffix.lower() == ".json" else "application/yaml"
    try:
        return json.dumps(data, allow_nan=False).encode(), "application/json"
    except (TypeError, ValueError) as exc:
        if text is None:
            raise SpecFileError(f"the spec holds a value JSON cannot carry: {exc}") from None
        return text, kind
