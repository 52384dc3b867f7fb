"""Folders of CIFAR-10 images: list them in a fixed order, decode them to CIFAR's pixel layout.

The layout is that of the public CIFAR-10-images repository:

    DIR/train/<class>/*.png|*.jpg|*.jpeg     DIR/test/<class>/*.png|*.jpg|*.jpeg

with one folder per class, named as in cifar10_facts.CLASS_NAMES (airplane ...
truck, labels 0..9 in that order). Only train/ and test/ of DIR are read (the
repository also holds a README and .git). Inside them, names starting with '.'
(.DS_Store, editor files) are skipped; any other file or folder that is not a class
folder or an image is an error naming it, so nothing is silently left out.

Images are decoded by TensorFlow, never by Pillow: JPEG with libjpeg's accurate
integer IDCT, which gives exactly the pixels Pillow (and libjpeg's own tools) give;
TensorFlow's default, faster IDCT is up to 4 levels off. PNG by TensorFlow's PNG
decoder. Grayscale images are expanded to RGB (the gray value in all three channels)
and an alpha channel is dropped (not blended). Every image must be 32x32.
"""

import os
import re

import numpy as np

from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError

# Folder of DIR holding each subset's images; validation is carved out of train.
SPLIT_DIRNAMES = {"train": "train", "eval": "test"}
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")  # compared case-insensitively
# Seeds the fixed order of the training images (`training_order`); changing it changes
# which images the validation set holds.
TRAIN_ORDER_SEED = 2009
PROGRESS_EVERY_IMAGES = 10000
# Images decoded per tf.data batch: large enough to amortize the per-batch overhead.
_DECODE_BATCH_SIZE = 1000
_CLASS_FOLDERS = ", ".join(cifar10_facts.CLASS_NAMES)


def _visible_entries(folder):
    """Sorted names in folder, without the hidden ones ('.DS_Store', '.git', ...)."""
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


def _split_folder(image_dir, split_dirname):
    """The split's folder in image_dir; raises unless it exists and holds only class folders."""
    folder = os.path.join(image_dir, split_dirname)
    if not os.path.isdir(folder):
        problem = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise Cifar10EstimatorError(
            "%s %s; --image-dir needs train/ and test/ folders, each with one folder per "
            "class (%s)" % (folder, problem, _CLASS_FOLDERS))
    names = _visible_entries(folder)
    if not names:
        raise Cifar10EstimatorError(
            "%s is empty; it needs one folder per class (%s)" % (folder, _CLASS_FOLDERS))
    for name in names:
        path = os.path.join(folder, name)
        if name not in cifar10_facts.CLASS_NAMES or not os.path.isdir(path):
            raise Cifar10EstimatorError(
                "%s is not a CIFAR-10 class folder; %s may hold only the folders %s"
                % (path, folder, _CLASS_FOLDERS))
    for name in cifar10_facts.CLASS_NAMES:
        if name not in names:
            raise Cifar10EstimatorError(
                "%s does not exist; %s needs one folder per class (%s)"
                % (os.path.join(folder, name), folder, _CLASS_FOLDERS))
    return folder


def _image_names(class_folder):
    """Sorted image file names in class_folder; raises on any other entry or none at all."""
    names = _visible_entries(class_folder)
    if not names:
        raise Cifar10EstimatorError("%s holds no images" % class_folder)
    for name in names:
        path = os.path.join(class_folder, name)
        if not name.lower().endswith(IMAGE_EXTENSIONS) or not os.path.isfile(path):
            raise Cifar10EstimatorError(
                "%s is not a %s image file; remove it or move it out of %s"
                % (path, "/".join(IMAGE_EXTENSIONS), class_folder))
    return names


def list_split(image_dir, split_dirname):
    """Image paths and labels of one split folder, in class order, then file-name order.

    Returns:
      (paths, labels): numpy arrays of file-system paths (bytes) and int64 labels.

    Raises:
      Cifar10EstimatorError: naming the folder or file that does not fit the layout.
    """
    folder = _split_folder(image_dir, split_dirname)
    paths, labels = [], []
    for label, class_name in enumerate(cifar10_facts.CLASS_NAMES):
        class_folder = os.path.join(folder, class_name)
        for name in _image_names(class_folder):
            paths.append(os.fsencode(os.path.join(class_folder, name)))
            labels.append(label)
    return np.array(paths, dtype=object), np.array(labels, dtype=np.int64)


def training_order(labels, seed=TRAIN_ORDER_SEED):
    """A fixed shuffle of the training examples that spreads every class evenly.

    Each class is shuffled on its own, and its k-th of n examples is placed at about
    k/n of the way through the whole order. With equal classes (CIFAR-10: 5000 each)
    every run of 10 consecutive examples from the start holds one image per class, so
    the last N examples (any validation split) hold N/10 per class when N is a
    multiple of 10, and within one of that otherwise.

    Args:
      labels: int array [N], the label of each example in listing order.
      seed: seeds the numpy RandomState that draws the order.

    Returns:
      int array [N]: the listing indices in the fixed order.
    """
    rng = np.random.RandomState(seed)
    position = np.empty(len(labels))
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rank = rng.permutation(len(members))
        position[members] = (rank + rng.uniform(size=len(members))) / len(members)
    return np.argsort(position, kind="stable")


