"""--eval-flips and --eval-shifts: evaluation and prediction averaged over views of each image.

The views are the images first, then each shifted by --eval-shifts pixels right, left,
down and up (zero fill, as the training crops' padding), then with --eval-flips every one
of those mirrored. The network runs once on all the views of a batch, and each image's
class probabilities are the mean over its views. The logits stay those of the images
alone: the evaluation loss is their plain cross entropy, comparable with that of runs
without views.
"""

import dataclasses

import tensorflow as tf

# The shifted views' (top, left) offsets in the padded image, in units of the shift:
# right, left, down and up.
SHIFT_OFFSETS = ((1, 0), (1, 2), (0, 1), (2, 1))


@dataclasses.dataclass(frozen=True)
class EvaluationViews:
    """The views of each image that evaluations and predictions average over.

    Attributes:
      shift: --eval-shifts, the shifted views' pixels (0: none).
      flips: --eval-flips, every view mirrored too.
    """

    shift: int
    flips: bool

    @classmethod
    def from_hparams(cls, hparams):
        """The views the --eval-shifts and --eval-flips of `hparams` (HParams) ask for."""
        return cls(shift=hparams.eval_shifts, flips=hparams.eval_flips)

    @property
    def count(self):
        """How many views of each image (the images themselves included)."""
        return (1 + (len(SHIFT_OFFSETS) if self.shift else 0)) * (2 if self.flips else 1)

    def of(self, images):
        """The views of `images` [N, H, W, C], each a tensor of their shape, the images first."""
        views = [images]
        if self.shift:
            shift = self.shift
            padded = tf.pad(images, [[0, 0], [shift, shift], [shift, shift], [0, 0]])
            height, width = images.shape[1], images.shape[2]
            for top, left in SHIFT_OFFSETS:
                views.append(padded[:, top * shift:top * shift + height,
                                    left * shift:left * shift + width, :])
        if self.flips:
            views += [tf.image.flip_left_right(view) for view in views]
        return views

    def logits_and_probabilities(self, images, logits_of, probabilities_of):
        """(the logits of `images`, their class probabilities averaged over the views).

        Args:
          images: a batch of images [N, H, W, C].
          logits_of: logits_of(images) -> the network's logits, run once on every view.
          probabilities_of: probabilities_of(logits) -> class probabilities.
        """
        views = self.of(images)
        if len(views) == 1:
            logits = logits_of(images)
            return logits, probabilities_of(logits)
        all_logits = tf.split(logits_of(tf.concat(views, axis=0)), len(views), axis=0)
        probabilities = tf.add_n([probabilities_of(logits) for logits in all_logits])
        return all_logits[0], probabilities / float(len(views))
