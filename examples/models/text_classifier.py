"""Write text_classifier.json: a classifier of integer token sequences, as a Keras JSON config.

Token ids [64] (vocabulary 1,000) -> Embedding(32) -> GRU(32) -> Dense(4) logits. The
input is int32: train it on a dataset whose `x` holds integer token ids.

    python examples/models/text_classifier.py     # writes examples/models/text_classifier.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras

SEQUENCE_LENGTH, VOCABULARY, CLASSES = 64, 1_000, 4


def text_classifier() -> keras.Model:
    """Embedding, a GRU and a linear classifier over token ids."""
    tokens = keras.Input(shape=(SEQUENCE_LENGTH,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(VOCABULARY, 32, name="embedding")(tokens)
    h = keras.layers.GRU(32, name="gru")(h)
    h = keras.layers.Dropout(0.1, name="dropout")(h)
    outputs = keras.layers.Dense(CLASSES, name="logits")(h)
    return keras.Model(tokens, outputs, name="text_classifier")


if __name__ == "__main__":
    default = Path(__file__).with_name("text_classifier.json")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    out.write_text(text_classifier().to_json(indent=1) + "\n")
    print(out)
