"""Output shapes of Keras's spatial layers (convolutions, pooling, padding, cropping,
upsampling) in 1, 2 and 3 dimensions: Keras's own `compute_output_shape`, in plain Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.models.definition_tensors import Call, Rule, Shape, ShapeError, ints, positive


def _spatial(cfg: dict[str, Any], x: Shape, rank: int) -> tuple[list[int | None], bool]:
    if len(x) != rank + 2:
        raise ShapeError(f"it takes a tensor of rank {rank + 2}, not {x}")
    first = cfg.get("data_format") == "channels_first"
    return list(x[2:] if first else x[1:-1]), first


def _assemble(x: Shape, spatial: list[int | None], channels: int | None, first: bool) -> Shape:
    if first:
        return (x[0], channels, *spatial)
    return (x[0], *spatial, channels)


def _conv(rank: int, kind: str) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        kernel = ints(cfg.get("kernel_size"), rank, "kernel_size")
        strides = ints(cfg.get("strides", 1), rank, "strides")
        dilation = ints(cfg.get("dilation_rate", 1), rank, "dilation_rate")
        padding = cfg.get("padding", "valid")
        channels = x[1] if first else x[-1]
        if kind == "depthwise":
            if channels is None:
                raise ShapeError("its input channels are unknown")
            filters: int | None = channels * positive(cfg.get("depth_multiplier", 1), "depth")
        else:
            filters = positive(cfg.get("filters"), "filters")
        if kind == "transpose":
            out = _transposed(cfg, spatial, kernel, strides, dilation, padding)
        else:
            out = [_conv_length(n, k, s, d, padding) for n, k, s, d in
                   zip(spatial, kernel, strides, dilation, strict=True)]  # fmt: skip
        return [_assemble(x, out, filters, first)]

    return rule


def _conv_length(n: int | None, k: int, s: int, d: int, padding: Any) -> int | None:
    if n is None:
        return None
    if padding == "valid":
        out = (n - d * (k - 1) - 1) // s + 1
        if out <= 0:
            raise ShapeError(f"an input of size {n} is smaller than its kernel")
        return out
    if padding in ("same", "causal"):
        return (n - 1) // s + 1
    raise ShapeError(f"padding {padding!r} is not one of Keras's")


def _transposed(
    cfg: dict[str, Any],
    spatial: list[int | None],
    kernel: list[int],
    strides: list[int],
    dilation: list[int],
    padding: Any,
) -> list[int | None]:
    given = cfg.get("output_padding")
    extra = None if given is None else ints(given, len(spatial), "output_padding", low=0)
    out: list[int | None] = []
    for i, n in enumerate(spatial):
        k, s = (kernel[i] - 1) * dilation[i] + 1, strides[i]
        pad = None if extra is None else extra[i]
        if n is None:
            out.append(None)
        elif padding == "valid":
            out.append((n - 1) * s + k + (max(k, s) - k if pad is None else pad))
        elif padding == "same":
            out.append(n * s if pad is None else (n - 1) * s + k % 2 + pad)
        else:
            raise ShapeError(f"padding {padding!r} is not one of Keras's")
    return out


def _pooling(rank: int) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        pool = ints(cfg.get("pool_size"), rank, "pool_size")
        strides = ints(cfg.get("strides") or pool, rank, "strides")
        padding = cfg.get("padding", "valid")
        out: list[int | None] = []
        for n, p, s in zip(spatial, pool, strides, strict=True):
            if n is None:
                out.append(None)
            elif padding == "valid":
                if (n - p) // s + 1 <= 0:
                    raise ShapeError(f"an input of size {n} is smaller than its pool")
                out.append((n - p) // s + 1)
            elif padding == "same":
                out.append((n - 1) // s + 1)
            else:
                raise ShapeError(f"padding {padding!r} is not one of Keras's")
        return [_assemble(x, out, x[1] if first else x[-1], first)]

    return rule


def _global_pooling(rank: int) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        _, first = _spatial(cfg, x, rank)
        channels = x[1] if first else x[-1]
        if not cfg.get("keepdims"):
            return [(x[0], channels)]
        return [_assemble(x, [1] * rank, channels, first)]

    return rule


def _resized(rank: int, key: str, how: Callable[[int, Any], int]) -> Rule:
    """UpSampling (`size` per axis), ZeroPadding (`padding`) and Cropping (`cropping`)."""

    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        values = cfg.get(key)
        per_axis = values if isinstance(values, list) and len(values) == rank else None
        if rank == 1 and key != "size":
            per_axis = [values]
        if per_axis is None:
            per_axis = [values] * rank
        out = [None if n is None else how(n, v) for n, v in zip(spatial, per_axis, strict=True)]
        if any(n is not None and n < 1 for n in out):
            raise ShapeError(f"{key} {values!r} leaves nothing of {x}")
        return [_assemble(x, out, x[1] if first else x[-1], first)]

    return rule


def _pair(value: Any, what: str) -> list[int]:
    return ints(value, 2, what, low=0)


def _upsample(n: int, size: Any) -> int:
    return n * positive(size, "size")


def _pad(n: int, pad: Any) -> int:
    return n + sum(_pair(pad, "padding"))


def _crop(n: int, crop: Any) -> int:
    return n - sum(_pair(crop, "cropping"))


def spatial_rules() -> dict[str, Rule]:
    """The rule of every spatial layer class, by class name."""
    rules: dict[str, Rule] = {}
    for n in (1, 2, 3):
        rules[f"Conv{n}D"] = _conv(n, "conv")
        rules[f"Conv{n}DTranspose"] = _conv(n, "transpose")
        rules[f"MaxPooling{n}D"] = rules[f"AveragePooling{n}D"] = _pooling(n)
        rules[f"GlobalMaxPooling{n}D"] = rules[f"GlobalAveragePooling{n}D"] = _global_pooling(n)
        rules[f"UpSampling{n}D"] = _resized(n, "size", _upsample)
        rules[f"ZeroPadding{n}D"] = _resized(n, "padding", _pad)
        rules[f"Cropping{n}D"] = _resized(n, "cropping", _crop)
    for n in (1, 2):
        rules[f"DepthwiseConv{n}D"] = _conv(n, "depthwise")
        rules[f"SeparableConv{n}D"] = _conv(n, "conv")
    return rules
