"""The experiment spec: a strict, versioned pydantic model with a canonical hash.

TensorFlow-free: the API validates and hashes specs with this module alone.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from worker.errors import MalformedSpecError, SpecError
from worker.record import hardware
from worker.training.seeds import SeedTuple, seed_tuple

SPEC_VERSION = 1
HASH_ALGORITHM = "sha256"


def _integral(value: Any) -> Any:
    # JSON writers spell 3 as 3.0 or 3e0; accept those, but never a bool or a string.
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


integral = _integral  # for the other parameter models that read spec numbers

Int = Annotated[int, BeforeValidator(_integral)]
PosInt = Annotated[int, BeforeValidator(_integral), Field(ge=1)]
Autotune = Literal["autotune"]

# Each of these numbers becomes threads or buffered batches on the worker. A worker refuses
# more whatever server sent the spec; an operator may allow less (REPRO_MAX_THREADS).
MAX_THREADS = 256
MAX_PREFETCH_BATCHES = 256
Threads = Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_THREADS)]
# Replicas become devices (GPUs, or logical CPU devices) on one worker.
MAX_REPLICAS = 64
MAX_HOSTS = 64
MAX_ROW_SHARDS = 256  # a shard is a call of the generator, traced into every batch's graph
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# Steps per compiled call are capped by the epoch and its boundaries; beyond that a bound
# only keeps the number sane (it allocates nothing).
MAX_STEPS_PER_EXECUTION = 1_000_000


def _json_params(value: dict[str, Any]) -> dict[str, Any]:
    # Free-form params reach generators and Keras; only finite JSON values may pass.
    def check(item: Any, depth: int) -> None:
        if depth > 8:
            raise ValueError("params nest deeper than 8 levels")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"numbers must be finite, got {item}")
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"keys must be strings, got {key!r}")
                check(sub, depth + 1)
        elif isinstance(item, list):
            for sub in item:
                check(sub, depth + 1)
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise ValueError(f"unsupported value of type {type(item).__name__}")

    check(value, 0)
    return value


Params = Annotated[dict[str, Any], AfterValidator(_json_params)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


SpecT = typing.TypeVar("SpecT", bound="_SpecBase")


class DatasetSpec(_Strict):
    """Which generator makes the data, and how the tf.data pipeline runs it."""

    generator: str = Field(min_length=1, max_length=100)
    params: Params = Field(default_factory=dict)
    batch_size: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=65_536)]
    train_batches: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=10_000_000)]
    eval_batches: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=10_000_000)] = 0
    num_parallel_calls: Threads | Autotune = "autotune"
    prefetch: (
        Annotated[int, BeforeValidator(_integral), Field(ge=0, le=MAX_PREFETCH_BATCHES)] | Autotune
    ) = "autotune"
    deterministic_order: bool = True
    xla: bool = False
    # A stored dataset, by content digest (`repro dataset push`); generators that read
    # stored arrays (e.g. `arrays`) train on it.
    data: str | None = Field(default=None, pattern=DIGEST_PATTERN)
    # Each batch as this many equal shards of rows, shard k generated from its own seed
    # (fold_in(batch seed, k)) and indices: a range of shards generated on its own equals
    # those rows of the whole batch. 1: the batch in one call. Another count is other data
    # (the same generator, other seeds).
    shards: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_ROW_SHARDS)] = 1

    @model_validator(mode="after")
    def _equal_shards(self) -> Self:
        if self.batch_size % self.shards:
            raise ValueError(
                f"shards: batch_size {self.batch_size} cannot be split into {self.shards} "
                "equal shards of rows; make batch_size a multiple of shards"
            )
        return self


class ModelSpec(_Strict):
    architecture: str = Field(min_length=1, max_length=100)
    params: Params = Field(default_factory=dict)
    # A Keras model definition stored by digest (`repro model push`); with architecture
    # `keras` the job builds exactly that model.
    definition: str | None = Field(default=None, pattern=DIGEST_PATTERN)


class OptimizerSpec(_Strict):
    name: str = "adam"
    params: Params = Field(default_factory=dict)


class LossSpec(_Strict):
    name: str
    params: Params = Field(default_factory=dict)


class TrainingSpec(_Strict):
    epochs: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=100_000)]
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    loss: LossSpec
    metrics: list[str] = Field(default_factory=list, max_length=16)
    # None: a trace point at every epoch end; N: also one every N global steps.
    fingerprint_every_steps: PosInt | None = None
    checkpoint_every_epochs: PosInt = 1
    # None: checkpoints at epoch ends only; K: also one every K global steps (resume mid-epoch).
    checkpoint_every_steps: PosInt | None = None
    # Optimizer steps per compiled call, in a loop (Keras's `steps_per_execution`); a call
    # never crosses a trace point, checkpoint or epoch end. N > 1 may change the bits
    # against N = 1 (the loop body is optimised differently), so it is part of the hash.
    steps_per_execution: Annotated[
        int, BeforeValidator(_integral), Field(ge=1, le=MAX_STEPS_PER_EXECUTION)
    ] = 1


class DeterminismSpec(_Strict):
    op_determinism: bool = True
    intra_op_threads: Threads | None = None
    inter_op_threads: Threads | None = None
    # Set before the job's interpreter starts; worker.run re-executes itself to apply it.
    python_hash_seed: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=4_294_967_295)] = 0
    # TensorFloat-32 for float32 matmuls and convolutions on Ampere and newer GPUs: null keeps
    # TensorFlow's default (recorded as what it resolved to). Inputs rounded to 10 mantissa
    # bits stay deterministic on one GPU model but differ between models.
    tf32: bool | None = None


class DistributionSpec(_Strict):
    """Data-parallel training: each global batch is split over `hosts` worker processes of
    `replicas` devices each (hosts x replicas in all)."""

    replicas: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_REPLICAS)] = 1
    # Worker processes, on as many machines, training one run together; each generates only
    # its own dataset shards of every batch, so `dataset.shards` must be a multiple of it.
    hosts: Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_HOSTS)] = 1


class EnvironmentSpec(_Strict):
    image: str | None = Field(default=None, max_length=500)
    # The hardware class a worker must be of (worker.record.hardware), or a leading part
    # of one: "gpu" (any GPU), "gpu:nvidia-h100-80gb-hbm3", "cpu:authenticamd". None: any.
    hardware: str | None = Field(
        default=None, max_length=hardware.MAX_CLASS_CHARS, pattern=hardware.REQUIREMENT_PATTERN
    )

    @field_validator("hardware", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class _SpecBase(_Strict):
    """What every kind of experiment has: a name, a seed, and its canonical hash."""

    version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=200)
    seed: SeedTuple | None = None

    @field_validator("seed", mode="before")
    @classmethod
    def _normalise_seed(cls, value: Any) -> Any:
        # `seed: 7` and `seed: [7, 0]` are one experiment; store the pair form.
        if value is None:
            return None
        if isinstance(value, str | bytes | bool):
            raise ValueError("seed must be an integer, a pair of integers, or null")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, list | tuple):
            value = [_integral(v) for v in value]
        try:
            return seed_tuple(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None

    def with_seed(self, seed: SeedTuple) -> Self:
        """This spec with its seed fixed (how a null seed is recorded once resolved)."""
        return self.model_copy(update={"seed": seed_tuple(seed)})

    def canonical_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace, numbers in one spelling.

        Fields added after the first spec version are left out while they hold their
        default, so every spec written before them keeps its hash (and its reruns match).
        """
        data = self.model_dump(mode="json")
        for path, default in self._later_fields():
            *parents, key = path
            target: Any = data
            for parent in parents:
                target = target.get(parent) if isinstance(target, dict) else None
            if isinstance(target, dict) and key in target and target[key] == default:
                del target[key]
        return canonical_json(data)

    @classmethod
    def _later_fields(cls) -> tuple[tuple[tuple[str, ...], Any], ...]:
        return _LATER_FIELDS

    def spec_hash(self) -> str:
        """`sha256:<hex>` of the canonical JSON; equal specs hash equal however written."""
        digest = hashlib.sha256(self.canonical_json().encode()).hexdigest()
        return f"{HASH_ALGORITHM}:{digest}"


