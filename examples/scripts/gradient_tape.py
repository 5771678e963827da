"""A custom `tf.GradientTape` training loop with Reprotrain: the loop records its own trace
points (`run.trace_point`), metrics (`run.log_metrics`) and the batches it trains on
(`run.dataset`).

    python examples/scripts/gradient_tape.py --epochs 3
"""

import argparse

import reprotrain

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=7)
args = parser.parse_args()

with reprotrain.init(project="blobs", name="tape", params=vars(args), seed=args.seed) as run:
    import keras
    import tensorflow as tf

    # Seeded by init(): the same data, initial weights and shuffles every run.
    centers = tf.random.normal((3, 8), stddev=3.0)
    labels = tf.random.uniform((600,), maxval=3, dtype=tf.int32)
    features = tf.gather(centers, labels) + tf.random.normal((600, 8))
    data = tf.data.Dataset.from_tensor_slices((features, labels))

    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    )
    optimizer = keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    # A run its worker stopped continues from its last checkpoint: restore() returns the
    # epochs done (0 on a fresh run). Each epoch's shuffle depends on the epoch alone, so
    # the resumed run trains exactly what an uninterrupted one would.
    start = run.restore(model, optimizer)
    step = run.step
    run.trace_point(step=0, model=model, optimizer=optimizer)  # kept once, on a resume too
    for epoch in range(start + 1, args.epochs + 1):
        # run.dataset digests each batch as the loop takes it: the epoch's data fingerprint.
        for x, y in run.dataset(data.shuffle(600, seed=epoch).batch(32)):
            loss = train_step(x, y)
            step += 1
        # The epoch's metrics before its trace point, whose checkpoint keeps them.
        run.log_metrics({"loss": float(loss)}, epoch=epoch, step=step)
        run.trace_point(step=step, epoch=epoch, model=model, optimizer=optimizer)
    print(f"run {run.id}: {run.record['trace'][-1]['fingerprint']}")
