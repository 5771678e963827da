"""Which files differ between the code bundles two runs ran (TF-free).

A job records its bundle in provenance as `code: {digest, name, version, entry_points,
files: {path: sha256}}`. Two runs whose bundles differ ran other code, whatever their bits
say: the comparison names the files added, removed or changed, from those manifests, and
flags the difference as changing results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SHOWN = 8  # files named in the explanation; the report lists them all


def _bundle(provenance: Mapping[str, Any]) -> Mapping[str, Any] | None:
    found = provenance.get("code")
    return found if isinstance(found, Mapping) and found.get("digest") else None


def _files(bundle: Mapping[str, Any] | None) -> Mapping[str, Any]:
    files = (bundle or {}).get("files")
    return files if isinstance(files, Mapping) else {}


def bundles_of(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, str | None] | None:
    """{"a", "b"}: the bundle digests of two runs (None: that run ran none), or None when
    both ran the same bundle or neither ran one."""
    ba, bb = _bundle(a), _bundle(b)
    da = str(ba["digest"]) if ba else None
    db = str(bb["digest"]) if bb else None
    return None if da == db else {"a": da, "b": db}


def files_differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Files whose digests differ between the runs' bundles (from their provenance):
    `{"path", "change": "changed" | "added" | "removed", "a", "b"}` (the sha256 on each side)
    in path order; empty when both ran the same bundle or neither ran one."""
    if bundles_of(a, b) is None:
        return []
    fa, fb = _files(_bundle(a)), _files(_bundle(b))
    rows = []
    for path in sorted(set(fa) | set(fb), key=str):
        x, y = fa.get(path), fb.get(path)
        if x == y:
            continue
        change = "removed" if y is None else "added" if x is None else "changed"
        rows.append({"path": str(path), "change": change, "a": x, "b": y})
    return rows


def code_sentence(bundles: Mapping[str, str | None], rows: list[dict[str, Any]]) -> str:
    """The explanation's sentence on differing bundles (their digests and differing files)."""
    da, db = bundles["a"], bundles["b"]
    if da is None or db is None:
        which = "the first run" if db is None else "the second run"
        return f"Only {which} ran a code bundle ({da or db}), which changes results."
    shown = ", ".join(
        r["path"] if r["change"] == "changed" else f"{r['path']} ({r['change']})"
        for r in rows[:_SHOWN]
    )
    more = f" and {len(rows) - _SHOWN} more" if len(rows) > _SHOWN else ""
    which = f"the files whose digests differ: {shown}{more}" if rows else "no file's digest"
    return f"The runs ran different code bundles ({da} vs {db}), which changes results; {which}."


def add_code_diff(
    report: dict[str, Any], a: Mapping[str, Any], b: Mapping[str, Any]
) -> dict[str, Any]:
    """The report with `code_bundles` and `code_files_differing` and, when the bundles
    differ, a sentence naming the files at the front of its explanation."""
    bundles = bundles_of(a, b)
    rows = files_differing(a, b)
    report["code_bundles"] = bundles
    report["code_files_differing"] = rows
    if bundles is not None:
        report["explanation"] = f"{code_sentence(bundles, rows)} {report.get('explanation', '')}"
    return report