class ExperimentSpec(_SpecBase):
    """One experiment: everything needed to train it again bit for bit."""

    dataset: DatasetSpec
    model: ModelSpec
    training: TrainingSpec
    determinism: DeterminismSpec = Field(default_factory=DeterminismSpec)
    distribution: DistributionSpec = Field(default_factory=DistributionSpec)
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    # A code bundle (a wheel stored by digest, `repro code push`) whose entry points add the
    # generators and architectures the spec names.
    code: str | None = Field(default=None, pattern=DIGEST_PATTERN)

    @model_validator(mode="after")
    def _hosts_own_whole_shards(self) -> Self:
        hosts, shards = self.distribution.hosts, self.dataset.shards
        if shards % hosts:
            raise ValueError(
                f"distribution.hosts {hosts} must divide dataset.shards {shards}: each host "
                f"generates its own equal part of every batch's shards; set dataset.shards "
                f"to a multiple of {hosts}"
            )
        devices = hosts * self.distribution.replicas
        if self.dataset.batch_size < devices:
            raise ValueError(
                f"dataset.batch_size {self.dataset.batch_size} cannot be split over "
                f"{devices} replicas ({hosts} host(s) x {self.distribution.replicas})"
            )
        return self


MAX_SCRIPT_ARGS = 256
MAX_SCRIPT_ARG_CHARS = 4096


