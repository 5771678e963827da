"""A plain Keras `model.fit` script with Reprotrain's two lines: a small CNN on the 8x8
handwritten digits that ship inside scikit-learn.

    pip install scikit-learn
    python examples/scripts/fit_digits.py --epochs 4 --lr 0.003
    python examples/scripts/fit_digits.py --epochs 4 --lr 0.003   # the same fingerprints

Each run is recorded under ./reprotrain-runs/ (REPRO_SCRIPT_RUNS_DIR): the seed, what was
made deterministic, provenance, the fingerprint of the model and optimizer at every epoch
end and the digest of the data `fit` trained on. `reprotrain.autolog()` does it for each
`model.fit` as it stands; without it, pass `callbacks=[run.keras_callback()]` yourself.
"""

import argparse

import reprotrain

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.003)
parser.add_argument("--width", type=int, default=16)
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()
run = reprotrain.init(project="digits", name="cnn", params=vars(args), seed=args.seed)
reprotrain.autolog()  # every model.fit below: its trace, metrics and data fingerprints

import keras  # noqa: E402 (after init: it sets TensorFlow up the moment this import ends)
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
x = (digits.images / 16.0).astype("float32")[..., None]
y = digits.target.astype("int32")
order = np.random.permutation(len(x))  # seeded by init(): the same split every run
x, y = x[order], y[order]
split = len(x) * 4 // 5

model = keras.Sequential(
    [
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(args.width, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(args.lr),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
model.fit(
    x[:split],
    y[:split],
    validation_data=(x[split:], y[split:]),
    epochs=args.epochs,
    batch_size=64,
    verbose=0,
)
run.finish()
print(f"run {run.id}: {run.record['final_fingerprint']}")
