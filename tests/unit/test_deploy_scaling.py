"""Each worker pool's KEDA query, as the Kubernetes overlays render it, evaluated on scrapes
of the API's `/metrics`: it counts the runs the pool's own workers hold plus the queued runs
they could claim (image, devices, code, hardware), answers 0 while the API is scraped and
nothing is there, and answers nothing at all once the API's series are gone, so KEDA falls
back instead of scaling busy pools to zero.

The queries are evaluated by a small PromQL interpreter covering what they use (selectors
with `=`, `=~`; `sum`/`max` with `by`; `+`, `*` by a number; `or on()`), with Prometheus'
semantics: regex matchers are anchored, aggregations of nothing give nothing, binary
operators match series on their labels, and `__name__` is dropped by all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kustomize import rendered_pool
from worker.record import hardware

KUBERNETES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
H100 = "gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555"
A100 = "gpu:nvidia-a100-sxm4-80gb:sm108:80gb:full:drv550"
XEON = "cpu:genuineintel:intel-r-xeon-r-platinum-8480:avx512_core_amx"
OTHER_IMAGE = "sha256:" + "ef" * 32

Labels = frozenset[tuple[str, str]]
Vector = list[tuple[Labels, float]]
Sample = tuple[str, dict[str, str], float]

# --- a PromQL subset -------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r'|(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>=~|!=|!~|[=(){},+*]))'
)


def _tokens(query: str) -> list[str]:
    out, at = [], 0
    while at < len(query.rstrip()):
        match = _TOKEN.match(query, at)
        assert match, f"cannot read the query at {query[at : at + 30]!r}"
        out.append(match.group(match.lastgroup or ""))
        at = match.end()
    return out


def _without_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


@dataclass
class _Parser:
    tokens: list[str]
    samples: list[Sample]
    at: int = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        assert expected is None or token == expected, (expected, token, self.at)
        self.at += 1
        return token

    def labels(self) -> list[str]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return names

    def expression(self) -> Vector | float:  # `or`: the loosest binding
        left = self.sum()
        while self.peek() == "or":
            self.take("or")
            on = self.labels() if self.peek() == "on" and self.take("on") else None
            right = self.sum()
            assert isinstance(left, list) and isinstance(right, list)
            left = _or(left, right, on)
        return left

    def sum(self) -> Vector | float:
        left = self.product()
        while self.peek() == "+":
            self.take("+")
            left = _add(left, self.product())
        return left

    def product(self) -> Vector | float:
        left = self.operand()
        while self.peek() == "*":
            self.take("*")
            left = _multiply(left, self.operand())
        return left

    def operand(self) -> Vector | float:
        token = self.take()
        if token == "(":
            value = self.expression()
            self.take(")")
            return value
        if re.fullmatch(r"\d+(?:\.\d+)?", token):
            return float(token)
        if token in ("sum", "max"):
            by = self.labels() if self.peek() == "by" and self.take("by") else []
            self.take("(")
            inner = self.expression()
            self.take(")")
            assert isinstance(inner, list)
            return _aggregate(token, by, inner)
        return self.selector(token)

    def selector(self, name: str) -> Vector:
        matchers = []
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label, op, text = self.take(), self.take(), self.take()
                matchers.append((label, op, text[1:-1].replace('\\"', '"')))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        out: Vector = []
        for metric, labels, value in self.samples:
            if metric == name and all(_matches(labels.get(k, ""), op, v) for k, op, v in matchers):
                out.append((frozenset({**labels, "__name__": metric}.items()), value))
        return out


def _matches(value: str, op: str, wanted: str) -> bool:
    if op == "=":
        return value == wanted
    if op == "!=":
        return value != wanted
    found = re.fullmatch(wanted, value) is not None  # Prometheus anchors its regexes
    return found if op == "=~" else not found


def _aggregate(how: str, by: list[str], vector: Vector) -> Vector:
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector:
        key = frozenset((k, dict(labels).get(k, "")) for k in by)
        groups.setdefault(frozenset((k, v) for k, v in key if v), []).append(value)
    combine = sum if how == "sum" else max
    return [(labels, float(combine(values))) for labels, values in groups.items()]


def _multiply(left: Vector | float, right: Vector | float) -> Vector | float:
    if isinstance(left, float) and isinstance(right, float):
        return left * right
    number, vector = (left, right) if isinstance(left, float) else (right, left)
    assert isinstance(number, float) and isinstance(vector, list)
    return [(_without_name(labels), number * value) for labels, value in vector]


def _add(left: Vector | float, right: Vector | float) -> Vector:
    assert isinstance(left, list) and isinstance(right, list), "only vector + vector is used"
    others = {_without_name(labels): value for labels, value in right}
    return [
        (_without_name(labels), value + others[_without_name(labels)])
        for labels, value in left
        if _without_name(labels) in others
    ]


def _or(left: Vector, right: Vector, on: list[str] | None) -> Vector:
    def signature(labels: Labels) -> Labels:
        named = _without_name(labels)
        return named if on is None else frozenset((k, v) for k, v in named if k in on)

    seen = {signature(labels) for labels, _ in left}
    return left + [(labels, value) for labels, value in right if signature(labels) not in seen]


def evaluate(query: str, samples: list[Sample]) -> Vector:
    """The instant vector Prometheus answers `query` with over these samples."""
    parser = _Parser(_tokens(query), samples)
    result = parser.expression()
    assert parser.at == len(parser.tokens), f"unread: {parser.tokens[parser.at :]}"
    assert isinstance(result, list)
    return result


def test_the_interpreter_keeps_prometheus_semantics() -> None:
    samples: list[Sample] = [("up", {"job": "a"}, 1.0), ("up", {"job": "b"}, 0.0)]
    assert evaluate("sum(nothing)", samples) == []  # an aggregation of nothing is nothing
    assert evaluate("sum(nothing) + sum(up)", samples) == []
    assert evaluate('max(up{job=~"a|b"})', samples) == [(frozenset(), 1.0)]
    assert evaluate('sum(up{job=~"a."})', samples) == []  # anchored: "a." is not "a"
    assert evaluate("sum(nothing) or on() (0 * max(up))", samples) == [(frozenset(), 0.0)]
    assert evaluate("sum(up) or on() (0 * max(up))", samples) == [(frozenset(), 1.0)]
    assert sorted(v for _, v in evaluate("max by (job) (up)", samples)) == [0.0, 1.0]


# --- the pools' queries ----------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    name: str  # the StatefulSet's, which its workers advertise as REPRO_WORKER_POOL
    query: str
    image_id: str
    digest: str
    devices: int
    # The part of a hardware class all its nodes share: a GPU pool's nodes are of one GPU
    # product (whatever their driver or MIG profile); a CPU pool runs on any CPU node.
    hardware_prefix: str


@pytest.fixture(scope="module")
def pools() -> dict[str, Pool]:
    found = {}
    for name, devices, prefix in (("gpu", 1, "gpu:nvidia-h100-80gb-hbm3"), ("cpu", 2, "cpu")):
        pool = rendered_pool(KUBERNETES / "overlays" / name)
        env = pool.env
        assert env["REPRO_WORKER_POOL"] == pool.statefulset["metadata"]["name"]
        found[name] = Pool(
            name=env["REPRO_WORKER_POOL"],
            query=pool.query,
            image_id=env["REPRO_IMAGE_ID"],
            digest=env["REPRO_IMAGE_DIGEST"],
            devices=devices,
            hardware_prefix=prefix,
        )
    return found


def pool_value(query: str, samples: list[Sample]) -> float | None:
    """The one number KEDA reads, or None for an empty answer (an error to KEDA)."""
    result = evaluate(query, samples)
    assert len(result) <= 1, result
    return result[0][1] if result else None


def _scrape(
    queued: list[tuple[str, int, bool, str]],
    held: list[tuple[list[str], int, str, int]],
    replicas: int = 2,
) -> list[Sample]:
    """What every API replica reports: queued runs by (image, replicas, code, hardware),
    held runs under each image their worker advertises with its devices and pool, and the
    live-workers gauge that is always there."""
    counts: dict[tuple[str, str, str, str], int] = {}
    for image, devices, code, required in queued:
        key = (image, str(devices), "true" if code else "false", required)
        counts[key] = counts.get(key, 0) + 1
    held_counts: dict[tuple[str, str, str], int] = {}
    for images, devices, pool, count in held:
        for image in images or [""]:
            held_key = (image, str(devices), pool)
            held_counts[held_key] = held_counts.get(held_key, 0) + count
    samples: list[Sample] = []
    for replica in range(replicas):
        instance = {"instance": f"10.0.0.{replica}:8000", "job": "reprotrain-api"}
        samples.append(("reprotrain_workers_live", instance, float(len(held))))
        for (image, needed, code_label, required), n in counts.items():
            queued_labels = {"image": image, "replicas": needed, "code": code_label}
            queued_labels["hardware"] = required
            samples.append(("reprotrain_queued_runs", {**instance, **queued_labels}, float(n)))
        for (image, offered, pool), n in held_counts.items():
            held_labels = {"image": image, "devices": offered, "pool": pool}
            samples.append(("reprotrain_held_runs", {**instance, **held_labels}, float(n)))
    return samples


def _claimable(pool: Pool, image: str, devices: int, code: bool, required: str) -> bool:
    """Whether the pool's workers could claim a queued run with these requirements: its
    hardware requirement is met by every node of the pool (a prefix of what they share) or
    by some of them (a class under it)."""
    hardware_fits = hardware.matches(required or None, pool.hardware_prefix) or hardware.matches(
        pool.hardware_prefix, required
    )
    return (
        image in ("", pool.image_id, pool.digest)
        and devices <= pool.devices
        and not code
        and hardware_fits
    )


def _queue(pools: dict[str, Pool]) -> list[tuple[str, int, bool, str]]:
    gpu, cpu = pools["gpu"], pools["cpu"]
    images = ["", gpu.image_id, gpu.digest, cpu.image_id, cpu.digest, OTHER_IMAGE]
    requirements = [
        "",
        "gpu",
        "gpu:nvidia-h100-80gb-hbm3",
        "gpu:nvidia-h100-80gb-hbm3:sm132:80gb",
        H100,
        "gpu:nvidia-h100",  # a prefix of the product's name, not of its segment: no match
        "gpu:nvidia-a100-sxm4-80gb",
        A100,
        "cpu",
        "cpu:genuineintel",
        XEON,
        "cpu:authenticamd",
    ]
    return [
        (image, devices, code, required)
        for image in images
        for devices in (1, 2, 4)
        for code in (False, True)
        for required in requirements
    ]


def test_each_pool_counts_exactly_the_queued_runs_it_could_claim(pools: dict[str, Pool]) -> None:
    queue = _queue(pools)
    samples = _scrape(queue, held=[])
    for pool in pools.values():
        expected = sum(_claimable(pool, *run) for run in queue)
        assert expected > 0
        assert pool_value(pool.query, samples) == expected, pool.name
    # Runs that need nothing in particular are counted by both pools; the rest by one at most.
    either = [r for r in queue if all(_claimable(p, *r) for p in pools.values())]
    assert either and all(image == "" and required == "" for image, _, _, required in either)


def test_each_pool_counts_only_the_runs_its_own_workers_hold(pools: dict[str, Pool]) -> None:
    gpu, cpu = pools["gpu"], pools["cpu"]
    held = [
        ([gpu.image_id, gpu.digest], 1, gpu.name, 3),  # three GPU pods busy
        ([cpu.image_id, cpu.digest], 2, cpu.name, 1),
        # A compose box running the GPU image: its runs are not the GPU pool's to hold.
        ([gpu.image_id, "reprotrain-worker-gpu:0.1.0"], 1, "compose", 2),
        ([], 1, "", 4),  # workers of no pool
    ]
    samples = _scrape(queued=[], held=held)
    # Each held run counts once, though its worker reports it under both of its images.
    assert pool_value(gpu.query, samples) == 3
    assert pool_value(cpu.query, samples) == 1
    queued = [("", 1, False, ""), (gpu.image_id, 1, False, "gpu")]
    samples = _scrape(queued=queued, held=held)
    assert pool_value(gpu.query, samples) == 3 + 2
    assert pool_value(cpu.query, samples) == 1 + 1


def test_pools_answer_zero_while_scraped_and_nothing_once_the_metrics_are_gone(
    pools: dict[str, Pool],
) -> None:
    idle = _scrape(queued=[], held=[])  # the API answers; nothing is queued or running
    assert {s[0] for s in idle} == {"reprotrain_workers_live"}
    work_elsewhere = _scrape(queued=[(OTHER_IMAGE, 1, False, "")], held=[])
    for pool in pools.values():
        assert pool_value(pool.query, idle) == 0
        assert pool_value(pool.query, work_elsewhere) == 0
        # No API series at all (Prometheus lost the target): no number, so KEDA reports an
        # error (ignoreNullValues "false") and, after failureThreshold polls, falls back.
        assert pool_value(pool.query, []) is None
        assert "vector(" not in pool.query