def _entry_path(value: str) -> str:
    path = PurePosixPath(value)
    if (
        path.is_absolute()
        or ".." in path.parts
        or "\\" in value
        or "\x00" in value
        or path.suffix != ".py"
        or str(path) != value
    ):
        raise ValueError(
            "must be the relative path of a .py file inside the script's directory, "
            "written with / and without '..' (e.g. train.py or src/train.py)"
        )
    return value


def _plain_args(value: list[str]) -> list[str]:
    for i, arg in enumerate(value):
        if "\x00" in arg or len(arg) > MAX_SCRIPT_ARG_CHARS:
            raise ValueError(
                f"argument {i} must be at most {MAX_SCRIPT_ARG_CHARS} characters, without NUL"
            )
    return value


class ScriptSpec(_Strict):
    """Which file of the script's directory runs, with which command-line arguments."""

    entry: Annotated[str, Field(min_length=4, max_length=500), AfterValidator(_entry_path)]
    args: Annotated[list[str], Field(max_length=MAX_SCRIPT_ARGS), AfterValidator(_plain_args)] = (
        Field(default_factory=list)
    )


class ScriptExperimentSpec(_SpecBase):
    """A user's own training script: its directory (a code bundle stored by digest), the
    file that runs and its arguments, the seed `reprotrain.init()` hands it, and how
    determinism is set. The script itself decides what it trains."""

    kind: Literal["script"]
    script: ScriptSpec
    code: str = Field(pattern=DIGEST_PATTERN)
    determinism: DeterminismSpec = Field(default_factory=DeterminismSpec)
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)

    @classmethod
    def _later_fields(cls) -> tuple[tuple[tuple[str, ...], Any], ...]:
        return _SCRIPT_LATER_FIELDS


AnySpec = ExperimentSpec | ScriptExperimentSpec


# (path, default) of fields added after the first spec version.
_LATER_FIELDS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("dataset", "data"), None),
    (("training", "checkpoint_every_steps"), None),
    (("distribution", "hosts"), 1),  # before the section's own entry, which it makes true
    (("distribution",), {"replicas": 1}),
    (("code",), None),
    (("model", "definition"), None),
    (("determinism", "tf32"), None),
    (("training", "steps_per_execution"), 1),
    (("environment", "hardware"), None),
    (("dataset", "shards"), 1),
)
# Those added after script experiments were.
_SCRIPT_LATER_FIELDS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("environment", "hardware"), None),
)


