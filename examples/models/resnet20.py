"""Write resnet20.json: a ResNet-20 for 32x32x3 images (CIFAR-10 style), as a Keras JSON config.

Three stages of three residual blocks (16, 32, 64 filters), each block two 3x3 convolutions
with batch normalization; a 1x1 projection where a stage halves the resolution; global
average pooling and a 10-way linear classifier (logits). About 0.27M parameters.

    python examples/models/resnet20.py            # writes examples/models/resnet20.json
    repro model push examples/models/resnet20.json --name resnet20
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras


def _block(x: keras.KerasTensor, filters: int, stride: int, name: str) -> keras.KerasTensor:
    shortcut = x
    h = keras.layers.Conv2D(
        filters, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1"
    )(x)
    h = keras.layers.BatchNormalization(name=f"{name}_bn1")(h)
    h = keras.layers.ReLU(name=f"{name}_relu1")(h)
    h = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(h)
    h = keras.layers.BatchNormalization(name=f"{name}_bn2")(h)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(
            filters, 1, strides=stride, use_bias=False, name=f"{name}_project"
        )(shortcut)
        shortcut = keras.layers.BatchNormalization(name=f"{name}_project_bn")(shortcut)
    h = keras.layers.Add(name=f"{name}_add")([h, shortcut])
    return keras.layers.ReLU(name=f"{name}_out")(h)


def resnet20(num_classes: int = 10) -> keras.Model:
    """ResNet-20 (3 stages x 3 blocks) for 32x32x3 images, returning logits."""
    inputs = keras.Input(shape=(32, 32, 3), name="image")
    h = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    h = keras.layers.BatchNormalization(name="stem_bn")(h)
    h = keras.layers.ReLU(name="stem_relu")(h)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            h = _block(h, filters, stride, name=f"stage{stage + 1}_block{block + 1}")
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    outputs = keras.layers.Dense(num_classes, name="logits")(h)
    return keras.Model(inputs, outputs, name="resnet20")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("resnet20.json")
    out.write_text(resnet20().to_json(indent=1) + "\n")
    print(out)
