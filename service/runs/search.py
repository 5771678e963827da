"""The runs list's search: `params.training.optimizer.params.learning_rate = 0.003 and
metrics.accuracy > 0.5`, as MLflow's users write it.

A search is clauses joined by `and` (case-insensitive); each clause is `KEY OP VALUE`:
- `params.PATH`: a spec field by its dotted path (as `repro compare` names it), `=`, `!=`,
  `<`, `<=`, `>`, `>=` against a number, or `=`/`!=` against text (`'adam'`, `true`);
- `metrics.NAME`: the run's final value of a recorded metric, compared with a number;
- `tag`: `=` a tag the run has, `!=` one it has not;
- `status`, `verdict`, `name` (the run's name), `experiment` (its name): `=`/`!=` text, and
  `~` for "contains" (`name ~ sweep`).
Values are numbers, words, or text in single or double quotes. Every clause narrows the
list through an index: parameters through `experiment_params`, metrics through
`run_metrics`, tags through `run_tags`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, not_, or_, select

from service.errors import InvalidQuery
from service.persistence.models import Experiment, ExperimentParam, Run, RunMetric, RunTag, Verdict

MAX_CHARS = 2000
MAX_CLAUSES = 20
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<op><=|>=|!=|=|<|>|~)
      | (?P<word>[^\s=!<>~'"]+)
    )""",
    re.VERBOSE,
)
_NUMERIC = {"<", "<=", ">", ">=", "=", "!="}
_TEXT_KEYS = {"status", "verdict", "name", "experiment"}


@dataclass(frozen=True)
class Clause:
    key: str
    op: str
    value: str
    quoted: bool

    @property
    def number(self) -> float | None:
        if self.quoted:
            return None
        try:
            return float(self.value)
        except ValueError:
            return None


def parse(text: str) -> list[Clause]:
    """The clauses of a search; InvalidQuery saying where it went wrong otherwise."""
    if len(text) > MAX_CHARS:
        raise _refuse(f"a search is at most {MAX_CHARS} characters")
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        if not text[at:].strip():
            break
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise _refuse(f"cannot read the search at character {at + 1}: {text[at : at + 20]!r}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        at = match.end()
    clauses: list[Clause] = []
    i = 0
    while i < len(tokens):
        if len(tokens) - i < 3:
            raise _refuse(f"an incomplete clause at the end: {_said(tokens[i:])!r}")
        (k_kind, key), (o_kind, op), (v_kind, value) = tokens[i : i + 3]
        if k_kind != "word" or o_kind != "op" or v_kind == "op":
            got = _said(tokens[i : i + 3])
            raise _refuse(f"expected KEY OP VALUE (e.g. metrics.accuracy > 0.9), got {got!r}")
        quoted = v_kind == "string"
        if quoted:
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        clauses.append(_checked(Clause(key, op, value, quoted)))
        i += 3
        if i < len(tokens):
            if tokens[i] != ("word", tokens[i][1]) or tokens[i][1].lower() != "and":
                raise _refuse(f"clauses are joined by `and`, not {tokens[i][1]!r}")
            i += 1
            if i == len(tokens):
                raise _refuse("the search ends with `and`")
    if len(clauses) > MAX_CLAUSES:
        raise _refuse(f"a search has at most {MAX_CLAUSES} clauses")
    return clauses


def _said(tokens: list[tuple[str, str]]) -> str:
    return " ".join(t for _, t in tokens)


def _refuse(message: str) -> InvalidQuery:
    return InvalidQuery(message, errors=[{"loc": "query.search", "msg": message}])


def _checked(clause: Clause) -> Clause:
    key, op = clause.key, clause.op
    if key.startswith("params.") and len(key) > len("params."):
        if op == "~" or (op not in ("=", "!=") and clause.number is None):
            raise _refuse(f"{key}: {op} needs a number (=, != also take text)")
    elif key.startswith("metrics.") and len(key) > len("metrics."):
        if op == "~" or clause.number is None:
            raise _refuse(f"{key}: a metric is compared with a number, not {clause.value!r}")
    elif key in ("tag", "tags"):
        if op not in ("=", "!="):
            raise _refuse(f"{key}: only = (has the tag) and != (has not)")
    elif key in _TEXT_KEYS:
        if op not in ("=", "!=", "~"):
            raise _refuse(f"{key}: only =, != and ~ (contains)")
    else:
        raise _refuse(
            f"unknown key {key!r}: use params.PATH, metrics.NAME, tag, status, verdict, "
            "name or experiment"
        )
    return clause


_COMPARE: dict[str, Callable[[Any, Any], ColumnElement[bool]]] = {
    "=": lambda c, v: c == v,
    "!=": lambda c, v: c != v,
    "<": lambda c, v: c < v,
    "<=": lambda c, v: c <= v,
    ">": lambda c, v: c > v,
    ">=": lambda c, v: c >= v,
}


def conditions(clauses: list[Clause]) -> list[ColumnElement[bool]]:
    """Conditions on `Run` (with `Experiment` reachable by `Run.experiment_id`), one per
    clause."""
    return [_condition(c) for c in clauses]


def _condition(c: Clause) -> ColumnElement[bool]:
    if c.key.startswith("params."):
        name = c.key[len("params.") :]
        number = c.number
        compared = (
            _COMPARE[c.op](ExperimentParam.num, number)
            if number is not None
            else _COMPARE[c.op](ExperimentParam.text, c.value)
        )
        matching = select(ExperimentParam.experiment_id).where(
            ExperimentParam.name == name, compared
        )
        return Run.experiment_id.in_(matching)
    if c.key.startswith("metrics."):
        name = c.key[len("metrics.") :]
        return exists().where(
            RunMetric.run_id == Run.id,
            RunMetric.name == name,
            _COMPARE[c.op](RunMetric.value, c.number),
        )
    if c.key in ("tag", "tags"):
        has = exists().where(RunTag.run_id == Run.id, RunTag.tag == c.value)
        return has if c.op == "=" else not_(has)
    if c.key == "experiment":
        names = select(Experiment.id).where(_text(Experiment.name, c))
        return Run.experiment_id.in_(names)
    if c.key == "verdict":
        found = exists().where(Verdict.run_id == Run.id, _text(Verdict.verdict, c))
        return found if c.op != "!=" else or_(not_(exists().where(Verdict.run_id == Run.id)), found)
    if c.key == "status":
        return _text(Run.status, c)
    return _text(Run.name, c)


def _text(column: Any, c: Clause) -> ColumnElement[bool]:
    if c.op == "~":
        contains: ColumnElement[bool] = column.icontains(c.value, autoescape=True)
        return contains
    if c.op == "!=":
        return or_(column.is_(None), column != c.value)
    return and_(column == c.value)