def _canonical_value(value: Any, path: str) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(f"{path}: numbers must be finite, got {value}")
        # 1, 1.0 and 1e0 are one number; -0.0 and 0 too.
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, Mapping):
        return {str(k): _canonical_value(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical_value(v, f"{path}.{i}") for i, v in enumerate(value)]
    raise SpecError(f"{path}: unsupported value of type {type(value).__name__}")


def canonical_json(data: Any) -> str:
    """Canonical JSON text for JSON-like data (floats use Python's shortest round-trip form)."""
    return json.dumps(
        _canonical_value(data, "$"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def _error_location(loc: tuple[int | str, ...]) -> str:
    # pydantic adds union-member tags ("int", "literal['autotune']") that mean nothing to users.
    parts = [str(p) for p in loc if not re.fullmatch(r"[a-z-]+\[.*\]|int|str|bool|float", str(p))]
    return ".".join(parts) or "$"


def format_validation_error(exc: ValidationError) -> list[dict[str, str]]:
    """One {"loc", "msg"} entry per problem, with dotted field paths."""
    seen: set[tuple[str, str]] = set()
    errors = []
    for err in exc.errors(include_url=False):
        entry = (_error_location(err["loc"]), err["msg"].removeprefix("Value error, "))
        if entry not in seen:
            seen.add(entry)
            errors.append({"loc": entry[0], "msg": entry[1]})
    return errors


def _validated(model: type[SpecT], data: Mapping[str, Any]) -> SpecT:
    try:
        spec = model.model_validate(dict(data))
        spec.canonical_json()  # rejects NaN and non-JSON values inside free-form params
    except ValidationError as exc:
        errors = format_validation_error(exc)
        lines = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise SpecError(f"invalid spec: {lines}", errors=errors) from None
    return spec


def _mapping(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(
            "a spec must be a mapping", errors=[{"loc": "$", "msg": "expected a mapping"}]
        )
    return data


def parse_spec(data: Any) -> ExperimentSpec:
    """Validate already-parsed spec data; raises SpecError listing every field problem."""
    return _validated(ExperimentSpec, _mapping(data))


def is_script(data: Any) -> bool:
    """Whether parsed spec data (or a spec) is a script experiment's (`kind: script`)."""
    if isinstance(data, BaseModel):
        return isinstance(data, ScriptExperimentSpec)
    return isinstance(data, Mapping) and data.get("kind") == "script"


def parse_any_spec(data: Any) -> AnySpec:
    """A training spec, or a script experiment's (`kind: script`); SpecError otherwise."""
    data = _mapping(data)
    if "kind" in data and data["kind"] != "script":
        msg = "the only kind a spec names is 'script'; a training spec has no kind"
        raise SpecError(f"invalid spec: kind: {msg}", errors=[{"loc": "kind", "msg": msg}])
    return _validated(ScriptExperimentSpec, data) if is_script(data) else parse_spec(data)


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that reads `1e-3` as a float (as JSON and YAML 1.2 do) and refuses aliases.

    A spec has no use for anchors and aliases, and a few hundred bytes of nested aliases
    expand into gigabytes (the "billion laughs" document).
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed in a spec", mark)
        return super().compose_node(parent, index)


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def parse_spec_text(text: str | bytes, *, fmt: Literal["json", "yaml"] = "yaml") -> AnySpec:
    """Parse JSON or YAML text into a validated spec; malformed text raises SpecError."""
    try:
        data = json.loads(text) if fmt == "json" else yaml.load(text, Loader=_SpecLoader)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise MalformedSpecError(
            f"malformed {fmt.upper()}: {exc}", errors=[{"loc": "$", "msg": str(exc)}]
        ) from None
    return parse_any_spec(data)


def load_spec(path: str | Path) -> AnySpec:
    """Read a spec file (.json, or YAML for anything else)."""
    path = Path(path)
    fmt: Literal["json", "yaml"] = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_spec_text(path.read_bytes(), fmt=fmt)


def load_training_spec(path: str | Path) -> ExperimentSpec:
    """Read a training spec file; SpecError for a script experiment's."""
    spec = load_spec(path)
    if isinstance(spec, ScriptExperimentSpec):
        raise SpecError(f"{path} is a script experiment's spec, not a training spec")
    return spec


def held_out_warnings(spec: AnySpec) -> list[str]:
    """A warning when the `arrays` generator holds rows out for evaluation and no evaluation
    batch ever reads them: a fraction of the dataset trains nothing and measures nothing.

    A warning, not an error: such specs stayed valid and keep their hashes.
    """
    if isinstance(spec, ScriptExperimentSpec):
        return []
    ds = spec.dataset
    fraction = ds.params.get("eval_fraction")
    if ds.generator != "arrays" or ds.eval_batches or isinstance(fraction, bool):
        return []
    if not isinstance(fraction, int | float) or not 0 < fraction < 1:
        return []
    return [
        f"dataset.params.eval_fraction is {fraction} but dataset.eval_batches is 0: about "
        f"{fraction:.0%} of the dataset's rows are held out from training and never evaluated. "
        "Set dataset.eval_batches (batches of dataset.batch_size read from the held-out rows) "
        "to evaluate on them, or eval_fraction to 0 to train on every row."
    ]


# The field a misspelled spec field probably meant ("did you mean 'batch_size'?"), for the
# API's answer to a submit and for `repro validate` alike.
EXTRA_FIELD = "Extra inputs are not permitted"  # pydantic's message for an unknown field


def suggested_field(loc: str) -> str | None:
    """The dotted path of the spec field closest to `loc`, a path naming no field; None when
    no field of that model is close."""
    *parents, name = loc.split(".")
    close = difflib.get_close_matches(name, _field_names(parents), n=1, cutoff=0.6)
    return ".".join([*parents, close[0]]) if name and close else None


def with_suggestion(error: dict[str, str]) -> dict[str, str]:
    """The error, with `suggestion` (the field probably meant) where its path names no field."""
    if error.get("msg") != EXTRA_FIELD or not (found := suggested_field(error.get("loc", ""))):
        return error
    return {**error, "suggestion": found}


def suggesting(exc: SpecError) -> SpecError:
    """The same error whose messages, and each field error's, end in "did you mean ...?"
    where a path names no field and one is close to it."""
    errors = [with_suggestion(e) for e in exc.errors]
    if not any("suggestion" in e for e in errors):
        return exc
    message = str(exc)
    for e in errors:
        if "suggestion" in e:
            hinted = f"{e['msg']}; did you mean '{e['suggestion'].rsplit('.', 1)[-1]}'?"
            message = message.replace(f"{e['loc']}: {e['msg']}", f"{e['loc']}: {hinted}", 1)
            e["msg"] = hinted
    return SpecError(message, errors=errors)


def _field_names(path: list[str]) -> list[str]:
    """The field names of the spec model at a dotted path ([] if it names no model)."""
    model: type[BaseModel] | None = ExperimentSpec
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, looking inside Optional, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            if (found := _model_in(arg)) is not None:
                return found
    return None