def list_images(image_dir):
    """Paths and labels of every image under image_dir, per subset, in their fixed order.

    Training images are in `training_order` (so validation can be taken from the
    end); test images stay in class, then file-name order.

    Returns:
      dict 'train' and 'eval' -> (paths, labels) as `list_split` returns them.

    Raises:
      Cifar10EstimatorError: naming the folder or file that does not fit the layout.
    """
    train_paths, train_labels = list_split(image_dir, SPLIT_DIRNAMES["train"])
    order = training_order(train_labels)
    return {"train": (train_paths[order], train_labels[order]),
            "eval": list_split(image_dir, SPLIT_DIRNAMES["eval"])}


def _decode_file(path):
    """(pixels uint8 [3072] in CIFAR's channel-major order, [height, width]) of one image.

    Pixels are zeros when the image is not 32x32, for the caller to refuse by its size.
    """
    import tensorflow as tf  # lazy: keeps generate_tfrecords' --help and flag errors fast

    contents = tf.io.read_file(path)
    # The bytes, not the file name, say which decoder applies.
    image = tf.cond(
        tf.io.is_jpeg(contents),
        lambda: tf.io.decode_jpeg(contents, channels=cifar10_facts.DEPTH,
                                  dct_method="INTEGER_ACCURATE"),
        lambda: tf.io.decode_png(contents, channels=cifar10_facts.DEPTH))
    size = tf.shape(image)[:2]
    is_cifar_size = tf.reduce_all(tf.equal(size, [cifar10_facts.HEIGHT, cifar10_facts.WIDTH]))
    pixels = tf.cond(
        is_cifar_size,
        lambda: tf.reshape(tf.transpose(image, [2, 0, 1]), [tfrecord_format.IMAGE_NUM_BYTES]),
        lambda: tf.zeros([tfrecord_format.IMAGE_NUM_BYTES], tf.uint8))
    return pixels, size


def _tensorflow_reason(error):
    """TensorFlow's error message without its graph-node and op decorations."""
    message = re.sub(r"\{\{[^}]*\}\}\s*", "", error.message)
    return message.split(" [Op:")[0].split("\n")[0].strip()


def _file_error(paths):
    """The error naming the first of paths TensorFlow cannot read or decode."""
    import tensorflow as tf  # lazy: keeps generate_tfrecords' --help and flag errors fast

    for path in paths:
        try:
            _decode_file(tf.constant(path))
        except tf.errors.InvalidArgumentError:
            # TensorFlow's reason is about its decoders ("One of JPEG, PNG, GIF, BMP required").
            return Cifar10EstimatorError(
                "cannot decode %s: not a complete, valid PNG or JPEG image" % os.fsdecode(path))
        except tf.errors.OpError as error:
            return Cifar10EstimatorError("cannot read %s: %s"
                                         % (os.fsdecode(path), _tensorflow_reason(error)))
    return Cifar10EstimatorError("cannot read or decode one of %s ... %s"
                                 % (os.fsdecode(paths[0]), os.fsdecode(paths[-1])))


def _check_sizes(paths, sizes):
    """Raises naming the first of paths whose [height, width] in sizes is not 32x32."""
    wrong = np.flatnonzero((sizes != [cifar10_facts.HEIGHT, cifar10_facts.WIDTH]).any(axis=1))
    if len(wrong):
        height, width = sizes[wrong[0]]
        raise Cifar10EstimatorError(
            "%s is %dx%d pixels (width x height); CIFAR-10 images are %dx%d, resize it first"
            % (os.fsdecode(paths[wrong[0]]), width, height,
               cifar10_facts.WIDTH, cifar10_facts.HEIGHT))


def decoded_batches(paths, labels, subset, messages):
    """Decode images in the given order, in parallel, as batches ready to write as TFRecords.

    Args:
      paths: array of image paths (bytes or str).
      labels: int array, one label per path.
      subset: what the images are, for progress lines ('train', ...).
      messages: text stream for a progress line every PROGRESS_EVERY_IMAGES images.

    Yields:
      (images uint8 [n, 3072] in CIFAR's channel-major order, labels [n]), in order.

    Raises:
      Cifar10EstimatorError: naming a file that cannot be read or decoded, or is not 32x32.
    """
    import tensorflow as tf  # lazy: keeps generate_tfrecords' --help and flag errors fast

    batches = tf.data.Dataset.from_tensor_slices([os.fsencode(path) for path in paths]).map(
        _decode_file, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    ).batch(_DECODE_BATCH_SIZE).prefetch(1)
    done = 0
    try:
        for pixels, sizes in batches.as_numpy_iterator():
            count = len(pixels)
            _check_sizes(paths[done:done + count], sizes)
            yield pixels, labels[done:done + count]
            if (done + count) // PROGRESS_EVERY_IMAGES > done // PROGRESS_EVERY_IMAGES:
                print("decoded %d/%d %s images" % (done + count, len(paths), subset),
                      file=messages, flush=True)
            done += count
    except tf.errors.OpError:
        # The pipeline fails the whole batch; decoding its files one by one names the culprit.
        raise _file_error(paths[done:done + _DECODE_BATCH_SIZE])
