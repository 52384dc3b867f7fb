"""--eval-shifts and --eval-flips: the views of each image an evaluation averages over, and
how many (the time to go counts an evaluation's images by it)."""

import pytest
import tensorflow as tf

from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.training import evaluation_views


@pytest.mark.parametrize("shift, flips, count", [(0, False, 1), (0, True, 2), (2, False, 5),
                                                 (2, True, 10)])
def test_the_count_is_the_number_of_views_made_the_images_first(shift, flips, count):
    views = evaluation_views.EvaluationViews.from_hparams(
        job_hparams.HParams(eval_shifts=shift, eval_flips=flips))
    with tf.Graph().as_default():
        images = tf.zeros([3, 32, 32, 3])
        made = views.of(images)
    assert views.count == len(made) == count
    assert made[0] is images
    assert all(view.shape.as_list() == [3, 32, 32, 3] for view in made)
