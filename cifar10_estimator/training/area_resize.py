"""Area resizing as two matrix products: the progressive phases' shrunk images, on any device.

An area resize averages each output pixel's footprint in the input, weighted by how much
of each input pixel it covers, and it is separable: rows, then columns. So resizing an
[N, H, W, C] batch to S x S is A_H x image x A_W^T, with A a fixed [S, H] matrix of those
weights, the same pixels as tf.image.resize(method="area") up to float32 rounding.
TensorFlow's ResizeArea has CPU kernels only: inside a GPU tower it would run on the host,
a copy each way per tower per step. Matrix products run wherever the tower does.
"""

import numpy as np
import tensorflow as tf


def area_weights(input_side, output_side):
    """float32 [output_side, input_side]: row i holds the share of each input pixel in
    output pixel i, whose footprint is [i, i + 1) x input_side / output_side."""
    scale = input_side / output_side
    starts = np.arange(output_side)[:, np.newaxis] * scale
    pixels = np.arange(input_side)[np.newaxis, :]
    overlap = np.minimum(starts + scale, pixels + 1) - np.maximum(starts, pixels)
    return (np.maximum(overlap, 0.0) / scale).astype(np.float32)


def area_resize(images, side):
    """float32 [N, side, side, C]: float32 `images` [N, H, W, C] (static H and W)
    area-resized, as tf.image.resize(images, [side, side], method="area") is."""
    height, width = images.shape[1], images.shape[2]
    return tf.einsum("hi,nijc,wj->nhwc", tf.constant(area_weights(height, side)), images,
                     tf.constant(area_weights(width, side)))


def phase_images(images, phases, global_step):
    """The training `images` area-resized to the side of the phase of `phases`
    ([(side, end step)], schedule.resolution_phases') the global step is in, else (after
    them) as they are. Read from the global step, the switches hold across restarts."""
    trained_on = images
    # From the last phase back: each phase's images where the step is below its end,
    # else those of the phases after it.
    for side, end in reversed(phases):
        trained_on = tf.cond(
            global_step < end,
            lambda side=side: area_resize(images, side),
            lambda later=trained_on: later)
    return trained_on
